"""The MOSS-TTS-Nano family (docs/ARCHITECTURE.md §6, "Model families"): everything that is
Nano's alone lives here, and nothing of the delay family does: its config, its tensors, its
GGUF plan, later its engine and checks, as issues #47, #52 and #48 land them.

May import: tts/, quantize/, source/, gguf/, disk/, native/ and the top level (errors,
progress, report, hold_points) (rank 5); never verify/, doctor/, pipeline/, serve/ or cli/,
which import it.
"""
