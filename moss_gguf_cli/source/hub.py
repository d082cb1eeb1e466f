"""The Hugging Face Hub: list a repository, download part of it, check what arrived.

Everything goes through ``huggingface_hub``: ``snapshot_download`` (its cache, its
``HF_HUB_OFFLINE`` handling, a second run downloads nothing), ``list_repo_tree`` for the file
list with each file's LFS sha256 and, offline, what the hub client recorded when it downloaded.

A user can hold a download in four ways, and each is checked against its own record (`Listing`):
- online: the Hub's listing (``list_repo_tree``): sha256 of every LFS file, git blob id of the rest;
- a cache with the client's tree listing (``trees/<commit>.json``, read through
  ``get_cached_repo_tree``): every file's git blob id, which for an LFS file is the id of its
  *pointer* (the text ``version … oid sha256:… size …``), a pure function of sha256 and size;
- an older cache without that listing: each blob's file name (an LFS blob is named by its
  sha256, a small one by its git blob id);
- a ``--local-dir`` download: its ``.cache/huggingface/download/*.metadata`` (the etag: sha256
  for LFS files, git blob id for small ones).
A folder with none of these is used as it is, and says so ("not checked: no hub record").
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from ..progress import ProgressReporter, ensure

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_CHUNK = 8 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
LOCAL_DIR_METADATA = Path(".cache") / "huggingface" / "download"

# what a listing's hashes were recorded by (manifest.json and verify name it)
HUB_LISTING = "the Hub's file listing"
TREE_LISTING = "the hub client's tree listing"
BLOB_NAMES = "the Hub cache's blob names"
LOCAL_DIR = "the --local-dir download metadata"
NO_RECORD = "not checked: no hub record"


def is_repo_id(text: str) -> bool:
    return bool(REPO_ID.match(text)) and not text.startswith((".", "/", "~"))


@dataclass(frozen=True)
class HubFile:
    """One file of a repo at a commit, as a record holds it."""

    path: str
    size: int | None  # None where the record does not say (blob names, local-dir metadata)
    blob_id: str | None  # git blob sha1; for an LFS file, of its pointer
    sha256: str | None  # LFS files, where the record has it


@dataclass
class Listing:
    """The files of a repo (or a local download of one) and the record they are checked by."""

    files: dict[str, HubFile]
    record: str  # one of HUB_LISTING, TREE_LISTING, BLOB_NAMES, LOCAL_DIR
    repo_id: str | None = None  # None for a --local-dir folder (its metadata does not say)
    commit: str | None = None
    snapshot: Path | None = None  # the folder the files are in, where already known
    checked: dict[str, str] = field(default_factory=dict)  # path → sha256, as checked

    def describe(self) -> str:
        """What the files were checked against, for the manifest and verify."""
        at = f" at {self.commit[:12]}" if self.commit else ""
        of = f" of {self.repo_id}" if self.repo_id else ""
        return f"sha256 of {len(self.checked)} files against {self.record}{of}{at}"


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


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


def not_cached(repo_id: str) -> InputError:
    return InputError(
        f"{repo_id} is not in the local Hub cache and downloading is off or failed",
        hint="connect to the network, unset HF_HUB_OFFLINE, or pass --cache-dir pointing "
        "at a cache that holds it",
    )


def _online_listing(repo_id: str, revision: str | None) -> Listing | None:
    """The Hub's own listing; None when the network is off or unreachable."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if _offline():
        return None
    try:
        entries = list(HfApi().list_repo_tree(repo_id, revision=revision, recursive=True))
    except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise _repo_error(exc, repo_id, revision) from exc
    except (OfflineModeIsEnabled, OSError, ConnectionError):
        return None
    except Exception as exc:  # noqa: BLE001 - httpx errors of any kind: fall back
        if "connect" not in type(exc).__name__.lower() and "timeout" not in str(exc).lower():
            raise
        return None
    files = {}
    for e in entries:
        if not hasattr(e, "blob_id"):  # a folder
            continue
        lfs = getattr(e, "lfs", None)
        sha = getattr(lfs, "sha256", None) if lfs is not None else None
        files[e.path] = HubFile(e.path, int(e.size), e.blob_id, sha)
    return Listing(files, HUB_LISTING, repo_id, revision)


def cache_folder(repo_id: str, cache_dir: Path | None) -> Path:
    """Where the hub client keeps REPO_ID's blobs, refs and snapshots."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    root = Path(cache_dir) if cache_dir else Path(constants.HF_HUB_CACHE)
    return root.expanduser() / repo_folder_name(repo_id=repo_id, repo_type="model")


def cached_commit(repo_id: str, revision: str | None, cache_dir: Path | None) -> str | None:
    """The commit REVISION names in the cache (a commit id stands for itself); None if unknown."""
    if revision and _SHA1.match(revision):
        return revision
    ref = cache_folder(repo_id, cache_dir) / "refs" / (revision or "main")
    try:
        commit = ref.read_text().strip()
    except OSError:
        return None
    return commit if _SHA1.match(commit) else None


def _tree_listing(repo_id: str, commit: str, cache_dir: Path | None) -> Listing | None:
    """The listing the hub client wrote beside the cache (`trees/<commit>.json`), if any."""
    from huggingface_hub import get_cached_repo_tree

    try:
        entries = get_cached_repo_tree(
            repo_id, revision=commit, cache_dir=str(cache_dir) if cache_dir else None
        )
    except Exception:  # noqa: BLE001 - CachedRepoTreeNotFoundError and friends: no listing
        return None
    files = {}
    for e in entries:
        lfs = getattr(e, "lfs", None)  # not recorded today; used should a client record it
        sha = getattr(lfs, "sha256", None) if lfs is not None else None
        files[e.path] = HubFile(e.path, int(e.size), e.blob_id, sha)
    return Listing(files, TREE_LISTING, repo_id, commit)


def _blob_listing(repo_id: str, snapshot: Path, commit: str) -> Listing | None:
    """An older cache's snapshot: its links' blob names are the hashes (no listing written)."""
    if not snapshot.is_dir():
        return None
    files = {}
    for link in sorted(snapshot.rglob("*")):
        if not link.is_symlink() or link.is_dir():
            continue
        rel = link.relative_to(snapshot).as_posix()
        name = Path(link.readlink()).name
        if _SHA256.match(name):
            files[rel] = HubFile(rel, None, None, name)
        elif _SHA1.match(name):
            files[rel] = HubFile(rel, None, name, None)
    return Listing(files, BLOB_NAMES, repo_id, commit, snapshot) if files else None


def list_files(
    repo_id: str, revision: str | None = None, cache_dir: Path | None = None
) -> Listing | None:
    """Every file of the repo with the record to check it by: the Hub's listing, else (offline)
    what the cache recorded. None when offline and the cache knows nothing of the repo."""
    listing = _online_listing(repo_id, revision)
    if listing is not None:
        return listing
    commit = cached_commit(repo_id, revision, cache_dir)
    if commit is None:
        return None
    snapshot = cache_folder(repo_id, cache_dir) / "snapshots" / commit
    return _tree_listing(repo_id, commit, cache_dir) or _blob_listing(repo_id, snapshot, commit)


def local_dir_listing(folder: Path) -> Listing | None:
    """A `--local-dir` download's own record: one metadata file per file (commit, etag)."""
    meta_root = folder / LOCAL_DIR_METADATA
    if not meta_root.is_dir():
        return None
    files: dict[str, HubFile] = {}
    commits = set()
    for meta in sorted(meta_root.rglob("*.metadata")):
        rel = meta.relative_to(meta_root).as_posix()[: -len(".metadata")]
        try:
            commit, etag = meta.read_text().splitlines()[:2]
        except (OSError, ValueError):
            continue  # a metadata file the client would also ignore
        etag = etag.strip().strip('"')
        commits.add(commit.strip())
        if _SHA256.match(etag):
            files[rel] = HubFile(rel, None, None, etag)
        elif _SHA1.match(etag):
            files[rel] = HubFile(rel, None, etag, None)
    if not files:
        return None
    commit = commits.pop() if len(commits) == 1 else None
    return Listing(files, LOCAL_DIR, None, commit, folder)


def local_listing(folder: Path) -> Listing | None:
    """The record a local folder carries: a --local-dir download's metadata, or, for a folder
    that is a snapshot of a Hub cache, the cache's listing (or blob names); None: no record."""
    listing = local_dir_listing(folder)
    if listing is not None:
        return listing
    folder = Path(folder).resolve()
    repo = folder.parent.parent
    if folder.parent.name != "snapshots" or not repo.name.startswith("models--"):
        return None
    repo_id = repo.name[len("models--") :].replace("--", "/")
    listing = _tree_listing(repo_id, folder.name, repo.parent)
    if listing is not None:
        listing.snapshot = folder
        return listing
    return _blob_listing(repo_id, folder, folder.name)


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
        raise not_cached(repo_id) from exc
    return Path(local)


def locate(repo_id: str, revision: str | None, cache_dir: Path | None) -> None:
    """Fail now, naming the repo, when it cannot be had: offline and not in the cache."""
    if _offline() and cached_commit(repo_id, revision, cache_dir) is None:
        raise not_cached(repo_id)


# ----------------------------------------------------------------------------- hashes


@dataclass(frozen=True)
class Hashes:
    """What one read of a file gives: its sha256 and its git blob id, and its size."""

    sha256: str
    blob_id: str
    size: int

    @property
    def pointer_blob_id(self) -> str:
        """The git blob id of the file's LFS pointer: what git (and the Hub) lists for it."""
        pointer = (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\n"
            f"size {self.size}\n"
        ).encode()
        return hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()


def hash_file(path: Path) -> Hashes:
    """sha256 and git blob id of a file in one read."""
    size = path.stat().st_size
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            sha256.update(chunk)
            sha1.update(chunk)
    return Hashes(sha256.hexdigest(), sha1.hexdigest(), size)


def git_blob_id(path: Path) -> str:
    """The git blob sha1 of a file (what the Hub lists for files stored without LFS)."""
    return hash_file(path).blob_id


def mismatch(entry: HubFile, got: Hashes) -> str | None:
    """None when the file is what the record says; else what was expected and found.

    An LFS file is checked by its sha256 (the record's, or the one its pointer id implies);
    a small file by its git blob id. A content hash is never held against a pointer's id.
    """
    if entry.size is not None and entry.size != got.size:
        return f"size {got.size} where the record says {entry.size}"
    if entry.sha256 is not None:
        ok = got.sha256 == entry.sha256
        want = entry.sha256[:12]
        return None if ok else f"sha256 {got.sha256[:12]}… where the record says {want}…"
    if entry.blob_id is None or entry.blob_id in (got.blob_id, got.pointer_blob_id):
        return None  # a small file's own id, or an LFS file's pointer id
    return (
        f"sha256 {got.sha256[:12]}… (LFS pointer id {got.pointer_blob_id[:12]}…, git blob id "
        f"{got.blob_id[:12]}…) where the record says blob {entry.blob_id[:12]}…"
    )


def redownload_command(listing: Listing, rel: str) -> str:
    """The one command that fetches REL again, and nothing else."""
    if listing.record == LOCAL_DIR:
        return f"hf download REPO_ID {rel} --local-dir {listing.snapshot} --force-download"
    rev = f" --revision {listing.commit}" if listing.commit else ""
    return f"hf download {listing.repo_id} {rel}{rev} --force-download"


def check_files(
    listing: Listing,
    root: Path,
    rels: list[str],
    progress: ProgressReporter | None = None,
) -> dict[str, str]:
    """Every rel's bytes against the listing's record; rel → sha256 (also kept in
    ``listing.checked``). Raises on the first file that differs, naming it."""
    bar = ensure(progress)
    sizes = {rel: (root / rel).stat().st_size if (root / rel).is_file() else 0 for rel in rels}
    bar.start("hub-check", "sha256", sum(sizes.values()), "B")
    try:
        for rel in rels:
            path = root / rel
            entry = listing.files.get(rel)
            if not path.is_file():
                raise InputError(f"{rel} was not downloaded", path=path)
            if entry is None:
                raise InputError(
                    f"{rel} is not in {listing.record}",
                    path=path,
                    hint=f"re-download it: `{redownload_command(listing, rel)}`",
                )
            got = hash_file(path)
            wrong = mismatch(entry, got)
            if wrong is not None:
                raise InputError(
                    f"{rel} is damaged: {wrong} ({listing.record})",
                    path=path,
                    hint=f"re-download only this file: `{redownload_command(listing, rel)}`",
                )
            listing.checked[rel] = got.sha256
            bar.advance("hub-check", sizes[rel])
    finally:
        bar.finish("hub-check")
    return dict(listing.checked)


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
