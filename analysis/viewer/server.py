"""`forge-analyze view`: a read-only HTTP server for one dataset, on loopback unless told otherwise.

The page (`static/`) is plain HTML, CSS and JavaScript shipped with the
package; it asks the JSON endpoints below for what it shows. Nothing here
writes to the dataset. Unknown ids answer 404; bad input, and only that (a
`UserError`: a malformed parameter is a `BadRequest`, an unknown report group
the report's own error), 400; anything else is a bug, logged with its
traceback where the viewer was started, and answered 500.

    GET /                       the app          GET /api/session?id=S           a session: calls, segments, tool calls
    GET /api/facets             filter values    GET /api/call?id=C[&session=S]  one call's messages, tools
    GET /api/sessions?...       a page of the    GET /api/raw?id=C[&session=S]   its raw request and response
                                sessions list    GET /api/blob?session=S&hash=H   an image
    GET /api/request?id=C[&session=S]            the request's bytes as sent (its images put back)
    GET /api/tokens?session=S&segment=N          the segment as a training sample, token by token
    GET /report?by=harness                       the HTML report, its group cells linking to the list
"""

from __future__ import annotations

import json
import sys
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from forgerl.converters.tokens import Renderer
from forgerl.errors import UserError

from .. import connect
from ..report import build, to_html
from .queries import FILTERS, PAGE, BadRequest, Dataset, NotFound
from .tokens import token_view

DEFAULT_LISTEN = "127.0.0.1:8765"
_STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
           "app.css": "text/css; charset=utf-8"}


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv4 or a name) -> (host, port); `UserError` if it is not one."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UserError(f"--listen {text!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host, int(port)


class Viewer:
    """What the handler answers with: the dataset's queries, the token view and the report."""

    def __init__(self, root: Path, renderer: Renderer | None, threads: int | None = None):
        self.root, self.renderer, self.threads = root, renderer, threads
        self.data = Dataset(root, threads=threads)

    def one(self, q: dict[str, str], name: str) -> str:
        """A required parameter's value."""
        if not q.get(name):
            raise BadRequest(f"missing parameter {name!r}")
        return q[name]

    def number(self, q: dict[str, str], name: str, default: int | None = None) -> int:
        """A whole-number parameter (required when there is no default)."""
        text = q.get(name) or (None if default is None else str(default))
        if text is None:
            raise BadRequest(f"missing parameter {name!r}")
        try:
            return int(text)
        except ValueError:  # the parameter's text only: nothing else runs in this block
            raise BadRequest(f"parameter {name!r} must be a whole number, got {text!r}") from None

    def api(self, path: str, q: dict[str, str]) -> Any:
        if path == "/api/facets":
            return self.data.facets()
        if path == "/api/sessions":
            limit = self.number(q, "limit", PAGE)
            if not 1 <= limit <= 1000:
                raise BadRequest(f"limit must be 1..1000, got {limit}")
            return self.data.sessions({k: q[k] for k in (*FILTERS, "label", "q") if q.get(k)},
                                      q.get("sort", "time"), q.get("dir", "desc") != "asc", q.get("after"), limit)
        if path == "/api/session":
            return self.data.session(self.one(q, "id"))
        if path == "/api/call":
            return self.data.call(self.one(q, "id"), q.get("session"))
        if path == "/api/raw":
            return self.data.raw(self.one(q, "id"), q.get("session"))
        if path == "/api/tokens":
            with self.data.lock:
                return token_view(self.data.con, self.one(q, "session"), self.number(q, "segment"), self.renderer)
        raise NotFound(f"no endpoint {path}")

    def report(self, by: str) -> str:
        """The HTML report grouped by `by` (an unknown group column: its `UserError`, a 400)."""
        report = build(connect(self.root, threads=self.threads, materialize=True), by)
        return to_html(report, f"forgerl behaviour report: {self.root.resolve().name}", viewer="/")


def _handler(viewer: Viewer) -> type[BaseHTTPRequestHandler]:
    static = resources.files(__package__) / "static"

    class Handler(BaseHTTPRequestHandler):
        server_version = "forge-analyze-view"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass  # a request log would drown the one line that says where the viewer is

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, value: Any) -> None:
            self._send(status, json.dumps(value, default=str).encode(), "application/json")

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urlsplit(self.path)
            q = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                self._route(url.path, q)
            except NotFound as e:
                self._json(HTTPStatus.NOT_FOUND, {"error": str(e)})
            except UserError as e:  # bad input only: a ValueError from our own code is a bug (below)
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(e)})
            except (BrokenPipeError, ConnectionResetError):
                pass
            except Exception as e:  # a bug: keep the traceback where the user started the viewer
                traceback.print_exc()
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"bug in forgerl: {e!r}"})

        def _route(self, path: str, q: dict[str, str]) -> None:
            if path == "/":
                path = "/static/index.html"
            if path.startswith("/static/") and path[len("/static/"):] in _STATIC:
                name = path[len("/static/"):]
                self._send(HTTPStatus.OK, (static / name).read_bytes(), _STATIC[name])
            elif path == "/api/blob":
                data, media = viewer.data.blob(q.get("session", ""), q.get("hash", ""))
                self._send(HTTPStatus.OK, data, media)
            elif path == "/api/request":
                body = viewer.data.request(viewer.one(q, "id"), q.get("session"))
                self._send(HTTPStatus.OK, body, "text/plain; charset=utf-8")
            elif path == "/report":
                self._send(HTTPStatus.OK, viewer.report(q.get("by", "harness")).encode(), _STATIC["index.html"])
            elif path.startswith("/api/"):
                self._json(HTTPStatus.OK, viewer.api(path, q))
            else:
                raise NotFound(f"no page {path}")

    return Handler


def serve(root: Path, listen: str = DEFAULT_LISTEN, renderer: Renderer | None = None,
          threads: int | None = None) -> None:
    """Serve the viewer until interrupted; one line on stderr says where, once it listens.

    The address is bound before the dataset is opened, so an unusable one fails at once."""
    host, port = parse_listen(listen)
    try:
        httpd = ThreadingHTTPServer((host, port), BaseHTTPRequestHandler)
    except OSError as e:
        raise UserError(f"--listen {listen}: cannot listen there: {e.strerror or e}") from None
    try:
        httpd.RequestHandlerClass = _handler(Viewer(root, renderer, threads))
        httpd.daemon_threads = True
        url = f"http://{host}:{httpd.server_address[1]}/"
        print(f"forge-analyze view: {root} at {url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
