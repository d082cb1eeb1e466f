"""Metrics: what /metrics shows, in Prometheus' text format (prometheus_client, own registry).

- moss_gguf_requests_total{path, status}        every answered request
- moss_gguf_request_duration_seconds{path}      latency histogram
- moss_gguf_queue_length                        requests waiting behind the running one
- moss_gguf_busy                                1 while a request runs
- moss_gguf_audio_seconds_total                 audio produced
- moss_gguf_generated_frames_total, moss_gguf_generation_seconds_total
                                                audio frames and the generation time they took
- moss_gguf_generation_frames_per_second        of the last request (its generation loop)
- moss_gguf_streams_abandoned_total             streamed requests whose client left midway
- moss_gguf_batch_size                          requests generating together now
- moss_gguf_batch_size_max                      the most that ever generated together
- moss_gguf_text_chunks_total                   chunks long inputs were spoken in (delay/speech.py)
- moss_gguf_runaway_chunks_total                chunks that reached their step budget without
                                                ending, their retry included (audio may be cut)
- moss_gguf_prompt_rows_total{prefill}          prompt rows fed to the backbone: "computed", or
                                                "restored" from a beginning another prompt shared
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

CONTENT_TYPE = CONTENT_TYPE_LATEST
# a request of the real model runs from under a second (a word, cloned voice cached) to minutes
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# the paths metrics are labelled with; anything else is "other" (no label per unknown URL)
PATHS = frozenset(
    {"/v1/audio/speech", "/v1/audio/voices", "/v1/models", "/health", "/metrics"}
)


class Metrics:
    def __init__(
        self,
        queue_length: Callable[[], float],
        busy: Callable[[], float],
        batch: Callable[[], float] = lambda: 0.0,
        batch_max: Callable[[], float] = lambda: 0.0,
    ):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "moss_gguf_requests", "Requests answered, by path and status.", ["path", "status"],
            registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "moss_gguf_request_duration_seconds", "Time to answer a request.", ["path"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        Gauge("moss_gguf_queue_length", "Requests waiting behind the running one.",
              registry=r).set_function(queue_length)  # fmt: skip
        Gauge("moss_gguf_busy", "1 while a request runs.", registry=r).set_function(busy)
        Gauge("moss_gguf_batch_size", "Requests generating together now.",
              registry=r).set_function(batch)  # fmt: skip
        Gauge("moss_gguf_batch_size_max", "The most requests that generated together.",
              registry=r).set_function(batch_max)  # fmt: skip
        self.audio_seconds = Counter(
            "moss_gguf_audio_seconds", "Seconds of audio produced.", registry=r
        )
        self.frames = Counter("moss_gguf_generated_frames", "Audio frames generated.", registry=r)
        self.generation_seconds = Counter(
            "moss_gguf_generation_seconds", "Time spent generating frames.", registry=r
        )
        self.streams_abandoned = Counter(
            "moss_gguf_streams_abandoned", "Streamed requests whose client left midway.",
            registry=r,
        )  # fmt: skip
        self.chunks = Counter("moss_gguf_text_chunks", "Chunks the inputs were spoken in.",
                              registry=r)  # fmt: skip
        self.runaways = Counter(
            "moss_gguf_runaway_chunks",
            "Chunks that reached their step budget without ending, retry included.",
            registry=r,
        )  # fmt: skip
        self.prompt_rows = Counter(
            "moss_gguf_prompt_rows",
            "Prompt rows, computed or restored from a beginning another prompt shared.",
            ["prefill"], registry=r,
        )  # fmt: skip
        self.frames_per_second = Gauge(
            "moss_gguf_generation_frames_per_second",
            "Audio frames per second of generation, last request.",
            registry=r,
        )

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        label = path if path in PATHS else (
            "/v1/audio/voices" if path.startswith("/v1/audio/voices/") else "other"
        )  # fmt: skip
        self.requests.labels(label, str(status)).inc()
        self.latency.labels(label).observe(seconds)

    def observe_speech(self, profile: Any) -> None:
        """A finished speech's figures (the stepper's result's profile: tts.SynthProfile's
        names)."""
        generation = profile.prefill_s + profile.embed_s + profile.backbone_s
        generation += profile.heads_s + profile.sampling_s
        self.audio_seconds.inc(profile.audio_s)
        self.frames.inc(profile.frames)
        self.generation_seconds.inc(generation)
        self.chunks.inc(profile.chunks)
        self.runaways.inc(profile.runaways)
        self.prompt_rows.labels("computed").inc(profile.prompt_rows - profile.prefix_rows)
        self.prompt_rows.labels("restored").inc(profile.prefix_rows)
        if generation > 0:
            self.frames_per_second.set(profile.frames / generation)

    def render(self) -> bytes:
        return generate_latest(self.registry)
