"""ApiError: a failure a client can act on, sent as OpenAI's error object.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "input",
               "code": "empty_input"}}

Core errors (errors.MossGgufError) become one in failures.api_error: what the request caused
→ 4xx naming its field, anything else → 500.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
    500: "server_error",
}


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())  # one line
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


class Stalled(ApiError):
    """The watchdog's answer: the worker made no progress for STALL_S seconds."""

    def __init__(self, stall_s: float, running: bool):
        what = "generating this request" if running else "starting this request"
        super().__init__(503 if not running else 500,
                         f"the server made no progress {what} for {stall_s:.0f} s; it is "
                         "reported unhealthy on /health; retry later or elsewhere",
                         code="engine_stalled")  # fmt: skip


class ShuttingDown(ApiError):
    def __init__(self) -> None:
        super().__init__(
            503, "the server is shutting down; retry against a running server", code="shutting_down"
        )


class QueueFull(ApiError):
    def __init__(self, limit: int):
        super().__init__(
            429,
            f"the queue is full ({limit} requests waiting); retry in a moment",
            code="queue_full",
        )
