"""What `serve` is asked to do (ServeSettings) and the rule for where it may listen."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..tts.defaults import WIDTHS
from ..tts.lora import LoraSpec

# OpenAI's limit on `input`; longer text is refused with 413 before it is queued
MAX_INPUT_CHARS = 4096
# `instructions` (OpenAI states no limit): as long as `input`
MAX_INSTRUCTIONS_CHARS = 4096
# model and voice names (a voice name is 64 characters at most; this bounds what is echoed)
MAX_NAME_CHARS = 256
# a reference clip larger than this is refused with 413 (minutes of 24 kHz audio)
MAX_UPLOAD_BYTES = 25 * 1024 * 1024
# a clip is probed from its header before it is decoded: its rate, length and channels
CLIP_RATES = (8_000, 192_000)
MAX_CLIP_SECONDS = 60.0
MAX_CLIP_CHANNELS = 8
# a voice's `text` (what the clip says)
MAX_VOICE_TEXT_CHARS = 4096
# a JSON body larger than this is refused with 413 before it is read: 4,096 characters of
# input and of instructions at 12 bytes each (a JSON escape of a surrogate pair) fit
MAX_BODY_BYTES = 256 * 1024
# a voice upload: the clip plus its form fields
MAX_FORM_BYTES = MAX_UPLOAD_BYTES + 64 * 1024
# OpenAI's voice names: each speaks with the model's own voice (no reference)
OPENAI_VOICES = frozenset(
    "alloy ash ballad coral echo fable onyx nova sage shimmer verse marin cedar".split()
)
DEFAULT_VOICE = "default"
# OpenAI's speech model names: clients send them by default, each means the served model
OPENAI_MODELS = frozenset({"tts-1", "tts-1-hd", "gpt-4o-mini-tts"})
# an --allowed-hosts entry: a DNS name, an IPv4 or a bracketed IPv6 address (no port: any
# port is answered), or '*' alone
ALLOWED_HOST = re.compile(r"\*|\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,252})?")


@dataclass
class ServeSettings:
    config: Path  # the moss-tts.yaml to speak with
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the one chosen is announced)
    api_key: str | None = None
    voices: Path | None = None  # default: voices/ beside the config
    max_queue: int = 16  # requests waiting for a free sequence; more get 429
    max_batch: int = 4  # requests generated together, one KV sequence (n_ctx positions) each
    stall_timeout: float = 300.0  # seconds without a step while requests run: unhealthy
    runaway_retries: int = 1  # a chunk that reaches its step budget is run again this often
    # the batch's width policy (delay/engine.py EngineSettings): "served" (default) as wide as
    # the requests being served, so a lone one runs as fast as on a 1-wide server;
    # "identical" the same greedy audio alone or batched; "fixed" always max_batch wide
    batch_width: str = "served"
    # Host names answered besides the loopback ones and --host (origins.HostPolicy); "*": any
    allowed_hosts: tuple[str, ...] = ()
    max_voices: int = 100  # stored voices; registering one more is refused (409)
    # LoRA adapters loaded for requests to name (delay/adapters.py); off until one does
    lora: tuple[LoraSpec, ...] = ()

    @property
    def voices_dir(self) -> Path:
        return self.voices if self.voices is not None else self.config.parent / "voices"

    def check(self) -> None:
        """Refuse settings that cannot work or that expose the model to a network unguarded."""
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--port must be 0..65535, got {self.port}")
        if self.max_batch < 1:
            raise UsageError(f"--max-batch must be 1 or more, got {self.max_batch}")
        if self.runaway_retries < 0:
            raise UsageError(f"--runaway-retries must be 0 or more, got {self.runaway_retries}")
        if self.batch_width not in WIDTHS:
            raise UsageError(f"--batch-width must be one of {', '.join(WIDTHS)}, "
                             f"not {self.batch_width!r}")  # fmt: skip
        if self.max_queue < 0:
            raise UsageError(f"--max-queue must be 0 or more, got {self.max_queue}")
        if self.max_voices < 0:
            raise UsageError(f"--max-voices must be 0 or more, got {self.max_voices}")
        for name in self.allowed_hosts:
            if not ALLOWED_HOST.fullmatch(name):
                raise UsageError(f"--allowed-hosts: {name!r} is not a host name",
                                 hint="give names or addresses without a port or scheme, "
                                 "comma-separated (example.lan,192.168.1.20), or '*'")  # fmt: skip
        if self.api_key is not None and not self.api_key.strip():
            raise UsageError("--api-key is empty", hint="pass the key clients will send")
        if self.api_key is not None and self.api_key != self.api_key.strip():
            # HTTP strips a header's outer whitespace: such a key could never be matched
            raise UsageError("--api-key has spaces or tabs around it; no client could send "
                             "it", hint="pass the key without them")  # fmt: skip
        if not 1 <= self.stall_timeout <= 86400:
            raise UsageError(f"--stall-timeout must be 1..86400 seconds, got "
                             f"{self.stall_timeout:g}")  # fmt: skip
        if not is_loopback(self.host) and not self.api_key:
            raise UsageError(
                f"--host {self.host} accepts connections from other machines",
                hint="pass --api-key KEY (clients send it as 'Authorization: Bearer KEY') "
                "or bind 127.0.0.1",
            )


def is_loopback(host: str) -> bool:
    """Only this machine can connect: localhost or a loopback address."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # another host name: it may resolve to any interface
