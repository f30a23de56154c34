"""What the benchmark's web apps share: routing, HTML pages, forms, and the state only the grader reads.

The apps are self-hosted sites in the style of WebArena's, small enough to
read: plain HTML forms (no JavaScript), so a browser agent works them by
clicking, typing and submitting as on any site. Each runs on Python's
standard library alone (`python3 APP.py --port P`), since it runs inside
a rollout's sandbox beside the harness.

Two paths are the runner's, never linked from a page: `GET /__forge/health`
(up) and `GET /__forge/state` (the app's server-side state as JSON: its data,
what the agent changed, and the log of requests it made), which the sandbox
collects after the harness exits for the task's grader.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

STATE_PATH = "/__forge/state"
HEALTH_PATH = "/__forge/health"

STYLE = """
body { font-family: sans-serif; margin: 0; color: #222; background: #fafafa; }
header { background: #24476b; color: white; padding: 10px 20px; display: flex; gap: 20px; align-items: center; }
header a { color: white; text-decoration: none; font-weight: bold; }
main { padding: 16px 20px; max-width: 960px; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 4px 8px; text-align: left; }
.error { color: #b00020; font-weight: bold; } .ok { color: #1b5e20; font-weight: bold; }
form.inline { display: inline; } label { display: block; margin: 6px 0; }
.card { background: white; border: 1px solid #ddd; padding: 8px 12px; margin: 8px 0; }
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def money(amount: float) -> str:
    return f"${amount:,.2f}"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    form: dict[str, str]


@dataclass
class Response:
    body: str = ""
    status: int = 200
    location: str = ""  # a redirect (303) when set
    content_type: str = "text/html; charset=utf-8"


Handler = Callable[..., Response]


@dataclass
class App:
    """An app: a title, nav links, routes (`METHOD /path/{name}` -> handler(request, **names)) and state."""

    title: str
    nav: list[tuple[str, str]]
    state: dict
    routes: list[tuple[str, re.Pattern, Handler]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def route(self, method: str, pattern: str) -> Callable[[Handler], Handler]:
        regex = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern) + "$")

        def register(handler: Handler) -> Handler:
            self.routes.append((method, regex, handler))
            return handler
        return register

    def page(self, heading: str, body: str, status: int = 200) -> Response:
        links = "".join(f'<a href="{esc(href)}">{esc(text)}</a>' for text, href in self.nav)
        doc = (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(heading)} - {esc(self.title)}</title>"
               f"<style>{STYLE}</style></head><body><header><span>{esc(self.title)}</span>{links}</header>"
               f"<main><h1>{esc(heading)}</h1>{body}</main></body></html>")
        return Response(doc, status)

    def handle(self, request: Request) -> Response:
        if request.path == HEALTH_PATH:
            return Response('{"ok": true}', content_type="application/json")
        if request.path == STATE_PATH:
            with self.lock:
                return Response(json.dumps(self.state), content_type="application/json")
        with self.lock:
            if not request.path.startswith("/favicon"):
                self.state["requests"].append({"method": request.method, "path": request.path,
                                               "query": request.query, "form": request.form})
            for method, regex, handler in self.routes:
                found = regex.match(request.path)
                if found and method == request.method:
                    return handler(request, **found.groupdict())
        return self.page("Not found", f"<p>No page at {esc(request.path)}.</p>", 404)


def _fields(raw: str) -> dict[str, str]:
    return {k: v[-1].strip() for k, v in parse_qs(raw, keep_blank_values=True).items()}


def serve(app: App, port: int) -> None:
    """Serve `app` on 127.0.0.1:`port` until killed."""
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, method: str) -> None:
            url = urlsplit(self.path)
            form = {}
            if method == "POST":
                form = _fields(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
            response = app.handle(Request(method, url.path, _fields(url.query), form))
            data = response.body.encode()
            self.send_response(303 if response.location else response.status)
            if response.location:
                self.send_header("Location", response.location)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._answer("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._answer("POST")

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def main(build: Callable[[dict], App], default_data: Path) -> None:
    """The app's command line: `--port P [--data FILE]` (the seed data, JSON)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data", type=Path, default=default_data)
    args = parser.parse_args()
    serve(build(json.loads(args.data.read_text())), args.port)
