"""run_server: load the model once, bind, serve with uvicorn until SIGINT/SIGTERM.

Order: the settings are checked and the config read (seconds, the family's `serve` entry), the
address bound (so a busy port fails before minutes of loading), the model loaded (the
family's stepper, made a Service by `open_service`), then uvicorn serves on the bound socket.
On SIGINT/SIGTERM uvicorn stops accepting; the scheduler answers what waits and what runs with
503 at once (the running job stops at its next step), uvicorn lets the open responses finish,
and run_server returns: the process exits 0 within seconds.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn

from ..errors import UsageError
from .metrics import Metrics
from .origins import HostPolicy
from .routes import JobFor, Service, create_app
from .scheduler import Scheduler
from .settings import ServeSettings
from .stepper import Stepper
from .voices import VoiceStore

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class Served:
    """A folder to serve, its config read: the weights the ready line names, and how to load
    it (after the socket is bound: a taken port is said before minutes of loading)."""

    weights: str
    load: Callable[[], Service]


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
    info = service.scheduler.info
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


def open_service(settings: ServeSettings, stepper: Stepper, created: int, *, model_id: str,
                 job_for: JobFor, out: Any, languages: Any = None, lora: tuple[str, ...] = (),
                 text_input: Any = None) -> Service:  # fmt: skip
    """The routes' Service over a family's loaded STEPPER (closed if this fails): the one
    scheduler, its metrics, the voice store. CREATED: when the weights were made; the rest
    is what the family says to the routes (routes.Service)."""
    try:
        # the gauges read the scheduler when scraped; it is made right after
        metrics = Metrics(lambda: scheduler.waiting, lambda: float(scheduler.busy),
                          lambda: scheduler.active, lambda: scheduler.batch_max)  # fmt: skip
        scheduler = Scheduler(stepper, settings.max_queue, on_speech=metrics.observe_speech,
                              stall_s=settings.stall_timeout)  # fmt: skip
        voices = VoiceStore(settings.voices_dir, stepper.info.n_vq, settings.max_voices)
    except BaseException:
        stepper.close()
        raise
    return Service(settings, scheduler, voices, metrics, model_id, created, job_for, out,
                   languages=languages, lora=lora, text_input=text_input)  # fmt: skip


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
