"""`synth` for a delay family's folder (MOSS-TTS, MOSS-TTSD, MOSS-VoiceGenerator,
MOSS-SoundEffect): the command's options checked and applied to the folder's YAML, the text
spoken (or, --dry-run, planned), and what happened said as tts/spoken's Spoken or Planned for
the CLI to render."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..doctor import preflight
from ..errors import UsageError
from ..progress import ProgressReporter
from ..quantize.engines import Engine
from ..tts.lora import LoraSpec
from ..tts.spoken import (
    Planned,
    Spoken,
    Table,
    check_codes_out,
    read_text,
    refuse_options,
    sink_of,
    write_codes,
)
from . import (
    Speaker,
    SynthConfig,
    SynthProfile,
    SynthResult,
    plan_text,
    synth_stream,
    synth_to_wav,
)
from .floor import StepFloor, step_floor
from .language import language_name
from .speech import SpeechPlan

# the options another family takes and this one does not
REFUSED = {"--min-new-tokens": "min_new_tokens"}


def synth_delay(config: Path, o: dict[str, Any], progress: ProgressReporter) -> Spoken | Planned:
    """Speak with the folder whose synth config is CONFIG, the command's options O; the
    options that need no file are checked before the YAML is read."""
    refuse_options(o, REFUSED, "MOSS-TTS delay-model",
                   "it is MOSS-TTS-Nano's: the delay models stop on their own <|im_end|>")
    language_name(o["language"])  # a wrong language is one line now, not after minutes
    settings = _settings(config, o)
    described = o["ambient_sound"] is not None or o["sound_event"] is not None
    words = read_text(o["text"], o["text_file"], may_be_absent=described)
    voice, speakers = voices(o["reference"] or [], o["reference_text"] or [])
    if o["as_json"] and not o["dry_run"]:
        raise UsageError("--json goes with --dry-run")
    if o["max_batch"] < 1 or o["runaway_retries"] < 0:
        raise UsageError("--max-batch must be 1 or more and --runaway-retries 0 or more")
    if o["dry_run"]:
        return planned(plan_text(settings, words, voice, instruction=o["instruction"],
                                 tokens=o["tokens"], quality=o["quality"],
                                 language=o["language"], sound_event=o["sound_event"],
                                 ambient_sound=o["ambient_sound"],
                                 normalize=o["normalize"]), o["as_json"])  # fmt: skip
    # the llama.cpp runtime probe (cached once per build) catches a crashing build up front
    preflight(needs_quantize=False, needs_runtime=True, output=o["output"], needed_bytes=None,
              llama_cpp=None, engine=Engine.AUTO)  # fmt: skip
    options = dict(reference=voice, instruction=o["instruction"], tokens=o["tokens"],
                   quality=o["quality"], language=o["language"], seed=o["seed"],
                   sound_event=o["sound_event"], ambient_sound=o["ambient_sound"],
                   normalize=o["normalize"], speakers=speakers, max_batch=o["max_batch"],
                   retries=o["runaway_retries"])  # fmt: skip
    check_codes_out(o.get("codes_out"))
    sink, fmt = sink_of(o["output"], o["stream"])
    if fmt is None:
        result = synth_to_wav(settings, sink, words, progress=progress, **options)
    else:
        result = synth_stream(settings, sink, words, fmt, progress=progress, **options)
    if o.get("codes_out") is not None and result.codes:  # every segment's frames, undelayed
        write_codes(o["codes_out"], np.concatenate(result.codes))
    p = result.profile
    chunks = f" ({len(result.chunks)} chunks)" if len(result.chunks) > 1 else ""
    # measured after the run, in the same process: the floor's bandwidth is now's
    profile = profile_table(p, step_floor(settings), result) if settings.profile else None
    return Spoken(result.output, f"{p.frames} frames, {p.audio_s:.2f} s of audio in "
                  f"{p.total_s:.1f} s{chunks}", cut_warnings(result), profile)  # fmt: skip


# the options that override the synth YAML's key of the same name (or of the name given)
OVERRIDES = {"max_new_tokens": "max_new_tokens", "text_temperature": "text_temperature",
             "text_top_p": "text_top_p", "text_top_k": "text_top_k",
             "audio_temperature": "audio_temperature", "audio_top_p": "audio_top_p",
             "audio_top_k": "audio_top_k", "audio_repetition_penalty": "audio_repetition_penalty",
             "heads_backend": "heads_backend", "n_gpu_layers": "n_gpu_layers", "n_ctx": "n_ctx",
             "flash_attn": "flash_attn", "threads": "n_threads"}  # fmt: skip


def _settings(config: Path, o: dict[str, Any]) -> SynthConfig:
    settings = SynthConfig.from_yaml(config).override(
        **{key: o[name] for name, key in OVERRIDES.items()},
        low_memory=o["low_memory"] or None,  # a flag: off means the YAML's
        profile=o["profile"] or None,
    )
    specs = [LoraSpec.parse(t) for t in o["lora"] or []]
    return replace(settings, lora=tuple(replace(s, name=str(i)) for i, s in enumerate(specs)))


def voices(references: list[Path], texts: list[str]) -> tuple[Path | None, list[Speaker]]:
    """One voice to clone, or (with --reference-text) a clip and transcript per speaker."""
    if not texts:
        if len(references) > 1:
            raise UsageError(
                "several --reference clips need a --reference-text each (a MOSS-TTSD dialogue: "
                "the clip and what it says, once per speaker, in order)"
            )
        return (references[0] if references else None), []
    if len(texts) != len(references):
        raise UsageError(
            f"{len(references)} --reference and {len(texts)} --reference-text: give them in "
            "pairs, once per speaker, in order ([S1], [S2], …)"
        )
    return None, [Speaker(text=t, reference=r) for r, t in zip(references, texts, strict=True)]


def planned(plan: SpeechPlan, as_json: bool = False) -> Planned:
    rows = []
    for c in plan.chunks:
        short = c.text if len(c.text) <= 60 else c.text[:28] + " … " + c.text[-28:]
        rows.append([str(c.index + 1), str(len(c.text)), f"{c.frames / 12.5:.1f}",
                     f"{c.budget}{' (capped)' if c.capped else ''}", str(c.prompt_rows),
                     c.language or "-", short])  # fmt: skip
    columns = ["chunk", "chars", "est. s", "budget", "prompt rows", "language", "text"]
    table = Table(f"{len(plan.chunks)} chunk(s), voice: {plan.voice}", columns, rows,
                  left=("language", "text"))  # fmt: skip
    return Planned(table, plan.to_dict(), as_json)


def cut_warnings(result: SynthResult) -> list[str]:
    """Nothing cut silently: a chunk that ran away (twice) or was capped."""
    n, said = len(result.chunks), []
    for c in result.chunks:
        if c.ended == "runaway":
            tries = "twice" if c.tries > 1 else "once"
            said.append(f"chunk {c.index + 1} of {n} reached its budget of {c.budget} steps "
                        f"without ending ({tries}); its audio may be cut or hold noise (try "
                        "another --seed)")  # fmt: skip
        elif c.ended == "cut":
            said.append(f"chunk {c.index + 1} of {n} was cut at {c.steps} steps by "
                        "--max-new-tokens / n_ctx before it ended (raise them)")  # fmt: skip
    return said


def profile_table(p: SynthProfile, floor: StepFloor, result: SynthResult | None = None) -> Table:
    rows = [
        ("prompt rows", f"{p.prompt_rows}"),
        ("prefill", f"{p.prefill_s:.3f} s ({p.prefill_tokens_per_s:.0f} tokens/s)"),
        ("steps", f"{p.steps} ({p.steps_per_s:.1f} steps/s)"),
        ("  backbone / step", f"{p.per_step_ms('backbone'):.2f} ms"),
        (f"  heads ({p.heads_backend}) / step", f"{p.per_step_ms('heads'):.2f} ms"),
        ("  sampling / step", f"{p.per_step_ms('sampling'):.2f} ms"),
        ("  embeddings / step", f"{p.per_step_ms('embed'):.2f} ms"),
        ("floor / step", f"{floor.ms:.2f} ms ({floor.step_bytes / 1e6:.0f} MB at "
         f"{floor.bandwidth / 1e9:.1f} GB/s; docs/memory-floor.md)"),
        ("floor / actual", f"{floor.ms * p.steps_per_s / 1000:.2f}"),
        ("audio decode", f"{p.decode_s:.3f} s"),
        ("audio", f"{p.frames} frames, {p.audio_s:.2f} s, {p.segments} segment(s)"),
        ("ended by", "<|im_end|>" if p.stopped else "max-new-tokens / n_ctx"),
        ("real-time factor", f"{p.real_time_factor:.2f}"),
    ]
    for c in result.chunks if result is not None and len(result.chunks) > 1 else []:
        retried = ", retried" if c.tries > 1 else ""
        rows.append((f"chunk {c.index + 1}", f"{c.chars} chars, {c.frames} frames, {c.steps}/"
                     f"{c.budget} steps, {c.ended}{retried}"))  # fmt: skip
    return Table("synth profile", ["measure", "value"], [list(r) for r in rows])
