"""What every family speaks with, below the family rooms: sampling (the rule every family's
sampler follows, the request's sampling keys and their ranges), backbone (a llama.cpp model
run for hidden states or logits), codec (the ONNX audio tokenizer runner, resampling),
streaming (windowed decoding while it speaks, the WAV/PCM writers), lora (an adapter applied
at run time), defaults (the synth settings a delay folder starts from; the served batch
widths), spoken (what `synth` returns for the CLI to render, the refusal of options a family
does not take). A family's own runtime lives in its room (delay/, nano/).

May import: source/, gguf/, disk/, native/ and the top level (errors, progress, report,
hold_points) (rank 4); never quantize/ or graphs/ (beside it), nor any room above.
"""
