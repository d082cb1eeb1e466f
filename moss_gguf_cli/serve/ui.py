"""The page to hear it: `GET /` and `/ui` answer a small web page shipped in the package
(serve/static/: one HTML file, its script and its style sheet; no build step, nothing fetched
from another host, so it works on a server with no network).

The page is served in front of the API (an ASGI layer around the app), so it loads without an
API key: a browser cannot send one with a page load. Everything the page then does goes through
the API with the key the user typed (`Authorization: Bearer`), as any client. `GET /ui/config`
tells the page only whether a key is needed. A Content-Security-Policy keeps the page's own
requests on this server (`connect-src 'self'`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

# path → (package file, media type)
FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui": ("index.html", "text/html; charset=utf-8"),
    "/ui/": ("index.html", "text/html; charset=utf-8"),
    "/ui/page.js": ("page.js", "text/javascript; charset=utf-8"),
    "/ui/page.css": ("page.css", "text/css; charset=utf-8"),
}
CONFIG_PATH = "/ui/config"
HEADERS = {
    # the page may talk to this server only; the played audio is a blob: URL it made itself
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "media-src 'self' blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


@cache
def page_file(name: str) -> bytes:
    """A file of the page, read once from the installed package."""
    return (resources.files(__package__) / "static" / name).read_bytes()


@dataclass
class PageFront:
    """ASGI layer: answers GET/HEAD for the page's paths, hands everything else to APP."""

    app: ASGIApp
    key_required: bool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == CONFIG_PATH:
            body = json.dumps({"api_key_required": self.key_required}).encode()
            response = Response(body, media_type="application/json", headers=HEADERS)
        elif path in FILES:
            name, media_type = FILES[path]
            response = Response(page_file(name), media_type=media_type, headers=HEADERS)
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)


def with_page(app: ASGIApp, key_required: bool) -> PageFront:
    """APP with the page in front of it."""
    return PageFront(app, key_required)
