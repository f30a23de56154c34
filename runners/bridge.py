"""A byte-for-byte socket forwarder: how a harness in its own network namespace reaches the recorder.

A network namespace with nothing but loopback has no route anywhere, but a
socket belongs to the namespace it was made in, wherever it is used, and
file descriptors cross namespaces. So the jail's first process, which stays
in the machine's namespace, hands out fresh TCP sockets (`hand_out_socket`)
over a Unix socket pair; inside the rollout's namespace PID 1 listens on
127.0.0.1:PORT and connects each harness connection through one of them to
the recorder (`forward` with `connector_through`). One hop: the harness's
bytes are copied once, by PID 1, on their way to the recorder. The harness's
base URL is `http://127.0.0.1:PORT`; nothing else is reachable.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

_CHUNK = 1 << 16
_ASK = b"S"


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


def socket_source() -> tuple[socket.socket, socket.socket]:
    """The pair a socket is asked for and handed over on: (the giver's end, the asker's end)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def hand_out_socket(source: socket.socket) -> bool:
    """Answer one ask on `source` with a fresh TCP socket of this process's network namespace; False once the
    asker has hung up."""
    try:
        if source.recv(1) != _ASK:
            return False
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as fresh:
            socket.send_fds(source, [_ASK], [fresh.fileno()])
    except OSError:  # it hung up between its ask and the answer
        return False
    return True


def connector_through(source: socket.socket, host: str, port: int) -> Callable[[], socket.socket]:
    """Connections to host:port on sockets asked of the giver at `source`'s other end (its namespace's)."""
    lock = threading.Lock()

    def connect() -> socket.socket:
        with lock:  # one ask, one answer: the pair is shared by every connection's thread
            source.send(_ASK)
            _, fds, _, _ = socket.recv_fds(source, 1, 1)
        if not fds:
            raise ConnectionError("the jail handed out no socket (it is gone)")
        sock = socket.socket(fileno=fds[0])
        try:
            sock.connect((host, port))
        except OSError:
            sock.close()
            raise
        return sock

    return connect
