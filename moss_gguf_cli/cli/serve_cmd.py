"""`moss-gguf serve`: an OpenAI-compatible speech server for a converted weights folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..doctor import preflight
from ..families import for_config
from ..serve.settings import ServeSettings
from ..tts.lora import LoraSpec
from ._command import command
from ._options import Quiet, Verbose
from ._output import OutputMode, info, setup_logging

EXAMPLES = """
[b]Examples[/b]

  moss-gguf serve --config weights-demo/moss-tts.yaml

  moss-gguf serve --config weights/moss-tts.yaml --port 8080 --voices ~/moss-voices

  moss-gguf serve --config weights/moss-tts.yaml --host 0.0.0.0 --api-key "$KEY" --max-queue 4

  # up to 8 requests generated together in one llama.cpp batch
  moss-gguf serve --config weights/moss-tts.yaml --max-batch 8

  # /health says 503 once running requests made no progress for 60 s
  moss-gguf serve --config weights/moss-tts.yaml --stall-timeout 60

  # the same greedy audio for a request alone or batched (docs/memory-floor.md)
  moss-gguf serve --config weights/moss-tts.yaml --batch-width identical

  curl http://127.0.0.1:8000/v1/audio/speech -H 'Content-Type: application/json' \\
      -d '{"model": "moss-tts", "input": "Hello", "voice": "default", "response_format": "wav"}' \\
      -o hello.wav

  # behind a reverse proxy that forwards Host: tts.example.org
  moss-gguf serve --config weights/moss-tts.yaml --allowed-hosts tts.example.org

Binding anything but 127.0.0.1 / localhost needs --api-key (or $MOSS_GGUF_API_KEY); clients
then send 'Authorization: Bearer KEY' to /v1, as OpenAI clients do (/health and /metrics stay
open). Only the loopback names, --host and --allowed-hosts are answered as Host (DNS
rebinding), and another site's page cannot change state (voices, speech). Limits and ranges:
docs/serve-limits.md. Ctrl+C (or SIGTERM) stops it.
"""


@command(
    "serve",
    help="Serve the model behind a moss-tts.yaml over HTTP with OpenAI's speech API "
    "(/v1/audio/speech, /v1/audio/voices, /v1/models, /health, /metrics). Needs the serve "
    "extra: pip install 'moss-gguf\\[serve]'.",
    epilog=EXAMPLES,
)
def serve_command(
    config: Annotated[Path, typer.Option("--config", "-c", help="The moss-tts.yaml to serve.")],
    host: Annotated[
        str, typer.Option(help="Address to listen on; not loopback needs --api-key.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 = any free one, announced).")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="MOSS_GGUF_API_KEY",
            help="Require 'Authorization: Bearer KEY' on every /v1 request.",
            show_envvar=True,
        ),
    ] = None,
    voices: Annotated[
        Path | None,
        typer.Option(help="Folder of stored voices (default: voices/ beside the config)."),
    ] = None,
    max_queue: Annotated[
        int, typer.Option(help="Requests that may wait for a free batch slot; more get 429.")
    ] = 16,
    max_batch: Annotated[
        int,
        typer.Option(
            help="Requests generated together in one llama.cpp batch (each holds n_ctx "
            "positions of KV cache)."
        ),
    ] = 4,
    stall_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds running requests may go without a generation step before they are "
            "answered with an error and /health reports 503."
        ),
    ] = 300.0,
    runaway_retries: Annotated[
        int,
        typer.Option(help="How often a chunk of the text that reaches its step budget without "
                     "ending is run again with another seed (0: never)."),
    ] = 1,
    batch_width: Annotated[
        str,
        typer.Option(
            help="served: each step as wide as the requests being served (a lone request "
            "runs as fast as on --max-batch 1); identical: the same greedy audio alone or "
            "batched (llama.cpp's weights not repacked); fixed: always --max-batch wide."
        ),
    ] = "served",
    allowed_hosts: Annotated[
        str,
        typer.Option(
            help="Host names answered besides the loopback ones and --host, comma-separated "
            "(a reverse proxy's or LAN name); '*' answers any (no DNS-rebinding check)."
        ),
    ] = "",
    max_voices: Annotated[
        int, typer.Option(help="Voices the store may hold; registering one more gets 409.")
    ] = 100,
    lora: Annotated[
        list[str] | None,
        typer.Option("--lora", help="NAME=FILE: a LoRA adapter GGUF (convert --format lora) "
                     "a request applies with \"lora\": {\"NAME\": scale}; repeatable.",
                     show_default=False),
    ] = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    mode = OutputMode(quiet=quiet, verbose=verbose)
    setup_logging(mode)
    settings = ServeSettings(
        config=config, host=host, port=port, api_key=api_key, voices=voices,
        max_queue=max_queue, max_batch=max_batch, stall_timeout=stall_timeout,
        runaway_retries=runaway_retries, batch_width=batch_width,
        allowed_hosts=tuple(h.strip() for h in allowed_hosts.split(",") if h.strip()),
        max_voices=max_voices, lora=tuple(LoraSpec.parse_named(t) for t in lora or []),
    )  # fmt: skip
    settings.check()  # before the imports and the model: a refused binding costs nothing
    run_server = _server()
    preflight(needs_quantize=False, output=None, needed_bytes=None, llama_cpp=None,
              engine="auto", needs_runtime=True)  # fmt: skip
    run_server(settings, for_config(settings.config).serve, lambda line: info(mode, line),
               quiet=quiet)  # fmt: skip


def _server():
    """run_server; the serve extra's packages imported only now, so a missing one is one line
    naming the extra (the catch point: errors.missing_package)."""
    # lazy: the serve extra may be missing
    from ..serve.server import run_server

    return run_server
