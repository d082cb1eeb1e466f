"""`all --model` on a first-class `moss-tts-delay` GGUF: the backend layout synth speaks with.

The model is a first-class file, a folder holding one (as `all --format moss-tts-delay` writes
it) or a Hub repo holding one (listed, downloaded and checked by source/hub.py). The file is
checked (gguf/first_class_read.check_first_class: one line naming it when it is broken), then taken
apart into a work folder: the backbone tensors' bytes as they are under a qwen3 header (the keys
`convert` writes, the tokenizer keys read from the tokenizer folder beside it), the 2 + 2 x n_vq
tables as f16 .npy (exact for F16, rounded for BF16/F32, dequantized for a quantized type; the
meta says which) and extraction_meta.json; `run.run_from_first_class` lays that out and verifies.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import __version__
from ..disk.layout_names import EMBEDDING_DIR, LM_HEAD_DIR, META_NAME, TOKENIZER_DIR
from ..errors import UsageError
from ..gguf.file_types import file_type_table, parse_file_type
from ..gguf.first_class import ARCH_NAME, AUDIO_EMBD
from ..gguf.first_class_read import (
    EXACT_TYPES,
    FirstClassFacts,
    backbone_plan,
    backend_table_name,
    check_first_class,
    read_table,
    write_backbone,
)
from ..gguf.read import GgufFormatError, read_gguf
from ..gguf.tokenizer_files import HOW as TOKENIZER_HOW
from ..gguf.tokenizer_files import write_tokenizer_files
from ..gguf.vocab import read_vocab
from ..gguf.write import Qwen3Params
from ..progress import ProgressReporter, ensure
from ..source.checkpoint import TOKENIZER_FILES, variant_name
from ..source.hub import check_files, download, is_repo_id, list_files
from ..source.preconverted import file_type_of, gguf_language_config
from .layout import Placement
from .made_from import folder_identity

# tokenizer.ggml.* id key → the config key gguf's SpecialVocab reads it from
_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "padding": "pad_token_id"}
DEFAULT_FILE_TYPE = "Q4_K_M"  # all's --quant default
_MOSS_IDS = (
    "audio_start_token_id", "audio_end_token_id", "audio_user_slot_token_id",
    "audio_assistant_gen_slot_token_id", "audio_assistant_delay_slot_token_id",
)  # fmt: skip


@dataclass
class FirstClassInput:
    """A first-class GGUF found for `all --model`, with what the layout needs beside it."""

    model: str  # as given
    gguf: Path
    tokenizer: Path | None  # the folder holding tokenizer.json; None: rebuilt from the file
    source: dict  # what it was made from (a folder's files, or a Hub repo at a commit)
    checked: str  # what its bytes were checked against
    digests: dict[str, str]  # rel → sha256 the Hub check took (Hub repos only)


def is_first_class(path: Path) -> bool:
    """Whether the file is meant as a first-class GGUF: the architecture and its audio tensors
    (other MOSS GGUFs of that architecture name are look-alikes preconverted.py refuses), or a
    header too broken to read in a file named for the format (its check then says what is
    wrong)."""
    try:
        g = read_gguf(path)
    except (GgufFormatError, OSError):
        return path.name.endswith(".gguf") and ARCH_NAME in path.name
    return g.arch == ARCH_NAME and any(n.startswith(f"{AUDIO_EMBD}.") for n in g.tensors)


def _choose(model: str, ggufs: list[str], file_types: list[str]) -> str:
    """The one GGUF of the model the run reads: the --quant type its name says; with the
    default --quant (Q4_K_M) and one file, that file, whatever its type."""
    if len(file_types) > 1:
        raise UsageError(
            f"{model} is one first-class GGUF per type; pass one --quant",
            hint="run `all` once per type",
        )
    by_type = {file_type_of(Path(g).name, list(file_type_table())): g for g in ggufs}
    wanted = parse_file_type(file_types[0]) if file_types else DEFAULT_FILE_TYPE
    if wanted in by_type:
        return by_type[wanted]
    if len(ggufs) == 1 and wanted == DEFAULT_FILE_TYPE:
        return ggufs[0]
    have = ", ".join(sorted(t for t in by_type if t)) or "no type in its names"
    raise UsageError(f"{model} has no {wanted} first-class GGUF ({have})",
                     hint="pass --quant with one of those")  # fmt: skip


def _tokenizer_beside(gguf: Path) -> Path | None:
    """The tokenizer folder beside a first-class file; None: the file alone (its own
    tokenizer.ggml.* keys are then made into one, gguf/tokenizer_files.py)."""
    for folder in (gguf.parent / TOKENIZER_DIR, gguf.parent):
        if (folder / "tokenizer.json").is_file():
            return folder
    return None


def find_first_class(
    model: str,
    file_types: list[str],
    revision: str | None = None,
    cache_dir: Path | None = None,
    progress: ProgressReporter | None = None,
) -> FirstClassInput | None:
    """MODEL as a first-class GGUF (file, folder or Hub repo), or None: not one."""
    path = Path(model).expanduser()
    if path.is_file():
        if not is_first_class(path):
            return None
        check_first_class(path)  # a broken one: its one line before any other work
        source = folder_identity(path.parent, [path.name])
        return FirstClassInput(model, path, _tokenizer_beside(path), source, "local file", {})
    if path.is_dir():
        if any(path.glob("*.safetensors")):
            return None
        ggufs = sorted(p.name for p in path.glob("*.gguf") if is_first_class(p))
        if not ggufs:
            return None
        gguf = path / _choose(model, ggufs, file_types)
        check_first_class(gguf)
        source = folder_identity(path, [gguf.name])
        return FirstClassInput(model, gguf, _tokenizer_beside(gguf), source, "local folder", {})
    if is_repo_id(model) and not path.exists():
        return _from_hub(model, file_types, revision, cache_dir, progress)
    return None


def _from_hub(
    model: str, file_types: list[str], revision: str | None, cache_dir: Path | None, progress
) -> FirstClassInput | None:
    """A Hub repo whose GGUFs are first-class: the chosen one and the tokenizer, downloaded and
    checked against the Hub's listing (hub.py)."""
    listing = list_files(model, revision, cache_dir)
    if listing is None:
        return None
    files = sorted(listing.files)
    ggufs = [f for f in files if f.endswith(".gguf") and "/" not in f]
    tables = [f for f in files if f.startswith((f"{EMBEDDING_DIR}/", f"{LM_HEAD_DIR}/"))]
    if not ggufs or tables or any(f.endswith(".safetensors") for f in files):
        return None  # a checkpoint or a backend-layout repo: the other paths take it
    named = [g for g in ggufs if ARCH_NAME in g.lower()]
    if not named:
        return None
    gguf = _choose(model, named, file_types)
    tok = [f"{TOKENIZER_DIR}/{n}" for n in TOKENIZER_FILES if f"{TOKENIZER_DIR}/{n}" in files]
    if f"{TOKENIZER_DIR}/tokenizer.json" not in tok:
        tok = []  # the file's own tokenizer keys are made into one
    root = download(model, [gguf, *tok], revision, cache_dir, progress)
    digests = check_files(listing, root, [gguf, *tok], progress)
    check_first_class(root / gguf)
    source = {"repo": model, "commit": listing.commit or revision or "main"}
    return FirstClassInput(model, root / gguf, root / TOKENIZER_DIR if tok else None, source,
                           listing.describe(), digests)  # fmt: skip


# --------------------------------------------------------------------------- taking it apart


@dataclass
class Unpacked:
    """The work folder's parts, ready for layout.arrange."""

    work: Path
    items: list[Placement]
    meta: dict
    names: list[str]  # the backbone GGUF's name in the folder


def backbone_name(facts: FirstClassFacts) -> str:
    """backbone_<type>.gguf, as `all` names its backbones (f16, q4_k_m, ...)."""
    import gguf

    value = facts.header.kv.get("general.file_type", 1)
    name = gguf.LlamaFileType(int(value)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    return f"backbone_{name.lower()}.gguf"


def language_config(facts: FirstClassFacts) -> dict:
    """The Qwen3 config the header's keys state (the keys `convert` writes from it)."""
    lang = gguf_language_config(facts.header.path, ARCH_NAME)
    lang["vocab_size"] = facts.vocab
    lang["tie_word_embeddings"] = False  # the file holds output.weight
    for key, config_key in _ID_KEYS.items():
        value = facts.header.kv.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(value, int):
            lang[config_key] = value
    return lang


def unpack(fc: FirstClassInput, output: Path, progress: ProgressReporter | None = None) -> Unpacked:
    """Check the file and write the backend's parts into a work folder beside OUTPUT (removed
    on failure; the caller removes it once laid out)."""
    bar = ensure(progress)
    facts = check_first_class(fc.gguf)
    output.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{output.name}.first-class-", dir=output.parent))
    try:
        lang = language_config(facts)
        params = Qwen3Params.from_config(lang, fc.gguf)
        tokenizer, movable = fc.tokenizer, False
        if tokenizer is None:
            tokenizer, movable = work / TOKENIZER_DIR, True
            write_tokenizer_files(fc.gguf, tokenizer)
        vocab = read_vocab(tokenizer, lang, params.vocab)
        name = backbone_name(facts)
        # convert's general.name: '<variant> backbone'
        title = f"{variant_name({'n_vq': facts.n_vq})} backbone"
        write_backbone(backbone_plan(facts, params, vocab, title), work / name)
        types = _write_tables(facts, work, bar)
        meta = first_class_meta(fc, facts, lang, types)
        meta["first_class"]["tokenizer"] = "beside the file" if fc.tokenizer else TOKENIZER_HOW
        (work / META_NAME).write_text(json.dumps(meta, indent=2) + "\n")
        items = [Placement(work / name, name)]
        tables = [p for d in (EMBEDDING_DIR, LM_HEAD_DIR) for p in sorted((work / d).iterdir())]
        items += [Placement(p, p.relative_to(work).as_posix()) for p in tables]
        items += [Placement(tokenizer / n, f"{TOKENIZER_DIR}/{n}", movable=movable)
                  for n in TOKENIZER_FILES if (tokenizer / n).is_file()]  # fmt: skip
        items.append(Placement(work / META_NAME, META_NAME))
        return Unpacked(work, items, meta, [name])
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _write_tables(facts: FirstClassFacts, work: Path, bar: ProgressReporter) -> dict[str, str]:
    """Every table as f16 .npy; table stem → the type it was stored in."""
    g = facts.header
    names = [n for n in g.tensors if backend_table_name(n) is not None]
    bar.start("tables", "tables", len(names), "")
    types = {}
    try:
        for name in names:
            stem = backend_table_name(name)
            folder = work / (EMBEDDING_DIR if stem.startswith(("emb", "embed")) else LM_HEAD_DIR)
            folder.mkdir(exist_ok=True)
            np.save(folder / f"{stem}.npy", read_table(g, name))
            types[stem] = g.tensors[name].type_name
            bar.advance("tables", 1)
    finally:
        bar.finish("tables")
    return dict(sorted(types.items()))


def first_class_meta(fc: FirstClassInput, facts: FirstClassFacts, lang: dict, types: dict) -> dict:
    """extraction_meta.json: the model's facts from the header, and how each table was made."""
    kv = facts.header.kv
    moss = {k: kv[f"{ARCH_NAME}.{k}"] for k in ("n_vq", "audio_vocab_size", "audio_pad_code",
                                                  *_MOSS_IDS, "sampling_rate")
            if f"{ARCH_NAME}.{k}" in kv}  # fmt: skip
    quantized = sorted(s for s, t in types.items() if t not in EXACT_TYPES)
    rounded = sorted(s for s, t in types.items() if t in EXACT_TYPES and t != "F16")
    return {
        "source_model": fc.model,
        "n_vq": facts.n_vq,
        "hidden_size": facts.hidden,
        "vocab_size": facts.vocab,
        "audio_vocab_size": facts.audio_rows - 1,
        "npy_dtype": "float16",
        "tool": f"moss-gguf {__version__}",
        "moss_config": {**moss, "language_config": lang},
        "first_class": {
            "file": fc.gguf.name,
            # exact: every table's f16 bytes are the file's; else which were not
            "tables": "dequantized" if quantized else "rounded to f16" if rounded else "exact",
            "table_types": dict(Counter(types.values())),
            "dequantized": quantized,
            "rounded": rounded,
        },
    }
