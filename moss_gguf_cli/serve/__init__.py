"""`moss-gguf serve`: speech over HTTP, the way OpenAI clients ask for it.

What lives here:

- settings.py   ServeSettings (bind address, key, limits) and the binding rule
- api_errors.py ApiError: the OpenAI error object ({"error": {message, type, param, code}})
- failures.py   what a failed job answers: 4xx naming the field the request got wrong, else 500
- schemas.py    the request bodies (pydantic), named as OpenAI's fields and the synth YAML's keys
- audio.py      waveform → wav / pcm / flac / mp3 / opus / aac bytes; tempo change for `speed`
- origins.py    which Host and Origin a request may carry (DNS rebinding, cross-site forms):
                the outermost layer, before anything else reads a request
- voices.py     VoiceStore: reference voices as codes on disk (atomic writes, checked names)
- stepper.py    the Stepper protocol a model family speaks through (its room holds its own:
                delay/stepper.py, nano/serving.py), the Watch a request is cancelled by,
                the Delta a stream carries, ServedModel (rate, channels, n_vq)
- scheduler.py  Scheduler: the one serve core, family-blind: a bounded queue, the one
                worker thread that starts and steps the family's requests (its model is not
                thread-safe), the watchdog, shutdown, the gauges; routes submit jobs to it
                and never touch the model themselves
- streams.py    streamed speech: stream_format "audio" (pcm/wav chunks) and "sse" (OpenAI's
                speech.audio.delta / speech.audio.done events); the disconnect watch
- metrics.py    Prometheus counters, gauges and histograms (prometheus_client)
- routes.py     the FastAPI app: /v1/audio/speech, /v1/audio/voices, /v1/models, /health,
                /metrics; authentication, error rendering, the bounds on every body
                (limits and ranges: docs/serve-limits.md)
- server.py     run_server: load (the family's serve entry), bind, serve with uvicorn, stop
                cleanly on SIGINT/SIGTERM; open_service: a family's loaded stepper as the
                routes' Service
- ui.py         the web page at / and /ui (static/: its HTML, script and style, package data),
                answered before the API key is checked; the page calls the API as a client

May import (rank 6, a stage core): tts/ (shared speech) and the top level (errors, progress,
hold_points: a test's hold point); never a family's room, which it is handed (tests/
test_structure.py). Imported by cli/serve_cmd.py, the registry's serve entries (families/,
lazily) and the family rooms (delay/, nano/: their steppers and loaders). FastAPI, uvicorn,
PyAV and prometheus_client come with the optional `serve` extra (errors.EXTRA_MODULES names
its modules), so only settings.py is imported before the extra is checked.
"""

