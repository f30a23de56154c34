"""The jail's bridge: TCP sockets made in one process (the jail's first, in the machine's network namespace) and
connected by another (PID 1, in the rollout's own), one hop to the recorder."""

from __future__ import annotations

import socket
import threading

import pytest

from forgerl.runners.bridge import connector_through, forward, hand_out_socket, socket_source


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


def test_bytes_cross_the_bridge_on_sockets_the_giver_made(echo_server):
    giver, asker = socket_source()
    handed: list[bool] = []
    giving = threading.Thread(target=lambda: handed.extend(hand_out_socket(giver) for _ in range(2)))
    giving.start()
    listener = socket.create_server(("127.0.0.1", 0))
    forward(listener, connector_through(asker, "127.0.0.1", echo_server))
    for text in (b"first", b"second"):  # each connection gets a socket of its own
        with socket.create_connection(listener.getsockname(), timeout=5) as client:
            client.sendall(text)
            client.shutdown(socket.SHUT_WR)
            assert client.recv(1024) == text.upper()
    giving.join(5)
    assert handed == [True, True]
    listener.close()


def test_a_connection_fails_at_once_when_the_giver_is_gone(echo_server):
    giver, asker = socket_source()
    giver.close()
    with pytest.raises(OSError):
        connector_through(asker, "127.0.0.1", echo_server)()
    assert hand_out_socket(asker) is False  # and a giver whose asker hung up stops giving
