"""A byte-for-byte socket forwarder: how a harness in its own network namespace reaches the recorder.

A network namespace with nothing but loopback has no route anywhere, but a
socket belongs to the namespace it was made in, wherever it is used. So PID
1 of the rollout's namespaces keeps the machine's network namespace open
(an fd of /proc/self/ns/net taken before it unshared its own), listens on
127.0.0.1:PORT inside, and connects each harness connection to the recorder
on a socket made outside: the connecting thread steps into the machine's
namespace for the `socket()` call alone (`setns` moves only the calling
thread) and back (`forward` with `connector_from`). One process and one hop:
the harness's bytes are copied once, by PID 1, on their way to the recorder.
The harness's base URL is `http://127.0.0.1:PORT`; nothing else is
reachable. (That fd gives a harness running as root nothing it lacked: the
jail's /proc is the machine's, and with it every process's namespaces.)
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from .namespaces import CLONE_NEWNET, setns

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


def connector_from(outside: int, inside: int, host: str, port: int) -> Callable[[], socket.socket]:
    """Connections to host:port on sockets made in the network namespace `outside` (an open /proc/.../ns/net),
    by a thread that is in `inside` before and after."""

    def connect() -> socket.socket:
        setns(outside, CLONE_NEWNET)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            setns(inside, CLONE_NEWNET)
        try:
            sock.connect((host, port))
        except OSError:
            sock.close()
            raise
        return sock

    return connect
