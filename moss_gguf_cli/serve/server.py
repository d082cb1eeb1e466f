"""run_server: load the model once, bind, serve with uvicorn until SIGINT/SIGTERM.

Order: the settings are checked and the config read (seconds), the address bound (so a busy
port fails before minutes of loading), the Synthesizer loaded, then uvicorn serves on the
bound socket. On SIGINT/SIGTERM uvicorn stops accepting; the scheduler answers what waits
and what runs with 503 at once (the running job stops at its next step), uvicorn lets the
open responses finish, and run_server returns: the process exits 0 within seconds.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import uvicorn

from ..errors import UsageError
from ..nano.engine import NanoEngine, NanoFolderConfig, engines_for
from ..tts import SynthConfig, Synthesizer
from ..tts.engine import EngineSettings
from .metrics import Metrics
from .nano_worker import VARIANT, NanoScheduler, nano_job
from .origins import HostPolicy
from .output import StereoOut
from .routes import Service, create_app
from .scheduler import Scheduler
from .settings import ServeSettings
from .voices import VoiceStore

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class Served:
    """A folder to serve, its config read: the weights the ready line names, and how to load
    it (after the socket is bound: a taken port is said before minutes of loading)."""

    weights: str
    load: Callable[[], Service]


def serve_delay(settings: ServeSettings) -> Served:
    """A delay family's folder (Scheduler over the Synthesizer), --lora adapters applied."""
    config = replace(SynthConfig.from_yaml(settings.config), lora=settings.lora)
    return Served(Path(config.backbone_gguf).name, lambda: _load(settings, config))


def serve_nano(settings: ServeSettings) -> Served:
    """A MOSS-TTS-Nano folder (serve/nano_worker.py)."""
    if settings.lora:
        raise UsageError("--lora adapters are for the delay models' backbone; a MOSS-TTS-Nano "
                         "folder takes none", hint="leave --lora out")  # fmt: skip
    config = NanoFolderConfig.from_yaml(settings.config)
    return Served(Path(config.global_gguf).name, lambda: _load_nano(settings, config))


def run_server(settings: ServeSettings, serve: Callable[[ServeSettings], Served],
               announce: Callable[[str], None], quiet: bool = False):  # fmt: skip
    """Serve the folder SERVE reads (its family's: families/) until stopped. ANNOUNCE gets the
    line saying where and what (once ready)."""
    settings.check()
    served = serve(settings)
    sock = bind(settings.host, settings.port)
    try:
        service = served.load()
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    where = f"[{host}]" if ":" in host else host
    n_voices = len(service.voices.list())
    info = service.scheduler.tts.info
    weights = served.weights
    service.on_ready = lambda: announce(
        f"serving {info.variant} ({weights}, n_vq {info.n_vq}) as "
        f"model {service.model_id!r} at http://{where}:{port}/v1; voices in "
        f"{service.voices.folder} ({n_voices} stored); "
        f"{'API key required' if settings.api_key else 'no API key'}; "
        f"{HostPolicy.make(settings.host, settings.allowed_hosts).describe()}; Ctrl+C stops"
    )
    uv = uvicorn.Config(
        create_app(service),
        log_level="warning" if quiet else "info",
        access_log=not quiet,
        timeout_graceful_shutdown=5,
        lifespan="on",
    )
    server = _Server(uv, service.scheduler.shutdown)
    # uvicorn re-raises the stop signal once it is done: land it here, so a requested stop
    # ends the process with 0 rather than as killed by the signal
    previous = {sig: signal.signal(sig, _stopped) for sig in STOP_SIGNALS}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        service.scheduler.close(3.0)  # a no-op when the lifespan's shutdown did it


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on HOST:PORT (port 0: a free one), or a one-line UsageError."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, address = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except (OSError, IndexError) as exc:
        raise UsageError(f"cannot resolve --host {host}: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        why = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or exc
        raise UsageError(f"cannot listen on {host}:{port}: {why}",
                         hint="choose another --port (0 picks a free one)") from exc  # fmt: skip
    sock.set_inheritable(True)
    return sock


def _load(settings: ServeSettings, config: SynthConfig) -> Service:
    tts = Synthesizer(config, max_batch=settings.max_batch,
                      settings=EngineSettings(width=settings.batch_width))  # fmt: skip
    try:
        # the gauges read the scheduler when scraped; it is made right after
        metrics = Metrics(lambda: scheduler.waiting, lambda: float(scheduler.busy),
                          lambda: len(tts.engine.active), lambda: scheduler.batch_max)  # fmt: skip
        scheduler = Scheduler(tts, settings.max_queue, on_speech=metrics.observe_speech,
                              stall_s=settings.stall_timeout,
                              retries=settings.runaway_retries)  # fmt: skip
        voices = VoiceStore(settings.voices_dir, tts.info.n_vq, settings.max_voices)
        created = int(Path(config.backbone_gguf).stat().st_mtime)
    except BaseException:
        tts.close()
        raise
    return Service(settings, scheduler, voices, metrics, tts.info.variant.lower(),
                   tts.info.sampling_rate, created)  # fmt: skip


def _load_nano(settings: ServeSettings, config: NanoFolderConfig) -> Service:
    """A MOSS-TTS-Nano folder (serve/nano_worker.py): --max-batch requests at once, at most
    one a core, each on an engine of its own with the cores shared out (threads beyond the
    cores spin against each other); 48 kHz stereo."""
    width, threads = engines_for(settings.max_batch, config.n_threads)
    engines: list[NanoEngine] = []
    try:
        for _ in range(width):
            engines.append(NanoEngine(config, n_threads=threads))
        engine = engines[0]
        metrics = Metrics(lambda: scheduler.waiting, lambda: float(scheduler.busy),
                          lambda: scheduler.speaking, lambda: scheduler.batch_max)  # fmt: skip
        scheduler = NanoScheduler(engines, settings.max_queue, on_speech=metrics.observe_speech,
                                  stall_s=settings.stall_timeout)  # fmt: skip
        voices = VoiceStore(settings.voices_dir, engine.nano.n_vq, settings.max_voices)
        created = int(config.global_gguf.stat().st_mtime)
    except BaseException:
        for loaded in engines:
            loaded.close()
        raise
    return Service(settings, scheduler, voices, metrics, VARIANT.lower(), engine.sample_rate,
                   created, out=StereoOut(engine.sample_rate, engine.channels),
                   frame_s=engine.frame_samples / engine.sample_rate, own_job=nano_job,
                   takes_language=False)  # fmt: skip


class _Server(uvicorn.Server):
    """uvicorn's server, telling the scheduler to stop as soon as a stop signal arrives (not
    after the open responses finished, when its lifespan shutdown would)."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None]):
        super().__init__(config)
        self._on_stop = on_stop

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        try:  # in a signal handler: leave the work to the event loop
            asyncio.get_running_loop().call_soon_threadsafe(self._on_stop)
        except RuntimeError:
            self._on_stop()


def _stopped(sig, _frame) -> None:
    log.debug("stopped by signal %d", sig)
