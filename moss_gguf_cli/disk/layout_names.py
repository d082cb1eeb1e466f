"""The names of the folders and files moss-gguf writes (docs/ARCHITECTURE.md §3).

`extract` writes BACKBONE_DIR, EMBEDDING_DIR, LM_HEAD_DIR and META_NAME; `layout` (and the
pre-converted MOSS-TTS-GGUF layout) the weights folder: the tables, TOKENIZER_DIR,
AUDIO_TOKENIZER_DIR, CONFIG_NAME and MANIFEST_NAME beside the GGUF.
"""

BACKBONE_DIR = "qwen3_backbone"
EMBEDDING_DIR = "embeddings"
LM_HEAD_DIR = "lm_heads"
META_NAME = "extraction_meta.json"
TOKENIZER_DIR = "tokenizer"
AUDIO_TOKENIZER_DIR = "audio_tokenizer"
CONFIG_NAME = "moss-tts.yaml"
MANIFEST_NAME = "manifest.json"
# the synth config's key naming the family whose folder it is (none: the delay family, whose
# folders were made before families said so); each family names itself (families/)
FAMILY_KEY = "family"
