"""Which Host and Origin a request may carry: the server's defence against web pages.

A page on another site can make a browser send requests to a server on 127.0.0.1 in two ways
that no API key stops when none is set: DNS rebinding (a name that re-resolves to 127.0.0.1,
so the page is same-origin with the server and reads what it answers) and cross-site "simple"
requests (a form POST needs no preflight and changes state, even if the page cannot read the
answer). The first is closed by answering only the server's own host names (HostPolicy); the
second by refusing state-changing requests whose Origin or Sec-Fetch-Site says another site
sent them (cross_origin). Clients that send neither header (curl, SDKs) are not browsers and
are served as before. docs/serve-limits.md says what is refused and why.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from .api_errors import ApiError, error_response

# probes and scrapers send the pod's or node's address as Host: they stay open
PROBE_PATHS = frozenset({"/health", "/metrics"})
# methods that only read: no Origin check (CORS already keeps their answers from other sites)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"localhost"})
ANY_ADDRESS = frozenset({"0.0.0.0", "::", "[::]"})
ANY_HOST = "*"
# Sec-Fetch-Site values a browser sends for the server's own page, or a user's own action
OWN_FETCH_SITES = frozenset({"same-origin", "none"})


def split_host(value: str) -> tuple[str, str | None] | None:
    """(name, port) of a Host header or an Origin's host part, lower-cased; None when it is
    not one (empty, a user part, spaces, a port that is no number)."""
    value = value.strip().lower()
    if not value or any(c in value for c in "@/\\?# \t,"):
        return None
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
        return name, rest[1:] or None
    name, colon, port = value.partition(":")
    if colon and not port.isdigit():
        return None
    return name.rstrip(".") or None, port or None


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


@dataclass(frozen=True)
class HostPolicy:
    """The Host names a server answers to, from its --host and --allowed-hosts."""

    names: frozenset[str]  # besides the loopback names
    any_ip: bool = False  # --host 0.0.0.0 / ::: any IP literal (a LAN client types one)
    any_host: bool = False  # --allowed-hosts '*': no check

    @classmethod
    def make(cls, bind_host: str, allowed: tuple[str, ...] = ()) -> HostPolicy:
        names = {a.strip().lower().rstrip(".") for a in allowed if a.strip() != ANY_HOST}
        bind = bind_host.strip().lower()
        any_ip = bind in ANY_ADDRESS
        if not any_ip:
            names.add(bind.strip("[]").rstrip("."))
        return cls(frozenset(n for n in names if n), any_ip,
                   any(a.strip() == ANY_HOST for a in allowed))  # fmt: skip

    def allows(self, host_header: str | None) -> bool:
        if self.any_host:
            return True
        parsed = split_host(host_header or "")
        if parsed is None:
            return False
        name, _ = parsed
        ip = _ip(name)
        if name in LOOPBACK_NAMES or (ip is not None and ip.is_loopback):
            return True
        if ip is not None and self.any_ip:
            return True
        return name in self.names

    def describe(self) -> str:
        """For the startup line: what Host values are answered."""
        if self.any_host:
            return "hosts answered: any (--allowed-hosts '*': no DNS-rebinding check)"
        extra = sorted(self.names - LOOPBACK_NAMES - {"127.0.0.1", "::1"})
        parts = ["loopback"] + (["any IP address"] if self.any_ip else []) + extra
        return "hosts answered: " + ", ".join(parts)

    def refusal(self, host_header: str | None) -> ApiError:
        shown = repr(host_header[:100]) if host_header else "no Host header"
        return ApiError(
            403,
            f"{shown} is not a host this server answers to (a page on another site may be "
            "reaching it through DNS rebinding); if you reach it by that name on purpose, "
            "start it with --allowed-hosts NAME",
            code="host_not_allowed",
        )


def cross_origin(method: str, host: str | None, origin: str | None,
                 fetch_site: str | None) -> ApiError | None:  # fmt: skip
    """The refusal of a state-changing request another site's page sent, or None.

    Own origin: the Origin's host[:port] equals the request's Host (the scheme is ignored, so a
    TLS-terminating proxy in front changes nothing; another port is another origin)."""
    if method.upper() in SAFE_METHODS:
        return None
    if fetch_site is not None and fetch_site.strip().lower() not in OWN_FETCH_SITES:
        return _cross(f"Sec-Fetch-Site {fetch_site.strip()[:40]!r}")
    if origin is None:
        return None  # not a browser's request (curl, SDKs), or one of the user's own
    own = split_host(host or "")
    theirs = split_host(urlsplit(origin.strip()).netloc) if "://" in origin else None
    if theirs is None or own is None or theirs != own:
        return _cross(f"Origin {origin.strip()[:100]!r}")
    return None


def _cross(what: str) -> ApiError:
    return ApiError(
        403,
        f"{what}: a page of another site sent this request; only this server's own page "
        "(or a client that is no browser) may change state here",
        code="cross_origin",
    )


class Gate:
    """The outermost ASGI layer: the Host check on every route but the probes, then the
    Origin check on state-changing requests, before anything else reads the request."""

    def __init__(self, app, policy: HostPolicy):
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send) -> None:
        socket = scope["type"] == "websocket"
        if (scope["type"] == "http" and scope["path"] not in PROBE_PATHS) or socket:
            headers = _headers(scope)
            host = headers.get("host")
            refused = None if self.policy.allows(host) else self.policy.refusal(host)
            if refused is None:  # a WebSocket is never a "safe" read: its Origin is checked
                refused = cross_origin("POST" if socket else scope["method"], host,
                                       headers.get("origin"),
                                       headers.get("sec-fetch-site"))  # fmt: skip
            if refused is not None and socket:  # closed before the handshake: a 403
                await send({"type": "websocket.close", "code": 1008,
                            "reason": refused.message[:120]})  # fmt: skip
                return
            if refused is not None:
                await error_response(refused)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _headers(scope) -> dict[str, str]:
    """The request's headers by lower-cased name (the first of repeated ones)."""
    found: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        found.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return found
