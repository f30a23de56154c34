"""A byte-for-byte socket forwarder: how a harness in its own network namespace reaches the recorder.

A network namespace with nothing but loopback has no route anywhere, but a
Unix socket is a file, and files cross network namespaces. So the jail,
before it enters the rollout's namespaces, listens on a Unix socket in the
rollout's temp dir (forwarding to the recorder's TCP port), and inside the
namespace its PID 1 listens on 127.0.0.1:PORT (forwarding to that Unix
socket). The harness's base URL is `http://127.0.0.1:PORT`; nothing else is
reachable.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

_CHUNK = 1 << 16


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(_CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _pipe(client: socket.socket, connect: Callable[[], socket.socket]) -> None:
    try:
        upstream = connect()
    except OSError:
        client.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def forward(listener: socket.socket, connect: Callable[[], socket.socket]) -> threading.Thread:
    """Accept on `listener` until it is closed; pipe each connection to a fresh `connect()`."""

    def accept_loop() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed: stop
                return
            threading.Thread(target=_pipe, args=(client, connect), daemon=True).start()

    thread = threading.Thread(target=accept_loop, name="forgerl-bridge", daemon=True)
    thread.start()
    return thread


def unix_listener(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(256)
    return sock


def tcp_connector(host: str, port: int) -> Callable[[], socket.socket]:
    return lambda: socket.create_connection((host, port))


def unix_connector(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return sock
    return connect
