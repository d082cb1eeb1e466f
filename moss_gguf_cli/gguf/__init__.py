"""GGUF format code: read a GGUF's header (read), plan and write the f16/bf16 backbone GGUF
(write: metadata, tensor order; vocab: the tokenizer keys; stream: tensor data read, rounded and
written in chunks), importance matrices (imatrix), Qwen3's tensor-name table (qwen3_names),
llama.cpp's file types (file_types), and the first-class moss-tts-delay GGUF of OpenMOSS's
llama.cpp fork (first_class: its names, keys and header; first_class_read: its header check
and reading it back).

May import: disk/, native/ and the top level (errors, progress, report, hold_points) (rank 2);
never source/ or any room above.
"""
