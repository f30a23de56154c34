"""The jail's bridge: inside the rollout's network namespace, connections forwarded to the recorder on sockets made
in the machine's, one hop."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from forgerl.runners.bridge import connector_from, forward
from forgerl.runners.jail import loopback_up
from forgerl.runners.namespaces import CLONE_NEWNET, open_namespace, unshare
from forgerl.runners.sandbox import can_unshare


@pytest.fixture
def echo_server():
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1024):
                    conn.sendall(data.upper())

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


@pytest.mark.skipif(not can_unshare(), reason="no network namespaces on this machine (see runners/README.md)")
def test_bytes_cross_the_bridge_on_sockets_made_outside(echo_server):
    """A thread in a network namespace of its own (as PID 1 of a jail is) reaches the echo server outside through
    the bridge, a fresh outside socket per connection, and is refused when it tries it directly."""
    seen: dict = {}

    def inside() -> None:
        outside = open_namespace("net")
        unshare(CLONE_NEWNET)  # this thread only
        loopback_up()
        own = open_namespace("net")
        try:
            listener = socket.create_server(("127.0.0.1", 0))
            forward(listener, connector_from(outside, own, "127.0.0.1", echo_server))
            seen["answers"] = []
            for text in (b"first", b"second"):  # each connection gets a socket of its own
                with socket.create_connection(listener.getsockname(), timeout=5) as client:
                    client.sendall(text)
                    client.shutdown(socket.SHUT_WR)
                    seen["answers"].append(client.recv(1024))
            try:
                socket.create_connection(("127.0.0.1", echo_server), timeout=5).close()
                seen["direct"] = "connected"
            except OSError:
                seen["direct"] = "refused"
            listener.close()
        finally:
            os.close(outside)
            os.close(own)

    thread = threading.Thread(target=inside)
    thread.start()
    thread.join(10)
    assert seen == {"answers": [b"FIRST", b"SECOND"], "direct": "refused"}


def test_a_connection_that_cannot_be_made_closes_the_client(echo_server):
    """No socket outside (here: a namespace fd that is no namespace): the harness's connection is closed, not
    left hanging."""
    with open(os.devnull) as nothing:
        listener = socket.create_server(("127.0.0.1", 0))
        forward(listener, connector_from(nothing.fileno(), nothing.fileno(), "127.0.0.1", echo_server))
        with socket.create_connection(listener.getsockname(), timeout=5) as client:
            assert client.recv(1024) == b""
        listener.close()
