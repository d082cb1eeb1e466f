"""The Hugging Face Hub: list a repository, download part of it, check what arrived.

Everything goes through ``huggingface_hub``: ``snapshot_download`` (its cache, its
``HF_HUB_OFFLINE`` handling, a second run downloads nothing), ``list_repo_tree`` for the file
list with each file's LFS sha256, and, offline, ``get_cached_repo_tree``: the same listing as
the hub client recorded it when it downloaded. ``check_files`` compares every downloaded file
with that listing: sha256 for LFS files, the git blob id for small ones.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..progress import ProgressReporter, ensure

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_CHUNK = 8 << 20


def is_repo_id(text: str) -> bool:
    return bool(REPO_ID.match(text)) and not text.startswith((".", "/", "~"))


@dataclass(frozen=True)
class HubFile:
    """One file of a repo at a commit, as the Hub lists it."""

    path: str
    size: int
    blob_id: str  # git blob sha1
    sha256: str | None  # LFS files only


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _cached_listing(repo_id: str, revision: str | None, cache_dir: Path | None) -> list:
    from huggingface_hub import get_cached_repo_tree

    try:
        return list(
            get_cached_repo_tree(
                repo_id, revision=revision, cache_dir=str(cache_dir) if cache_dir else None
            )
        )
    except Exception as exc:  # CachedRepoTreeNotFoundError and friends
        raise InputError(
            f"{repo_id} is not in the local Hub cache and downloading is off or failed",
            hint="connect to the network, unset HF_HUB_OFFLINE, or pass --cache-dir pointing "
            "at a cache that holds it",
        ) from exc


def _repo_error(exc: Exception, repo_id: str, revision: str | None) -> InputError:
    """The one-line error for a gated, missing or revision-less repo."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    # GatedRepoError subclasses RepositoryNotFoundError: it is tested first
    if isinstance(exc, GatedRepoError):
        return InputError(
            f"{repo_id} is gated",
            hint="accept its licence on the Hub and log in with `hf auth login`",
        )
    if isinstance(exc, RepositoryNotFoundError) and "Revision" not in type(exc).__name__:
        return InputError(
            f"Hub repository {repo_id} not found",
            hint="check the repo id, or log in if it is private",
        )
    return InputError(f"revision {revision!r} not found in {repo_id}")


def list_files(
    repo_id: str, revision: str | None = None, cache_dir: Path | None = None
) -> dict[str, HubFile] | None:
    """path → HubFile of every file in the repo: from the Hub, else (offline) from the cache.

    None when offline and the hub client recorded no listing for the repo.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    entries = None
    if not _offline():
        try:
            entries = list(HfApi().list_repo_tree(repo_id, revision=revision, recursive=True))
        except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError) as exc:
            raise _repo_error(exc, repo_id, revision) from exc
        except (OfflineModeIsEnabled, OSError, ConnectionError):
            entries = None  # no network: what the cache knows
        except Exception as exc:  # noqa: BLE001 - httpx errors of any kind: fall back
            if "connect" not in type(exc).__name__.lower() and "timeout" not in str(exc).lower():
                raise
            entries = None
    if entries is None:
        try:
            entries = _cached_listing(repo_id, revision, cache_dir)
        except InputError:
            return None
    out: dict[str, HubFile] = {}
    for e in entries:
        if not hasattr(e, "blob_id"):  # a folder
            continue
        lfs = getattr(e, "lfs", None)
        sha = getattr(lfs, "sha256", None) if lfs is not None else None
        out[e.path] = HubFile(e.path, int(e.size), e.blob_id, sha)
    return out


def download(
    repo_id: str,
    patterns: list[str],
    revision: str | None = None,
    cache_dir: Path | None = None,
    progress: ProgressReporter | None = None,
) -> Path:
    """snapshot_download of the files matching patterns; the snapshot folder."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        local = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=str(cache_dir) if cache_dir else None,
            allow_patterns=patterns,
            tqdm_class=_tqdm_for(ensure(progress)),
        )
    except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise _repo_error(exc, repo_id, revision) from exc
    except LocalEntryNotFoundError as exc:  # IncompleteSnapshotError is one too
        raise InputError(
            f"{repo_id} is not in the local Hub cache and downloading is off or failed",
            hint="connect to the network, unset HF_HUB_OFFLINE, or pass "
            "--cache-dir pointing at a cache that holds it",
        ) from exc
    return Path(local)


def git_blob_id(path: Path) -> str:
    """The git blob sha1 of a file (what the Hub lists for files stored without LFS)."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    _feed(h, path)
    return h.hexdigest()


def _feed(h, path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    _feed(h, path)
    return h.hexdigest()


def check_files(
    repo_id: str,
    snapshot: Path,
    listing: dict[str, HubFile],
    rels: list[str],
    progress: ProgressReporter | None = None,
) -> dict[str, str]:
    """Every rel's bytes against the listing; rel → sha256. Raises on the first mismatch."""
    bar = ensure(progress)
    sizes = {rel: listing[rel].size for rel in rels}
    bar.start("hub-check", "sha256", sum(sizes.values()), "B")
    digests: dict[str, str] = {}
    try:
        for rel in rels:
            entry, path = listing[rel], snapshot / rel
            if not path.is_file():
                raise InputError(f"{rel} was not downloaded", path=path)
            if entry.sha256 is not None:
                got = file_sha256(path)
                ok = got == entry.sha256
                digests[rel] = got
            else:
                ok = git_blob_id(path) == entry.blob_id
                digests[rel] = file_sha256(path)
            if not ok or path.stat().st_size != entry.size:
                raise InputError(
                    f"{rel} does not match the sha256 {repo_id} lists for it",
                    path=path,
                    hint="the download is corrupt or was changed: delete it from the Hub "
                    "cache (`hf cache rm`) and run again",
                )
            bar.advance("hub-check", sizes[rel])
    finally:
        bar.finish("hub-check")
    return digests


def _tqdm_for(progress: ProgressReporter):
    """A tqdm class that forwards the hub client's byte counts to our progress protocol."""
    from tqdm.auto import tqdm

    class _Forward(tqdm):  # type: ignore[misc]
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self._key = f"hub-{id(self)}"
            progress.start(
                self._key,
                kwargs.get("desc") or "download",
                kwargs.get("total"),
                kwargs.get("unit", ""),
            )

        def update(self, n=1):
            progress.advance(self._key, n or 0)

        def close(self):
            progress.finish(self._key)
            super().close()

    return _Forward
