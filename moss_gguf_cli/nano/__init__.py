"""The MOSS-TTS-Nano family (docs/ARCHITECTURE.md §6, "Model families"): everything that is
Nano's alone lives here, and nothing of the delay family does. config.py: NanoConfig, every
fact read from config.json (never upstream's class defaults). checkpoint.py: open_nano, a Nano
folder's config and weights (model.safetensors where present, else pytorch_model.bin read by
source/torch_pickle) checked tensor by tensor. global_gguf.py: the global transformer as an F32
starcoder2 GGUF (q/k rows permuted per head so llama.cpp's NEOX rope is Nano's interleaved
rope). layout.py: the Nano folder's names, arrays and synth config; folder.py: the folder
written (the F32 GGUF quantized by llama.cpp); tiny.py: builtin:tiny-nano, made without torch.
codec_folder.py: the MOSS-Audio-Tokenizer-Nano ONNX release (its meta, the three graphs'
names checked, decode_step's state; its Hub id and download patterns); tiny_codec.py: a tiny
codec in that layout whose stream state is real. engine.py and its parts speak. convert.py is
`all` for Nano (which inputs are Nano, the folder written and verified); verify.py and
verify_deep.py its verify rows; synth.py `synth` (its options, its writers); serving.py its
stepper in the one serve core, its request builder and loader.

May import: the stage cores (pipeline/, serve/: rank 6), verify/ and doctor/ (5), tts/,
quantize/ (4), source/, gguf/, disk/, native/ and the top level (rank 7, a family's room);
only the registry (families/) imports it.
"""
