"""The MOSS-TTS-Nano family (docs/ARCHITECTURE.md §6, "Model families"): everything that is
Nano's alone lives here, and nothing of the delay family does. config.py: NanoConfig, every
fact read from config.json (never upstream's class defaults). checkpoint.py: open_nano, a Nano
folder's config and weights (model.safetensors where present, else pytorch_model.bin read by
source/torch_pickle) checked tensor by tensor. global_gguf.py: the global transformer as an F32
starcoder2 GGUF (q/k rows permuted per head so llama.cpp's NEOX rope is Nano's interleaved
rope). layout.py: the Nano folder's names, arrays and synth config; folder.py: the folder
written (the F32 GGUF quantized by llama.cpp); tiny.py: builtin:tiny-nano, made without torch.
Its engine joins as issues #52 and #48 land it; its verify rows are verify/nano.py.

May import: tts/, quantize/, source/, gguf/, disk/, native/ and the top level (errors,
progress, report, hold_points) (rank 5); never verify/, doctor/, pipeline/, serve/ or cli/,
which import it.
"""
