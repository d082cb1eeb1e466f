"""`all` and its steps: the run (run: resolve, the steps in order, finish), the steps as
plan/run pairs and the run's context (steps), and the step bodies: extract, convert, layout;
conversion recipes (`all --config`, recipes); the first-class moss-tts-delay folder
(first_class: `convert/all --format moss-tts-delay`; from_first_class: `all --model` on one);
MOSS-TTS-Nano's folder (nano: which inputs are Nano, written by nano/ and verified).

May import: verify/, doctor/ and every room below them (nano/, tts/, quantize/, source/, gguf/,
disk/, native/, the top level) (rank 7); never serve/ (beside it) or cli/.
"""
