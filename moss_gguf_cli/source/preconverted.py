"""Pre-converted weights for the llama.cpp backend (the OpenMOSS-Team/MOSS-TTS-GGUF layout).

Such a repo (or a local copy of one) holds a quantized Qwen3 backbone ``.gguf``,
``embeddings/`` and ``lm_heads/`` (the 33 + 33 ``.npy`` tables) and ``tokenizer/``; no config,
no hash list. ``all`` recognises it from the file set, downloads only the GGUF of the asked
file type and the tables, checks every file against the record the download has (`hub`: the
Hub's listing online; offline the client's tree listing, an older cache's blob names, or a
``--local-dir`` folder's metadata; a plain folder is used as it is and says so), and lays
out a weights folder with the codec, a synth YAML and a manifest. The model facts the repo
does not state (n_vq, sizes) are derived from the tables and the GGUF and written to
``extraction_meta.json`` as derived.

A repo `moss-gguf push` made (#51) is such a repo with its manifest.json: the manifest and
the codec in audio_tokenizer/ are downloaded too, and every file used is checked twice, against
the download's record and against the sha256 the manifest lists (`check_manifest`).

Other GGUF formats of the family are refused by what the files are, never by the repo's
name: openmoss ``*.extras.gguf`` pairs, single-file GGUFs with the tables inside, GGUFs that
bundle the codec, MOSS-TTS-Local.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..disk.confine import boundary, confined, table_header
from ..disk.digests import sha256_file
from ..disk.layout_names import (
    AUDIO_TOKENIZER_DIR,
    EMBEDDING_DIR,
    LM_HEAD_DIR,
    MANIFEST_NAME,
    TOKENIZER_DIR,
)
from ..errors import InputError, UnsupportedModelError, UsageError
from ..gguf.file_types import file_type_table, parse_file_type
from ..gguf.read import inspect_gguf, read_gguf
from ..progress import ProgressReporter
from .hub import (
    NO_RECORD,
    Listing,
    check_files,
    download,
    is_repo_id,
    list_files,
    local_listing,
)

LAYOUT = "a Qwen3 backbone .gguf beside embeddings/, lm_heads/ and tokenizer/"
_TABLE = re.compile(
    r"^(embeddings/(embed_tokens|emb_ext_\d\d)|lm_heads/lm_head_(text|audio_\d\d))\.npy$"
)


@dataclass
class GgufRepo:
    """A recognised pre-converted repo: where its files are listed and which GGUFs it offers."""

    source: str  # repo id or folder
    files: list[str]  # every file's path in the repo or folder
    ggufs: dict[str, str]  # file type (Q4_K_M) → path
    local: Path | None = None  # a local copy, else None (Hub)
    listing: Listing | None = None  # the record the files are checked by; None: no record

    @property
    def tables(self) -> list[str]:
        return sorted(f for f in self.files if _TABLE.match(f))

    @property
    def tokenizer(self) -> list[str]:
        return sorted(f for f in self.files if f.startswith(TOKENIZER_DIR + "/"))

    @property
    def published(self) -> bool:
        """A folder moss-gguf wrote and pushed: its manifest lists every file's sha256."""
        return MANIFEST_NAME in self.files

    @property
    def codec(self) -> list[str]:
        """A published folder's audio tokenizer files (none for other repos)."""
        if not self.published:
            return []
        return sorted(f for f in self.files if f.startswith(AUDIO_TOKENIZER_DIR + "/"))


def file_type_of(name: str, types: list[str]) -> str | None:
    """The llama.cpp file type a GGUF's name states (MOSS_TTS_Q4_K_M.gguf → Q4_K_M)."""
    stem = Path(name).stem.upper()
    for t in sorted(types, key=len, reverse=True):  # Q4_K_M before Q4_K
        if re.search(rf"(^|[^A-Z0-9]){re.escape(t)}$", stem) or stem == t:
            return t
    return None


def _refuse(source: str, what: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{source} holds {what}, not the llama.cpp-backend layout moss-gguf uses ({LAYOUT})",
        hint="use OpenMOSS-Team/MOSS-TTS-GGUF, or the safetensors checkpoint "
        "(OpenMOSS-Team/MOSS-TTS) to convert",
    )


def classify_gguf(source: str, path: Path) -> None:
    """Refuse a GGUF that is not a plain Qwen3 backbone, naming the format it is."""
    info = inspect_gguf(path)
    names = list(info.tensors)
    arch = (info.architecture or "").lower()
    if "local" in arch or any("local_transformer" in n for n in names):
        raise _refuse(source, f"a MOSS-TTS-Local GGUF (architecture {info.architecture})")
    if any(re.search(r"(codec|quantizer|acoustic|audio_tokenizer)", n) for n in names):
        raise _refuse(source, "a GGUF bundling the audio codec")
    if any(re.search(r"(emb_ext|lm_heads?\.|audio_emb|audio_head)", n) for n in names):
        raise _refuse(source, "a single-file MOSS GGUF with the tables inside")
    if arch != "qwen3":
        raise _refuse(source, f"a GGUF of architecture {info.architecture!r}")


def recognise(
    model: str, revision: str | None = None, cache_dir: Path | None = None
) -> GgufRepo | None:
    """A GgufRepo if MODEL (folder or repo id) is a GGUF repo we can use; None for a checkpoint.

    Raises for GGUF repos of other formats.
    """
    path = Path(model).expanduser()
    listing: Listing | None
    if path.is_dir():
        files = _local_files(path)
        local: Path | None = path
        listing = local_listing(path)
    elif is_repo_id(model) and not path.exists():
        listing = list_files(model, revision, cache_dir)
        if listing is None:
            return None  # nothing known offline: the checkpoint path says what is missing
        files = sorted(listing.files)
        local = None
    else:
        return None
    ggufs = [f for f in files if f.endswith(".gguf")]
    if not ggufs or any(f.endswith(".safetensors") for f in files):
        return None
    if any(f.endswith(".extras.gguf") for f in files):
        raise _refuse(model, "an openmoss .gguf + .extras.gguf pair")
    tables = [f for f in files if _TABLE.match(f)]
    if not tables:
        if local is not None:
            for g in ggufs:
                classify_gguf(model, local / g)
        raise _refuse(model, "GGUF files without embeddings/ and lm_heads/ tables")
    if not any(f == f"{TOKENIZER_DIR}/tokenizer.json" for f in files):
        raise InputError(
            f"{model} has no {TOKENIZER_DIR}/tokenizer.json", hint=f"expected {LAYOUT}"
        )
    known = list(file_type_table())
    by_type: dict[str, str] = {}
    for g in sorted(ggufs):
        if "/" in g:
            continue  # backbones sit at the top (first_class/… and the like are other formats)
        t = file_type_of(g, known)
        if t is not None:
            by_type.setdefault(t, g)
    if not by_type:
        raise _refuse(model, "GGUF files whose quant type their names do not say")
    return GgufRepo(model, files, by_type, local, listing)


def _local_files(folder: Path) -> list[str]:
    """A local folder's files (the hub client's own metadata aside), none of them a link out."""
    root = boundary(folder)
    out = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if rel.parts[0] == ".cache" or not (p.is_file() or p.is_symlink()):
            continue
        confined(p, root)
        out.append(rel.as_posix())
    return out


def choose(repo: GgufRepo, file_types: list[str]) -> list[str]:
    """The repo's GGUF paths for the asked file types; one line listing what it has if not."""
    wanted = [parse_file_type(q) for q in file_types] or ["Q4_K_M"]
    missing = [q for q in wanted if q not in repo.ggufs]
    if missing:
        raise UsageError(
            f"{repo.source} has no {', '.join(missing)} backbone; it has "
            f"{', '.join(sorted(repo.ggufs))}",
            hint="pass --quant with one of those, or convert the safetensors checkpoint",
        )
    return [repo.ggufs[q] for q in wanted]


def fetch(
    repo: GgufRepo,
    ggufs: list[str],
    revision: str | None = None,
    cache_dir: Path | None = None,
    progress: ProgressReporter | None = None,
) -> tuple[Path, dict[str, str], str]:
    """Download (Hub) what the weights folder needs and check it against the download's record:
    (root, path → sha256, what the check was made against)."""
    rels = ggufs + repo.tables + repo.tokenizer
    extra = [MANIFEST_NAME, *repo.codec] if repo.published else []
    if repo.local is not None:
        root = repo.local
    else:
        patterns = ggufs + [f"{EMBEDDING_DIR}/*.npy", f"{LM_HEAD_DIR}/*.npy", f"{TOKENIZER_DIR}/*"]
        root = download(repo.source, patterns + extra, revision, cache_dir, progress)
    root_bound = boundary(root)
    for rel in rels + extra:
        confined(root / rel, root_bound)
    digests, checked = {}, NO_RECORD
    if repo.listing is not None:
        digests = check_files(repo.listing, root, rels + extra, progress)
        checked = repo.listing.describe()
    if repo.published:
        digests.update(check_manifest(root, rels + repo.codec, digests))
        checked = f"{checked}; the repo's {MANIFEST_NAME}"
    return root, digests, checked


def check_manifest(root: Path, rels: list[str], known: dict[str, str]) -> dict[str, str]:
    """Each rel's sha256 (KNOWN's where the download's check computed it) against the one the
    published folder's manifest.json lists; rel → sha256. Raises naming the first that is not
    listed or differs."""
    try:
        listed = {f["path"]: str(f["sha256"]).lower()
                  for f in json.loads((root / MANIFEST_NAME).read_text())["files"]}  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        where = root / MANIFEST_NAME
        raise InputError(f"{MANIFEST_NAME} is unreadable ({exc})", path=where) from None
    out = {}
    for rel in rels:
        got = known.get(rel) or sha256_file(root / rel)
        if rel not in listed:
            raise InputError(f"{rel} is not in the repo's {MANIFEST_NAME}", path=root / rel,
                             hint="the repo was changed after moss-gguf pushed it")  # fmt: skip
        if got != listed[rel]:
            raise InputError(f"{rel} differs from the sha256 the repo's {MANIFEST_NAME} lists",
                             path=root / rel, hint="the repo was changed after moss-gguf "
                             "pushed it; push the folder again")  # fmt: skip
        out[rel] = got
    return out


# language_config key ← qwen3.* GGUF key (what llama.cpp's converter wrote from it)
_GGUF_LANG = {
    "num_hidden_layers": "block_count",
    "max_position_embeddings": "context_length",
    "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base",
}


def gguf_language_config(path: Path, arch: str = "qwen3") -> dict:
    """A Qwen3 language_config from a backbone GGUF's {arch}.* metadata (the one GGUF header
    reader, gguf/read.py: it skips the vocabulary)."""
    kv = read_gguf(path).kv
    out: dict = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    for key, gkey in _GGUF_LANG.items():
        value = kv.get(f"{arch}.{gkey}")
        if value is not None:
            out[key] = float(value) if key in ("rms_norm_eps", "rope_theta") else int(value)
    return out


def derive_meta(root: Path, repo: GgufRepo, gguf: str) -> dict:
    """extraction_meta.json for a repo that has none: facts read from its tables and GGUF."""
    classify_gguf(repo.source, root / gguf)
    ext = sorted(f for f in repo.tables if "/emb_ext_" in f)
    heads = sorted(f for f in repo.tables if "/lm_head_audio_" in f)
    n_vq = len(ext)
    expected = [f"{EMBEDDING_DIR}/emb_ext_{i:02d}.npy" for i in range(n_vq)]
    expected += [f"{LM_HEAD_DIR}/lm_head_audio_{i:02d}.npy" for i in range(n_vq)]
    expected += [f"{EMBEDDING_DIR}/embed_tokens.npy", f"{LM_HEAD_DIR}/lm_head_text.npy"]
    missing = sorted(set(expected) - set(repo.tables))
    if not n_vq or missing or len(heads) != n_vq:
        raise InputError(
            f"{repo.source}: the tables do not make a MOSS model "
            f"({', '.join(missing[:3]) or 'no emb_ext tables'} missing)",
            hint=f"expected {LAYOUT}",
        )
    (vocab, hidden), dtype = table_header(root / EMBEDDING_DIR / "embed_tokens.npy")
    audio_rows = table_header(root / ext[0], (None, hidden))[0][0]
    table_header(root / LM_HEAD_DIR / "lm_head_text.npy", (vocab, hidden))
    for rel in ext + heads:
        table_header(root / rel, (audio_rows, hidden))
    info = inspect_gguf(root / gguf)
    layers = len({m.group(1) for n in info.tensors if (m := re.match(r"blk\.(\d+)\.", n))})
    lang = gguf_language_config(root / gguf)
    lang["vocab_size"] = int(vocab)
    return {
        "source_model": repo.source,
        "n_vq": n_vq,
        "hidden_size": int(hidden),
        "vocab_size": int(vocab),
        "audio_vocab_size": int(audio_rows) - 1,
        "npy_dtype": str(dtype),
        "derived": {
            "from": "pre-converted tables and GGUF (the repo has no config)",
            "n_vq": f"{n_vq} emb_ext tables",
            "hidden_size": "embed_tokens.npy columns",
            "vocab_size": "embed_tokens.npy rows",
            "audio_vocab_size": "emb_ext_00.npy rows - 1 (the pad row)",
            "num_hidden_layers": f"{layers} blk.N in {Path(gguf).name}",
            "language_config": f"qwen3.* metadata of {Path(gguf).name}",
        },
        "moss_config": {
            "n_vq": n_vq,
            "audio_vocab_size": int(audio_rows) - 1,
            "audio_pad_code": int(audio_rows) - 1,
            "language_config": lang,
        },
    }


def write_meta(meta: dict, folder: Path) -> Path:
    """The derived extraction_meta.json in a temporary folder, to be placed like the rest."""
    tmp = Path(tempfile.mkdtemp(prefix=".moss-gguf-meta-", dir=folder))
    path = tmp / "extraction_meta.json"
    path.write_text(json.dumps(meta, indent=2) + "\n")
    return path
