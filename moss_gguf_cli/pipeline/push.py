"""`moss-gguf push`: a finished output folder to a Hub repo, in one commit.

The folder is checked first, with no token and no network: manifest.json's every file is
there with the sha256 it lists, and nothing else is in the folder but the manifest and the
model card (pipeline/card.py). Then huggingface_hub does the work: create_repo(exist_ok), the
repo's tree at the revision (a file the Hub already holds with the same sha256, or for a small
file the same git blob id, is not sent again), and one create_commit of the rest, whose LFS
uploads go through whatever transfer the endpoint offers. A push that fails leaves no commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..disk.digests import sha256_file
from ..disk.layout_names import MANIFEST_NAME
from ..errors import InputError, OutputError, UsageError
from ..progress import ProgressReporter, ensure
from ..source.hub import git_blob_id, is_repo_id
from .card import CARD_NAME


@dataclass
class PushFile:
    path: str  # in the folder and in the repo
    size: int
    sha256: str | None  # the manifest's; None for manifest.json and the card


@dataclass
class PushPlan:
    folder: Path
    repo_id: str
    files: list[PushFile]


@dataclass
class PushResult:
    repo_id: str
    sent: list[str]  # paths in the commit
    kept: list[str]  # paths the Hub already held with the same content
    commit_url: str | None = None  # None: nothing to send, no commit
    pr_url: str | None = None
    notes: list[str] = field(default_factory=list)


def plan_push(folder: Path, repo_id: str, progress: ProgressReporter | None = None) -> PushPlan:
    """FOLDER checked against its manifest (every file's sha256 recomputed); what goes up."""
    bar = ensure(progress)
    folder = Path(folder)
    if not is_repo_id(repo_id):
        raise UsageError(f"{repo_id!r} is not a Hub repo id", hint="give it as OWNER/NAME")
    manifest = _read_manifest(folder)
    listed = _listed(folder, manifest)
    bar.start("push-check", "sha256", sum(f.size for f in listed), "B")
    for f in listed:
        path = folder / f.path
        if not path.is_file():
            raise InputError(f"{f.path} is missing: the folder is partial", path=folder,
                             hint="rerun the moss-gguf all that made it")  # fmt: skip
        if path.stat().st_size != f.size or sha256_file(path) != f.sha256:
            raise InputError(f"{f.path} differs from {MANIFEST_NAME}'s size and sha256",
                             path=folder, hint="rerun the moss-gguf all that made it, "
                             "or moss-gguf verify to see what changed")  # fmt: skip
        bar.advance("push-check", f.size)
    bar.finish("push-check")
    known = {f.path for f in listed} | {MANIFEST_NAME, CARD_NAME}
    stray = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                   if p.is_file() and p.relative_to(folder).as_posix() not in known)  # fmt: skip
    if stray:
        raise InputError(f"{stray[0]} is not in {MANIFEST_NAME} ({len(stray)} such files)",
                         path=folder, hint="remove it, or rerun the moss-gguf all that made "
                         "the folder")  # fmt: skip
    extra = [PushFile(MANIFEST_NAME, (folder / MANIFEST_NAME).stat().st_size, None)]
    if (folder / CARD_NAME).is_file():
        extra.append(PushFile(CARD_NAME, (folder / CARD_NAME).stat().st_size, None))
    return PushPlan(folder, repo_id, listed + extra)


def _read_manifest(folder: Path) -> dict:
    import json

    path = folder / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
    except FileNotFoundError:
        raise InputError(f"no {MANIFEST_NAME}: not a moss-gguf output folder", path=folder,
                         hint="push the folder `moss-gguf all --output` wrote") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{MANIFEST_NAME} is unreadable ({exc})", path=path) from None
    if not isinstance(files, list) or not files:
        raise InputError(f"{MANIFEST_NAME} lists no files", path=path)
    return manifest


def _listed(folder: Path, manifest: dict) -> list[PushFile]:
    out = []
    for entry in manifest["files"]:
        try:
            rel, size, sha = str(entry["path"]), int(entry["size"]), str(entry["sha256"]).lower()
        except (KeyError, TypeError, ValueError):
            where = folder / MANIFEST_NAME
            raise InputError(f"malformed entry {entry!r:.80}", path=where) from None
        inside = (folder / rel).resolve().is_relative_to(folder.resolve())
        if rel.startswith("/") or ".." in Path(rel).parts or not inside:
            raise InputError(f"{rel}: a path outside the folder", path=folder / MANIFEST_NAME)
        out.append(PushFile(rel, size, sha))
    return out


# --------------------------------------------------------------------------- the upload


def hub_token() -> str:
    """HF_TOKEN, else the token `hf auth login` saved; never shown."""
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise UsageError("no Hugging Face token",
                         hint="set HF_TOKEN or run `hf auth login`, then push again")  # fmt: skip
    return token


def push(
    plan: PushPlan,
    *,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    progress: ProgressReporter | None = None,
) -> PushResult:
    """PLAN's files to the Hub in one commit (none when the Hub holds them all already)."""
    from huggingface_hub import CommitOperationAdd, HfApi

    bar = ensure(progress)
    api = HfApi(token=hub_token())
    try:
        api.create_repo(plan.repo_id, private=private, exist_ok=True, repo_type="model")
        if revision and revision != "main" and not create_pr:
            api.create_branch(plan.repo_id, branch=revision, exist_ok=True)
        remote = _remote_files(api, plan.repo_id, revision)
        send = [f for f in plan.files if not _same(plan.folder / f.path, f, remote.get(f.path))]
        kept = [f.path for f in plan.files if f not in send]
        if not send:
            return PushResult(plan.repo_id, [], kept)
        bar.start("push", f"upload to {plan.repo_id}", len(send), "files")
        ops = [CommitOperationAdd(f.path, str(plan.folder / f.path)) for f in send]
        info = api.create_commit(
            plan.repo_id, ops, commit_message=f"moss-gguf push: {len(send)} files",
            revision=revision, create_pr=create_pr,
        )  # fmt: skip
        bar.advance("push", len(send))
        bar.finish("push")
    except Exception as exc:  # the Hub's and the network's errors, each as one line
        mapped = _hub_error(exc, plan.repo_id)
        if mapped is None:
            raise  # not the Hub's nor the network's: a bug, shown as one
        raise mapped from exc
    return PushResult(plan.repo_id, [f.path for f in send], kept, info.commit_url, info.pr_url)


def _remote_files(api, repo_id: str, revision: str | None) -> dict[str, object]:
    """The repo's files at REVISION by path (empty for a new repo or branch)."""
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import EntryNotFoundError, RevisionNotFoundError

    try:
        tree = api.list_repo_tree(repo_id, revision=revision, recursive=True)
        return {e.path: e for e in tree if isinstance(e, RepoFile)}
    except (RevisionNotFoundError, EntryNotFoundError):
        return {}


def _same(local: Path, f: PushFile, remote) -> bool:
    """The Hub holds this very content: LFS by sha256, a small file by its git blob id."""
    if remote is None or remote.size != local.stat().st_size:
        return False
    if remote.lfs is not None:
        return (f.sha256 or sha256_file(local)) == remote.lfs.sha256
    return git_blob_id(local) == remote.blob_id


def _hub_error(exc: Exception, repo_id: str) -> Exception | None:
    """One line for each way a push fails; nothing was committed. None: not a Hub error."""
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    if isinstance(exc, (UsageError, InputError)):
        return exc
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, RepositoryNotFoundError) or status in (401, 403):
        return OutputError(f"cannot write to {repo_id} on the Hub (HTTP {status}); nothing "
                           "was committed", hint="check the token's write access to that "
                           "repo or namespace (`hf auth whoami`)")  # fmt: skip
    if isinstance(exc, HfHubHTTPError):
        return OutputError(f"the Hub refused the push to {repo_id} (HTTP {status}): "
                           f"{str(exc).splitlines()[0]}; nothing was committed")  # fmt: skip
    from huggingface_hub import constants

    # the client's HTTP library (httpx, httpx2 from huggingface_hub 2.x) says a request that
    # got no answer with a RequestError; matched by name so that either library is known
    transport = any(c.__name__ == "RequestError" for c in type(exc).__mro__)
    if not transport and not isinstance(exc, OSError):
        return None
    return OutputError(f"cannot reach the Hub at {constants.ENDPOINT} "
                       f"({type(exc).__name__}); nothing was committed",
                       hint="check the network, then push again")  # fmt: skip
