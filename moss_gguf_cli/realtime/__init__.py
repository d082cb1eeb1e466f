"""The MOSS-TTS-Realtime family (docs/ARCHITECTURE.md §6, "Model families"; docs/realtime.md):
everything that is Realtime's alone lives here, and nothing of the delay family does. So far
(#63, step 1) it reads and checks a checkpoint; it converts and speaks in the steps after, and
is registered in families/ when it does. config.py: RealtimeConfig, every fact read from
config.json (the Qwen3 backbone's `language_config`, the depth transformer's `local_config`, the
codebooks and their special rows, the text pad ids), each range-checked, never upstream's class
defaults. checkpoint.py: open_realtime, a Realtime folder's safetensors (one file or an index
and shards) checked tensor by tensor against the config: every name upstream's model holds,
its shape, a float dtype, no stranger, counts that agree. tiny.py: builtin:tiny-realtime, made
without torch in the release's layout (real names, bf16, a real Qwen3 tokenizer).

May import: the stage cores (pipeline/, serve/: rank 6), verify/ and doctor/ (5), tts/,
quantize/ (4), source/, graphs/, gguf/, disk/, native/ and the top level (rank 7, a family's
room); only the registry (families/) and cli/ import it.
"""
