"""A local stand-in of the Hub endpoints huggingface_hub calls to push (the only stand-in the
tests use: the Hub is not reachable here). Loopback only, a thread of the test process, shut
down by the fixture and, whatever happens, by a timer.

What huggingface_hub 2.x calls for create_repo + list_repo_tree + create_commit, read from its
code (hf_api.py, _commit_api.py, lfs.py): POST /api/repos/create; GET
/api/models/{repo}/tree/{rev}; POST /api/validate-yaml (a README.md in the commit); POST
/api/models/{repo}/preupload/{rev} (upload mode and the remote oid of each file); POST
/{repo}.git/info/lfs/objects/batch (basic transfer only: an upload action per object the store
lacks, none for one it holds); PUT of the bytes to the upload href; POST of the verify href;
POST /api/models/{repo}/commit/{rev} (ndjson: header, file, lfsFile); POST
/api/models/{repo}/branch/{branch}; GET /api/models/{repo}/revision/{rev}.
Run with HF_HUB_DISABLE_XET=1: the client would use Xet where hf_xet is installed, and the
stand-in offers basic LFS only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

TOKEN = "hf_standin_write"  # writes to its own namespace
USER = "me"
LFS_SUFFIXES = (".gguf", ".npy", ".onnx", ".data")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    owner: str
    private: bool
    branches: dict[str, dict[str, dict]] = field(default_factory=lambda: {"main": {}})
    heads: dict[str, str] = field(default_factory=lambda: {"main": "0" * 40})
    commits: list[dict] = field(default_factory=list)


@dataclass
class Hub:
    """The stand-in's state: repos, the LFS store and what was asked of it."""

    repos: dict[str, Repo] = field(default_factory=dict)
    lfs: dict[str, bytes] = field(default_factory=dict)  # sha256 → content
    blobs: dict[str, bytes] = field(default_factory=dict)  # git blob id → a small file
    uploads: list[str] = field(default_factory=list)  # sha256 of each LFS PUT
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tree(self, repo: str, rev: str) -> dict[str, dict]:
        return self.repos[repo].branches[rev]

    def content(self, entry: dict) -> bytes:
        """A tree entry's bytes, from the LFS store or the small-file blobs."""
        return self.lfs[entry["lfs"]["oid"]] if "lfs" in entry else self.blobs[entry["oid"]]


def _entry(path: str, data: bytes, lfs: bool) -> dict:
    sha = hashlib.sha256(data).hexdigest()
    if not lfs:
        return {"type": "file", "path": path, "size": len(data), "oid": git_blob_id(data)}
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n"
    return {"type": "file", "path": path, "size": len(data), "oid": git_blob_id(pointer.encode()),
            "lfs": {"oid": sha, "size": len(data), "pointerSize": len(pointer)}}  # fmt: skip


def is_lfs(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size > 10 << 20


class Handler(BaseHTTPRequestHandler):
    hub: Hub
    base: str

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: object = None, headers: dict | None = None) -> None:
        data = json.dumps(body if body is not None else {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _user(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return USER if auth == f"Bearer {TOKEN}" else None

    def _route(self, method: str) -> None:
        url = urlparse(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        with self.hub.lock:
            self.hub.requests.append(f"{method} {path}")
        for pattern, name in ROUTES:
            m = re.fullmatch(pattern, f"{method} {path}")
            if m:
                return getattr(self, name)(query, **m.groupdict())
        self._send(404, {"error": f"no route {method} {path}"})

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    # ------------------------------------------------------------------ endpoints

    def create_repo(self, query) -> None:
        body = json.loads(self._body())
        repo = f"{body.get('organization') or USER}/{body['name']}"
        if self._user() is None:
            return self._send(401, {"error": "Invalid credentials"})
        with self.hub.lock:
            if repo.split("/")[0] != USER:
                return self._send(403, {"error": "You don't have the rights to create a model "
                                                 "under this namespace"})  # fmt: skip
            if repo in self.hub.repos:
                return self._send(409, {"error": "You already created this model repo",
                                        "url": f"{self.base}/{repo}"})  # fmt: skip
            private = body.get("visibility") == "private" or bool(body.get("private"))
            self.hub.repos[repo] = Repo(USER, private)
        self._send(200, {"url": f"{self.base}/{repo}", "name": repo})

    def tree(self, query, repo: str, rev: str) -> None:
        if repo not in self.hub.repos:
            return self._send(404, {"error": "Repository not found"},
                              {"X-Error-Code": "RepoNotFound"})  # fmt: skip
        if rev not in self.hub.repos[repo].branches:
            return self._send(404, {"error": "Invalid rev id"},
                              {"X-Error-Code": "RevisionNotFound"})  # fmt: skip
        self._send(200, list(self.hub.tree(repo, rev).values()))

    def revision(self, query, repo: str, rev: str = "main") -> None:
        r = self.hub.repos.get(repo)
        if r is None or rev not in r.heads:
            return self._send(404, {"error": "not found"}, {"X-Error-Code": "RepoNotFound"})
        siblings = [{"rfilename": p} for p in r.branches[rev]]
        self._send(200, {"id": repo, "sha": r.heads[rev], "private": r.private,
                         "siblings": siblings})  # fmt: skip

    def validate_yaml(self, query) -> None:
        from huggingface_hub import ModelCard

        content = json.loads(self._body())["content"]
        try:
            ModelCard(content, ignore_metadata_errors=False)
        except Exception as exc:
            return self._send(400, {"errors": [{"message": str(exc)}]})
        self._send(200, {"errors": [], "warnings": []})

    def _writable(self, repo: str) -> bool:
        r = self.hub.repos.get(repo)
        return self._user() is not None and r is not None and r.owner == USER

    def preupload(self, query, repo: str, rev: str) -> None:
        if not self._writable(repo):
            return self._send(403, {"error": "You don't have the rights to write to this repo"})
        files = json.loads(self._body())["files"]
        tree = self.hub.repos[repo].branches.get(rev, {})
        out = []
        for f in files:
            lfs = is_lfs(f["path"], f["size"])
            have = tree.get(f["path"])
            oid = None if have is None else (have["lfs"]["oid"] if "lfs" in have else have["oid"])
            out.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular",
                        "shouldIgnore": False, "oid": oid})  # fmt: skip
        self._send(200, {"files": out})

    def lfs_batch(self, query, repo: str) -> None:
        if not self._writable(repo):
            return self._send(403, {"message": "write access denied"})
        body = json.loads(self._body())
        assert "basic" in body["transfers"], body
        objects = []
        for o in body["objects"]:
            item = {"oid": o["oid"], "size": o["size"], "authenticated": True}
            if o["oid"] not in self.hub.lfs:
                item["actions"] = {
                    "upload": {"href": f"{self.base}/lfs-store/{o['oid']}"},
                    "verify": {"href": f"{self.base}/lfs-verify"},
                }
            objects.append(item)
        self._send(200, {"transfer": "basic", "objects": objects})

    def lfs_put(self, query, oid: str) -> None:
        data = self._body()
        if hashlib.sha256(data).hexdigest() != oid:
            return self._send(400, {"message": "sha256 does not match the oid"})
        with self.hub.lock:
            self.hub.lfs[oid] = data
            self.hub.uploads.append(oid)
        self._send(200, {})

    def lfs_verify(self, query) -> None:
        body = json.loads(self._body())
        data = self.hub.lfs.get(body["oid"])
        ok = data is not None and len(data) == body["size"]
        self._send(200 if ok else 404, {} if ok else {"message": "object not found"})

    def branch(self, query, repo: str, branch: str) -> None:
        if not self._writable(repo):
            return self._send(403, {"error": "write access denied"})
        r = self.hub.repos[repo]
        with self.hub.lock:
            if branch in r.branches:
                return self._send(409, {"error": "Reference already exists"})
            r.branches[branch] = dict(r.branches["main"])
            r.heads[branch] = r.heads["main"]
        self._send(200, {})

    def commit(self, query, repo: str, rev: str) -> None:
        if not self._writable(repo):
            return self._send(403, {"error": "You don't have the rights to write to this repo"})
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        r = self.hub.repos[repo]
        pr = query.get("create_pr") == ["1"]
        target = f"refs/pr/{sum(b.startswith('refs/pr/') for b in r.branches) + 1}" if pr else rev
        tree = dict(r.branches.get(rev, {}))
        for item in lines[1:]:
            v = item["value"]
            if item["key"] == "file":
                data = base64.b64decode(v["content"])
                tree[v["path"]] = _entry(v["path"], data, False)
                self.hub.blobs[git_blob_id(data)] = data
            elif item["key"] == "lfsFile":
                data = self.hub.lfs.get(v["oid"])
                if data is None or len(data) != v["size"]:
                    return self._send(400, {"error": f"LFS object {v['oid']} not uploaded"})
                tree[v["path"]] = _entry(v["path"], data, True)
            else:
                return self._send(400, {"error": f"unsupported {item['key']}"})
        with self.hub.lock:
            oid = hashlib.sha1(json.dumps([target, len(r.commits), sorted(tree)]).encode())
            r.branches[target] = tree
            r.heads[target] = oid.hexdigest()
            r.commits.append({"revision": target, "summary": lines[0]["value"]["summary"],
                              "paths": [i["value"]["path"] for i in lines[1:]]})  # fmt: skip
        n = target.rsplit("/", 1)[-1]
        self._send(200, {"commitUrl": f"{self.base}/{repo}/commit/{oid.hexdigest()}",
                         "commitOid": oid.hexdigest(),
                         "pullRequestUrl": f"{self.base}/{repo}/discussions/{n}" if pr else None})


REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
ROUTES = [
    (r"POST /api/repos/create", "create_repo"),
    (rf"GET /api/models/{REPO}/tree/(?P<rev>[^/]+(?:/pr/\d+)?)", "tree"),
    (rf"GET /api/models/{REPO}/revision/(?P<rev>.+)", "revision"),
    (rf"GET /api/models/{REPO}", "revision"),
    (r"POST /api/validate-yaml", "validate_yaml"),
    (rf"POST /api/models/{REPO}/preupload/(?P<rev>.+)", "preupload"),
    (rf"POST /{REPO}\.git/info/lfs/objects/batch", "lfs_batch"),
    (r"PUT /lfs-store/(?P<oid>[0-9a-f]{64})", "lfs_put"),
    (r"POST /lfs-verify", "lfs_verify"),
    (rf"POST /api/models/{REPO}/branch/(?P<branch>.+)", "branch"),
    (rf"POST /api/models/{REPO}/commit/(?P<rev>.+)", "commit"),
]


class StandIn:
    """The server on 127.0.0.1 (a free port), its state, and its stop (also after LIFETIME s)."""

    def __init__(self, lifetime: float = 600.0) -> None:
        self.hub = Hub()
        handler = type("H", (Handler,), {"hub": self.hub})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        handler.base = self.url
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.timer = threading.Timer(lifetime, self.stop)
        self.timer.daemon = True

    def __enter__(self) -> StandIn:
        self.thread.start()
        self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.timer.cancel()
        self.server.shutdown()
        self.server.server_close()
