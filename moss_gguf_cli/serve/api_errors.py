"""ApiError: a failure a client can act on, sent as OpenAI's error object.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "input",
               "code": "empty_input"}}

Core errors (errors.MossGgufError) become one: bad input or usage → 400, anything else → 500,
with the same one line the CLI prints.
"""

from __future__ import annotations

from typing import Any

from ..errors import MossGgufError

TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
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

    @classmethod
    def from_core(cls, exc: MossGgufError, param: str | None = None) -> ApiError:
        status = 400 if exc.exit_code == 2 else 500
        code = "invalid_value" if status == 400 else "synthesis_failed"
        # the server's own paths mean nothing to a client: message and fix only
        text = exc.message + (f" ({exc.hint})" if exc.hint else "")
        return cls(status, text, param=param, code=code)


class QueueFull(ApiError):
    def __init__(self, limit: int):
        super().__init__(
            429,
            f"the queue is full ({limit} requests waiting); retry in a moment",
            code="queue_full",
        )


class ShuttingDown(ApiError):
    def __init__(self) -> None:
        super().__init__(
            503, "the server is shutting down; retry against a running server", code="shutting_down"
        )
