"""Text normalisation equals upstream v1.5's `normalize_tts_text`.

tests/data/upstream_normalize.json holds upstream's TEST_CASES, our own cases and generated
mixtures with upstream's outputs, recorded by scripts/upstream_text_rules.py at the commit the
file names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moss_gguf_cli.delay.normalize import normalize_text

DATA = json.loads(
    (Path(__file__).parent / "data" / "upstream_normalize.json").read_text(encoding="utf-8")
)
CASES = DATA["cases"]


def test_the_data_is_upstreams_whole_suite() -> None:
    assert len(DATA["commit"]) == 40 and "upstream_text_rules.py" in DATA["command"]
    upstream = [c for c in CASES if c["source"] == "upstream TEST_CASES"]
    assert len(upstream) == 38  # TEST_CASES at 58b20a0
    assert sum(c["source"] == "ours" for c in CASES) >= 50
    assert sum(c["source"].startswith("generated") for c in CASES) >= 400


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_equals_upstream(case: dict) -> None:
    assert normalize_text(case["input"]) == case["output"]


def test_upstream_only_test_cases_are_idempotent() -> None:
    # upstream's own suite checks a second pass changes nothing; so does ours
    for case in CASES:
        if case["source"] == "upstream TEST_CASES":
            assert normalize_text(case["output"]) == case["output"], case["name"]


def test_english_prose_keeps_its_dashes_and_ellipsis() -> None:
    # what the issue found: these became "Pages 10。20 are missing。see v2.3.1!" and "。"
    assert normalize_text("Pages 10–20 are missing — see v2.3.1!") == (
        "Pages 10–20 are missing — see v2.3.1!"
    )
    assert normalize_text("…") == "…"
    assert normalize_text("今天update到v2.3.1了") == "今天 update 到 v2.3.1 了"


def test_tokens_set_aside_inside_others_come_back() -> None:
    # upstream leaks its placeholder here ("#话题１２___PROT0___"); we put the URL back
    leaks = [c for c in CASES if "upstream_raw" in c]
    assert leaks, "the data should hold the cases where upstream leaks a placeholder"
    for case in leaks:
        assert "___PROT" in case["upstream_raw"]
        assert "___PROT" not in normalize_text(case["input"])
