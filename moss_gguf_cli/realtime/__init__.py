"""The MOSS-TTS-Realtime family (docs/ARCHITECTURE.md §6, "Model families"; docs/realtime.md):
everything that is Realtime's alone lives here, and nothing of the delay family does.

config.py (RealtimeConfig: every fact read from config.json, range-checked) and checkpoint.py
(open_realtime: the name plan checked tensor by tensor); tiny.py (builtin:tiny-realtime,
written without torch); backbone_gguf.py (the stock qwen3 backbone GGUF) and depth_gguf.py
(the depth GGUF of our own arch); layout.py, folder.py, convert.py (`all`); verify.py and
verify_deep.py; prompt.py (upstream's prompt rows, the text fed a frame), depth.py (the depth
transformer, heads and sampling as one ggml graph a frame), engine.py (the frame loop),
synth.py (`synth`), serving.py (`serve`: its stepper and request builders), feed.py (text
that grows while it is spoken: the stream-input route, stdin).

May import: the stage cores (pipeline/, serve/: rank 6), verify/ and doctor/ (5), tts/,
quantize/ (4), source/, graphs/, gguf/, disk/, native/ and the top level (rank 7, a family's
room); only the registry (families/) and cli/ import it.
"""
