"""`moss-gguf push` and `all --push-to-hub` against a local stand-in of the Hub's endpoints
(tests/hub_standin.py, loopback, basic LFS): one commit whose files and LFS sha256s are the
folder's, nothing sent twice, a changed or partial folder refused by name before any request,
and one line for a missing token, a repo the token cannot write and an unreachable Hub."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hub_standin import TOKEN, Repo, StandIn, git_blob_id
from huggingface_hub import ModelCard
from test_hub_weights import add_repo, assert_speaks, run

REPO = "me/moss-tts-tiny-gguf"


def moss(*args: str, endpoint: str, home: Path, token: str | None = TOKEN):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(home), HF_HUB_DISABLE_XET="1", COLUMNS="200")
    if token is not None:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "moss_gguf_cli", *args], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def folder(builds) -> Path:
    """builtin:tiny through `all` (the run's shared build): a finished folder with its card."""
    return builds.all("--model", "builtin:tiny").path


@pytest.fixture
def hub():
    with StandIn(lifetime=300) as standin:
        yield standin


def folder_files(folder: Path) -> dict[str, bytes]:
    manifest = json.loads((folder / "manifest.json").read_text())
    paths = [f["path"] for f in manifest["files"]] + ["manifest.json", "README.md"]
    return {p: (folder / p).read_bytes() for p in paths}


def assert_repo_holds(standin: StandIn, repo: str, rev: str, folder: Path) -> None:
    """The repo's tree at REV is the folder: each path, each LFS sha256, each small blob."""
    tree = standin.hub.tree(repo, rev)
    want = folder_files(folder)
    assert sorted(tree) == sorted(want)
    listed = {f["path"]: f["sha256"] for f in json.loads(want["manifest.json"])["files"]}
    for path, data in want.items():
        entry = tree[path]
        assert entry["size"] == len(data), path
        if "lfs" in entry:
            assert entry["lfs"]["oid"] == hashlib.sha256(data).hexdigest() == listed[path]
            assert standin.hub.lfs[entry["lfs"]["oid"]] == data
        else:
            assert entry["oid"] == git_blob_id(data), path
    assert any("lfs" in e for e in tree.values()) and any("lfs" not in e for e in tree.values())


def test_push_is_one_commit_of_the_folder_and_a_second_push_sends_nothing(
    folder: Path, hub: StandIn, tmp_path: Path
) -> None:
    done = moss("push", str(folder), REPO, endpoint=hub.url, home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert TOKEN not in done.stdout + done.stderr
    repo = hub.hub.repos[REPO]
    assert len(repo.commits) == 1 and not repo.private
    assert_repo_holds(hub, REPO, "main", folder)
    lfs = {e["lfs"]["oid"] for e in hub.hub.tree(REPO, "main").values() if "lfs" in e}
    assert sorted(hub.hub.uploads) == sorted(lfs)  # each LFS object sent once
    assert "in one commit" in done.stdout
    hub.hub.requests.clear()
    again = moss("push", str(folder), REPO, endpoint=hub.url, home=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "nothing sent, no commit" in again.stdout
    assert len(repo.commits) == 1 and sorted(hub.hub.uploads) == sorted(lfs)
    assert not [r for r in hub.hub.requests if "/commit/" in r or "lfs" in r]


def test_only_what_changed_is_sent(folder: Path, hub: StandIn, tmp_path: Path) -> None:
    assert moss("push", str(folder), REPO, endpoint=hub.url, home=tmp_path).returncode == 0
    uploads = list(hub.hub.uploads)
    edited = tmp_path / "w"
    shutil.copytree(folder, edited)
    (edited / "README.md").write_text((edited / "README.md").read_text() + "\nMore words.\n")
    done = moss("push", str(edited), REPO, endpoint=hub.url, home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert hub.hub.repos[REPO].commits[-1]["paths"] == ["README.md"]
    assert hub.hub.uploads == uploads  # no LFS object sent again
    assert_repo_holds(hub, REPO, "main", edited)


def test_private_a_branch_and_a_pull_request(folder: Path, hub: StandIn, tmp_path: Path) -> None:
    done = moss("push", str(folder), REPO, "--private", "--revision", "v1", endpoint=hub.url,
                home=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    repo = hub.hub.repos[REPO]
    assert repo.private and repo.branches["main"] == {}
    assert_repo_holds(hub, REPO, "v1", folder)
    pr = moss("push", str(folder), "me/other-gguf", "--create-pr", endpoint=hub.url,
              home=tmp_path)  # fmt: skip
    assert pr.returncode == 0, pr.stderr
    assert "pull request:" in pr.stdout
    assert hub.hub.repos["me/other-gguf"].commits[0]["revision"] == "refs/pr/1"
    assert_repo_holds(hub, "me/other-gguf", "refs/pr/1", folder)


def test_dry_run_lists_every_file_with_no_token_and_no_network(
    folder: Path, tmp_path: Path
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    done = moss("push", str(folder), REPO, "--dry-run", endpoint=closed, home=tmp_path,
                token=None)  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = [line.split("\t")[0] for line in done.stdout.splitlines() if "\t" in line]
    assert sorted(shown) == sorted(folder_files(folder))
    assert f"{len(shown)} files would go to {REPO}" in done.stdout


@pytest.mark.parametrize("damage", ["changed", "missing", "stray"])
def test_a_folder_that_differs_is_refused_by_name_before_any_request(
    damage: str, folder: Path, hub: StandIn, tmp_path: Path
) -> None:
    bad = tmp_path / "w"
    shutil.copytree(folder, bad)
    victim = "lm_heads/lm_head_audio_03.npy"
    if damage == "changed":
        data = bytearray((bad / victim).read_bytes())
        data[-1] ^= 1
        (bad / victim).write_bytes(bytes(data))
    elif damage == "missing":
        (bad / victim).unlink()
    else:
        victim = "notes.txt"
        (bad / victim).write_text("mine")
    done = moss("push", str(bad), REPO, endpoint=hub.url, home=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and victim in lines[0], done.stderr
    assert hub.hub.requests == []


def test_missing_token_unwritable_repo_and_unreachable_hub_are_one_line_each(
    folder: Path, hub: StandIn, tmp_path: Path
) -> None:
    hub.hub.repos["other/their-gguf"] = Repo("other", False)
    cases = {
        "no Hugging Face token": moss("push", str(folder), REPO, endpoint=hub.url,
                                      home=tmp_path, token=None),
        "cannot write to other/their-gguf": moss("push", str(folder), "other/their-gguf",
                                                 endpoint=hub.url, home=tmp_path),
        f"cannot write to {REPO}": moss("push", str(folder), REPO, endpoint=hub.url,
                                        home=tmp_path, token="hf_wrong"),
    }  # fmt: skip
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    cases["cannot reach the Hub"] = moss("push", str(folder), REPO, endpoint=closed,
                                         home=tmp_path)  # fmt: skip
    for words, done in cases.items():
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(lines) == 1 and words in lines[0], done.stderr
        assert "Traceback" not in done.stderr and TOKEN not in done.stderr + done.stdout
    assert all(not r.commits for r in hub.hub.repos.values()) and hub.hub.uploads == []


def test_all_push_to_hub(hub: StandIn, tmp_path: Path) -> None:
    out = tmp_path / "w"
    done = moss("all", "--model", "builtin:tiny", "--output", str(out), "-q",
                "--push-to-hub", REPO, endpoint=hub.url, home=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_repo_holds(hub, REPO, "main", out)
    both = moss("all", "--model", "builtin:tiny", "--output", str(tmp_path / "b"), "--format",
                "backend", "--format", "moss-tts-delay", "--push-to-hub", REPO,
                endpoint=hub.url, home=tmp_path)  # fmt: skip
    assert both.returncode == 2 and "one folder" in both.stderr
    assert not (tmp_path / "b").exists()


# ----------------------------------------------------------------------------- the round trip


def cache_of(standin: StandIn, repo: str, into: Path) -> dict[str, Path]:
    """The repo's files as the stand-in holds them (repo path → a local copy)."""
    files = {}
    for path, entry in standin.hub.tree(repo, "main").items():
        files[path] = into / path
        files[path].parent.mkdir(parents=True, exist_ok=True)
        files[path].write_bytes(standin.hub.content(entry))
    return files


def test_a_pushed_repo_reads_back_as_pre_converted_checked_by_its_manifest_and_speaks(
    folder: Path, hub: StandIn, tmp_path: Path
) -> None:
    assert moss("push", str(folder), REPO, endpoint=hub.url, home=tmp_path).returncode == 0
    cache = tmp_path / "hub-cache"
    add_repo(cache, REPO, cache_of(hub, REPO, tmp_path / "pulled"))  # as huggingface_hub lays it
    out = tmp_path / "back"
    done = run("all", "--model", REPO, "--output", str(out), cache=cache)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["checks"]["source"].endswith("the repo's manifest.json")
    pushed = {f["path"]: f["sha256"] for f in json.loads((folder / "manifest.json").read_text())
              ["files"]}  # fmt: skip
    got = {f["path"]: f["sha256"] for f in manifest["files"]}
    # the folder's own files, byte for byte; the synth config and the meta are written anew
    shared = [p for p in got if p in pushed and p not in ("moss-tts.yaml", "extraction_meta.json")]
    assert len(shared) >= 70 and [p for p in shared if got[p] != pushed[p]] == []
    codec = {p for p in pushed if p.startswith("audio_tokenizer/")}
    assert codec and codec <= set(shared)  # the pushed folder's own codec, byte for byte
    assert run("verify", str(out), cache=cache).returncode == 0
    card = ModelCard.load(out / "README.md")  # laid out, not quantized here: no base_model
    assert card.data.base_model is None and "base_model_relation" not in card.data.to_dict()
    assert f"Laid out from the converted weights [{REPO}]" in card.text
    assert_speaks(out / "moss-tts.yaml", cache, tmp_path)


def test_a_pushed_repo_changed_behind_its_manifest_is_refused_by_name(
    folder: Path, hub: StandIn, tmp_path: Path
) -> None:
    """The cache's listing agrees with the changed file (it was committed so): only the
    manifest tells, and names it."""
    assert moss("push", str(folder), REPO, endpoint=hub.url, home=tmp_path).returncode == 0
    files = cache_of(hub, REPO, tmp_path / "pulled")
    victim = "embeddings/emb_ext_05.npy"
    data = bytearray(files[victim].read_bytes())
    data[-1] ^= 1
    files[victim].write_bytes(bytes(data))
    cache = tmp_path / "hub-cache"
    add_repo(cache, REPO, files)
    out = tmp_path / "back"
    done = run("all", "--model", REPO, "--output", str(out), cache=cache)
    assert done.returncode == 2
    line = " ".join(done.stderr.split())
    assert victim in line and "differs from the sha256 the repo's manifest.json lists" in line
    assert not out.exists()
