"""Shared pieces of the OpenCode and OpenClaw end-to-end tests: a phone-home trap, tool-loop counting, a key grep.

`PhoneHomeTrap` is an HTTP(S) proxy that refuses everything and remembers what
was asked of it. A harness run with it as `HTTP(S)_PROXY` (and the recorder in
`NO_PROXY`) reaches the recorder directly, and any other host it tries (a model
catalogue, a package registry, an update or telemetry endpoint) lands in the
trap, so a test can assert that nothing but the model was called. Bun (OpenCode)
honours the proxy variables; Node 24 (OpenClaw) does with `NODE_USE_ENV_PROXY=1`.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from scripted_upstream import Request


class PhoneHomeTrap:
    def __init__(self) -> None:
        self.requests: list[str] = []  # first line of each request: "CONNECT host:443 HTTP/1.1", "GET http://..."
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def env(self) -> dict[str, str]:
        no_proxy = "127.0.0.1,localhost"
        return {"HTTP_PROXY": self.url, "HTTPS_PROXY": self.url, "http_proxy": self.url, "https_proxy": self.url,
                "NO_PROXY": no_proxy, "no_proxy": no_proxy, "NODE_USE_ENV_PROXY": "1"}

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    line = conn.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
                    self.requests.append(line)
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    continue

    def close(self) -> None:
        self._server.close()


def tool_results(request: Request) -> int:
    """How many tool results the conversation holds (OpenClaw appends a context note after each one, so the
    last message is not always the tool result)."""
    return sum(m.get("role") == "tool" for m in request.body.get("messages") or [])


def files_holding(secret: str, *folders: Path) -> list[str]:
    """Files under `folders` whose bytes contain `secret`."""
    return [str(p) for folder in folders for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
