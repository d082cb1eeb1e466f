"""Long text spoken whole, in one voice (#38): the split (delay/chunking.py), the driver
(delay/speech.py) through `synth` and a real `serve`, on builtin:tiny (random weights: every chunk
runs to its budget, so budgets are kept small)."""

from __future__ import annotations

import base64
import json
import random
import re
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from conftest import TINY_SYNTH_YAML as BASE
from conftest import write_yaml
from test_serve import start_serve
from typer.testing import CliRunner

from moss_gguf_cli.cli.app import app
from moss_gguf_cli.delay import SynthConfig, Synthesizer, plan_text
from moss_gguf_cli.delay.chunking import (
    EN_FRAMES_PER_CHAR,
    ZH_FRAMES_PER_CHAR,
    ChunkSettings,
    estimate_frames,
    split_text,
    step_budget,
)
from moss_gguf_cli.delay.engine import EngineSettings
from moss_gguf_cli.delay.normalize import normalize_text
from moss_gguf_cli.delay.pattern import undo_delay
from moss_gguf_cli.delay.speech import FADE_SAMPLES, PAUSE_FRAMES, VOICE_FRAMES, Joiner
from moss_gguf_cli.tts.codec import FRAME_SAMPLES

EN = (
    "The lighthouse keeper climbed the stairs at dusk, as he had done for forty years. "
    "He checked the lamp, wiped the glass and wrote the time in his log: 18:45, calm sea. "
    "Ships passed far out, their lights small and steady; none of them knew his name. "
    "See https://example.com/log.v2.html for the rest, or write to keeper@example.org. "
    "[pause 1.5s] In the morning he walked down to the harbour, bought bread for 3.50 and "
    "talked with the fishermen about the weather, the nets and the price of diesel, which "
    "had gone up again. Then he climbed back, slept a few hours, and waited for the dark."
)
ZH = (
    "灯塔看守人在黄昏时爬上楼梯，四十年来一直如此。他检查灯，擦拭玻璃，在日志里写下时间。"
    "远处有船经过，灯光微小而稳定；没有人知道他的名字。早上他走到港口，买了面包，和渔民"
    "聊天气、渔网和柴油的价格，价格又涨了。然后他爬回去，睡了几个小时，等待黑夜。"
)
WHOLE = re.compile(r"https?://\S+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+|\[pause [\d.]+s\]|\d+(?:[.:]\d+)+")


# ---------------------------------------------------------------- the split


def _joined(pieces) -> str:
    return "".join(p.text + p.gap for p in pieces)


@pytest.mark.parametrize("text", [EN, ZH, EN + " " + ZH])
def test_chunks_join_back_and_break_where_a_speaker_breathes(text):
    normalized = normalize_text(text)
    settings = ChunkSettings(target_frames=60, first_frames=45)
    pieces = split_text(normalized, settings)
    assert len(pieces) >= 3 and _joined(pieces) == normalized
    spans = [m.span() for m in WHOLE.finditer(normalized)]
    pos = 0
    for p in pieces[:-1]:
        pos += len(p.text)
        assert not any(a < pos < b for a, b in spans), (p.text[-20:], "cut a whole span")
        assert p.text[-1] in ".!?;:,。！？；，、" or p.gap, p.text[-20:]  # a mark, or a space
        pos += len(p.gap)
    for p in pieces:  # none much over the target (the first: its own)
        assert p.frames <= settings.target_frames + 1e-9


def test_sentence_ends_win_over_clauses_and_words():
    text = normalize_text(EN)
    pieces = split_text(text, ChunkSettings())
    # every chunk of this prose ends at a sentence end (the target leaves room for one)
    assert len(pieces) >= 3
    assert all(p.text[-1] in ".!?;" for p in pieces), [p.text[-15:] for p in pieces]
    # a sentence longer than the target: at a clause mark, not inside a word
    pieces = split_text(text, ChunkSettings(target_frames=120, first_frames=120))
    assert all(p.text[-1] in ".!?;," for p in pieces), [p.text[-15:] for p in pieces]


def test_estimate_is_upstreams_rate():
    assert estimate_frames("abcd") == pytest.approx(4 * EN_FRAMES_PER_CHAR)
    assert estimate_frames("你好") == pytest.approx(2 * ZH_FRAMES_PER_CHAR)
    assert step_budget(100.0, ChunkSettings(), 32) == 200 + 33  # twice the estimate
    assert step_budget(10.0, ChunkSettings(), 32) == 50 + 33  # at least 40 frames more


def test_fuzzed_text_always_joins_back():
    rng = random.Random(38)
    alphabet = list("abc xyz,.!?;:。，！？、12.3 \n") + ["你", "好", "[S1]", "[pause 0.5s]",
                                                      "http://a.b/c", "v2.3.1"]  # fmt: skip
    deadline = time.monotonic() + 3
    cases = 0
    while cases < 200 and time.monotonic() < deadline:
        raw = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 400)))
        text = normalize_text(raw)
        if not text:
            continue
        target = rng.uniform(3, 80)
        pieces = split_text(text, ChunkSettings(target_frames=target, first_frames=target))
        assert _joined(pieces) == text
        assert all(p.text for p in pieces)
        cases += 1
    assert cases >= 20


def test_joins_fade_and_pause_without_a_click():
    out: list[np.ndarray] = []
    joiner = Joiner(lambda audio, _i: out.append(audio))
    ones = np.ones(3000, dtype=np.float32)
    joiner.push(ones)
    joiner.end_chunk(join=True)
    joiner.push(ones, hold=False)
    joiner.end_chunk(join=False)
    wav = np.concatenate(out)
    assert wav.size == 2 * 3000 + PAUSE_FRAMES * FRAME_SAMPLES
    pause = wav[3000 : 3000 + PAUSE_FRAMES * FRAME_SAMPLES]
    assert not pause.any()
    assert np.abs(np.diff(wav)).max() < 0.01  # no step anywhere: faded out and in
    assert wav[3000 - FADE_SAMPLES - 1] == 1 and wav[-1] == 1


# ---------------------------------------------------------------- synth on builtin:tiny


@pytest.fixture(scope="module")
def config(tiny_weights: Path) -> SynthConfig:
    return SynthConfig.from_yaml(tiny_weights / "moss-tts.yaml")


def _voice_block(prompt, info) -> np.ndarray:
    rows = prompt.rows
    slots = rows[:, 0] == info.audio_user_slot_token_id
    return rows[slots, 1:]


def test_long_text_is_spoken_whole_in_one_voice(config):
    with Synthesizer(config, max_batch=3) as tts:
        result = tts.synthesize(EN, seed=5, max_new_tokens=40)
        info = tts.info
    plan = result.plan
    assert len(result.chunks) >= 3 and plan.voice == "chunk 1"
    assert _joined(plan.chunks) == normalize_text(EN)
    # every chunk ran (to the cap: the random model never ends) and is reported
    assert all(c.tries == 1 and c.steps == 40 and c.ended == "cut" for c in result.chunks)
    first = result.chunks[0]
    assert _voice_block(first.prompt, info).size == 0  # chunk 1: the model's own voice
    voice = first.codes[:VOICE_FRAMES]
    for c in result.chunks[1:]:  # the rest: chunk 1's codes, token id for token id
        assert np.array_equal(undo_delay(_voice_block(c.prompt, info), info.audio_pad_code),
                              voice)  # fmt: skip
    pause = PAUSE_FRAMES * FRAME_SAMPLES
    frames = sum(c.frames for c in result.chunks)
    assert result.waveform.size == frames * FRAME_SAMPLES + pause * (len(result.chunks) - 1)


@pytest.mark.parametrize("weights", ["f16", "q4"])
def test_chunks_after_the_first_prefill_their_shared_beginning_once(weights, tiny_weights,
                                                                    request):  # fmt: skip
    """Chunks 2..n differ only in their text: the rows before it (the voice they carry) are
    prefilled once and restored for the others (llama.cpp's own sequence state), 1-wide and
    batched; the rows made are the same as with every prompt prefilled whole."""
    folder = tiny_weights if weights == "f16" else request.getfixturevalue("q4_weights")
    config = SynthConfig.from_yaml(folder / "moss-tts.yaml")
    made = {}
    for share in (True, False):
        for width in (1, 3):
            settings = EngineSettings(shared_prefix=share)
            with Synthesizer(config, max_batch=width, settings=settings) as tts:
                result = tts.synthesize(EN, seed=5, max_new_tokens=40)
            made[share, width] = result.rows
            prompts = [c.prompt for c in result.chunks]
            assert len(prompts) >= 3
            shared = prompts[1].shared_rows
            # the text is what differs: all but chunk 1 (no voice) agree up to it
            assert shared > prompts[1].reference_frames
            assert all(p.shared_rows == shared and np.array_equal(p.rows[:shared],
                       prompts[1].rows[:shared]) for p in prompts[2:])  # fmt: skip
            assert not np.array_equal(prompts[1].rows[: shared + 1], prompts[2].rows[: shared + 1])
            # chunk 2 prefilled them, each later chunk restored them
            assert result.profile.prefix_rows == (shared * (len(prompts) - 2) if share else 0)
    for width in (1, 3):
        assert np.array_equal(made[True, width], made[False, width])


def test_the_shared_beginning_ends_where_the_text_begins(config):
    with Synthesizer(config) as tts:
        codes = np.zeros((7, tts.info.n_vq), dtype=np.int64)
        a, b = (tts.prepare(t, reference_codes=codes, language="en").prompt
                for t in ("Hello there.", "Hello, you."))  # fmt: skip
        head = tts.tokenizer.decode(a.rows[: a.shared_rows, 0].tolist(), skip_special_tokens=False)
    assert a.shared_rows == b.shared_rows and head.endswith("- Text:\n")
    assert np.array_equal(a.rows[: a.shared_rows], b.rows[: b.shared_rows])


def test_chinese_with_a_reference_carries_it_in_every_chunk(config, reference_wav):
    with Synthesizer(config, max_batch=4) as tts:
        codes = tts.encode_reference(reference_wav)
        result = tts.synthesize(ZH * 2, reference=reference_wav, seed=2, max_new_tokens=36)
        info = tts.info
    assert len(result.chunks) >= 3 and result.plan.voice == "reference"
    assert _joined(result.plan.chunks) == normalize_text(ZH * 2)
    for c in result.chunks:
        assert np.array_equal(undo_delay(_voice_block(c.prompt, info), info.audio_pad_code),
                              codes)  # fmt: skip


def test_stream_of_chunks_is_the_whole_in_order(config):
    with Synthesizer(config, max_batch=3) as tts:
        whole = tts.synthesize(EN, seed=5, max_new_tokens=40)
        pieces = list(tts.stream(EN, seed=5, max_new_tokens=40))
    streamed = np.concatenate(pieces)
    assert streamed.size == whole.waveform.size
    # one gain held from the first window vs the whole's: the same shape, scaled
    scale = np.dot(streamed, whole.waveform) / np.dot(whole.waveform, whole.waveform)
    assert np.allclose(streamed, scale * whole.waveform, atol=2e-3)


def _synth(weights: Path, *args: str):
    return CliRunner().invoke(app, ["synth", "--config", str(weights / "moss-tts.yaml"), *args])


def test_dry_run_json_shows_what_the_model_gets(tiny_weights, tmp_path):
    src = tmp_path / "zh.txt"
    src.write_text(ZH + "\n\n## 第二章\n" + ZH, encoding="utf-8")
    result = _synth(tiny_weights, "--text-file", str(src), "--dry-run", "--json",
                    "--language", "Chinese")  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    normalized = normalize_text(src.read_text(encoding="utf-8"))
    assert plan["text"] == normalized and len(plan["chunks"]) >= 4
    assert "".join(c["text"] for c in plan["chunks"]) == normalized  # Chinese: no gaps
    assert {c["language"] for c in plan["chunks"]} == {"Chinese"}
    assert all(c["budget_steps"] <= BASE["max_new_tokens"] for c in plan["chunks"])
    table = _synth(tiny_weights, "--text-file", str(src), "--dry-run")
    assert table.exit_code == 0 and "voice: chunk 1" in table.stdout
    bad = _synth(tiny_weights, "--text", "Hi", "--json")
    assert bad.exit_code == 2 and "--json goes with --dry-run" in bad.output


def test_synth_cli_profiles_each_chunk_and_warns_of_a_runaway(tiny_weights, tmp_path):
    out = tmp_path / "long.wav"
    result = _synth(tiny_weights, "--text", EN, "-o", str(out), "--seed", "1", "--profile",
                    "--max-new-tokens", "34", "--max-batch", "2",
                    "--runaway-retries", "0")  # fmt: skip
    assert result.exit_code == 0, result.output
    n = len(plan_text(SynthConfig.from_yaml(tiny_weights / "moss-tts.yaml"), EN).chunks)
    assert all(f"chunk {i}" in result.stdout for i in range(1, n + 1))
    assert f"chunk {n} of {n} was cut at 34 steps" in result.stderr
    assert sf.info(str(out)).frames > 0
    # its own budget (no cap): the random model never ends, so it runs away, twice
    short = tmp_path / "short.wav"
    result = _synth(tiny_weights, "--text", "Hi.", "-o", str(short), "--seed", "1",
                    "--max-new-tokens", "100000", "--profile")  # fmt: skip
    assert result.exit_code == 0, result.output
    budget = step_budget(estimate_frames("Hi."), ChunkSettings(), 32)
    assert f"chunk 1 of 1 reached its budget of {budget} steps without ending (twice)" \
        in result.stderr  # fmt: skip


def test_n_ctx_too_small_for_a_chunk_splits_it_further(tiny_weights, tmp_path):
    path = write_yaml(tiny_weights / "ctx-230.yaml", **{**BASE, "n_ctx": 230})
    plan = plan_text(SynthConfig.from_yaml(path), EN, max_new_tokens=40)
    wide = plan_text(SynthConfig.from_yaml(tiny_weights / "moss-tts.yaml"), EN,
                     max_new_tokens=40)  # fmt: skip
    assert len(plan.chunks) > len(wide.chunks)
    assert max(c.prompt_rows for c in wide.chunks) + 40 > 230  # it would not fit
    assert all(c.prompt_rows + c.budget <= 230 and c.budget == 40 for c in plan.chunks)
    assert _joined(plan.chunks) == normalize_text(EN)


# ---------------------------------------------------------------- serve


@pytest.fixture(scope="module")
def server(tiny_weights: Path, tmp_path_factory):
    log = tmp_path_factory.mktemp("log") / "s.log"
    srv = start_serve(tiny_weights / "moss-tts.yaml", log, "--max-batch", "3",
                      "--runaway-retries", "1",
                      "--voices", str(tmp_path_factory.mktemp("voices")))  # fmt: skip
    yield srv
    if srv.proc.poll() is None:
        srv.proc.kill()
        srv.proc.wait()


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    found = re.search(rf"^{name} ([\d.e+]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_serve_requests_that_begin_alike_prefill_their_beginning_once(server):
    """Requests with the same voice and fields begin alike: the server prefills that
    beginning once and restores it after (/metrics counts the rows); a request then gives
    the same bytes whether its beginning was computed or restored."""
    body = {"model": "moss-tts", "voice": "default", "response_format": "pcm", "seed": 4,
            "text_temperature": 0, "audio_temperature": 0, "max_new_tokens": 36}  # fmt: skip
    name = 'moss_gguf_prompt_rows_total{prefill="%s"}'
    replies = []
    for text in ("The harbour was quiet.", "The nets were dry.", "The harbour was quiet."):
        before = {k: _metric(server.url, re.escape(name % k)) for k in ("computed", "restored")}
        reply = httpx.post(f"{server.url}/v1/audio/speech", json={**body, "input": text},
                           timeout=600)  # fmt: skip
        assert reply.status_code == 200, reply.text
        replies.append(reply.content)
        after = {k: _metric(server.url, re.escape(name % k)) for k in ("computed", "restored")}
        computed = after["computed"] - before["computed"]
        restored = after["restored"] - before["restored"]
        assert computed > 0
    assert restored > computed  # the beginning (system, fields, "- Text:") outweighs the text
    assert replies[0] == replies[2] and len(replies[0]) > 0


def test_serve_speaks_a_long_input_in_chunks_in_order(server):
    body = {"model": "moss-tts", "input": EN, "voice": "default", "response_format": "pcm",
            "stream_format": "sse", "seed": 3, "max_new_tokens": 36}  # fmt: skip
    events = []
    with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=600) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    deltas, done = events[:-1], events[-1]
    n = done["chunks"]
    assert n >= 3 and done["type"] == "speech.audio.done" and done["cut"] == list(range(1, n + 1))
    order = [e["chunk"] for e in deltas]
    assert order == sorted(order) and set(order) == set(range(1, n + 1))
    assert {e["chunks"] for e in deltas} == {n}
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    whole = httpx.post(f"{server.url}/v1/audio/speech", timeout=600,
                       json={k: v for k, v in body.items() if k != "stream_format"})  # fmt: skip
    assert whole.status_code == 200 and len(whole.content) == len(audio)


def test_serve_counts_a_runaway(server):
    before = _metric(server.url, "moss_gguf_runaway_chunks_total")
    body = {"model": "moss-tts", "input": "Hi.", "voice": "default", "response_format": "pcm",
            "stream_format": "sse", "seed": 1, "max_new_tokens": 100000}  # fmt: skip
    with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=600) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["runaways"] == [1] and events[-1]["chunks"] == 1
    assert _metric(server.url, "moss_gguf_runaway_chunks_total") == before + 1


def test_serve_refuses_negative_retries_in_one_line(tiny_weights):
    result = CliRunner().invoke(app, ["serve", "--config", str(tiny_weights / "moss-tts.yaml"),
                                      "--runaway-retries", "-1"])  # fmt: skip
    assert result.exit_code == 2
    assert "--runaway-retries must be 0 or more, got -1" in result.output
