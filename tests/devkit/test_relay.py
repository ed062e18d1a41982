"""devkit.relay, the fault-injecting TCP relay of the broker-fault runs, against an echo server."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from devkit.processes import LOOPBACK
from devkit.relay import Relay


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socket.create_server((LOOPBACK, 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def echo(conn: socket.socket) -> None:
        with conn, contextlib.suppress(ConnectionResetError):  # the relay's cut() resets it
            while data := conn.recv(4096):
                conn.sendall(data)

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join(5)
    server.close()


@pytest.fixture
def relay(echo_port: int) -> Iterator[Relay]:
    r = Relay(echo_port).start()
    yield r
    r.stop()


def connect(relay: Relay) -> socket.socket:
    sock = socket.create_connection((LOOPBACK, relay.port), timeout=5)
    sock.sendall(b"hello")
    assert sock.recv(5) == b"hello"
    return sock


def test_forwards_both_ways_and_counts_connections(relay: Relay) -> None:
    with connect(relay), connect(relay):
        assert relay.connections == 2
        assert relay.accepted == 2


def test_cut_resets_every_connection(relay: Relay) -> None:
    with connect(relay) as a, connect(relay) as b:
        assert relay.cut() == 2
        for sock in (a, b):
            with pytest.raises(ConnectionResetError):
                sock.recv(1)
        assert relay.connections == 0
    with connect(relay):  # new connections pass again
        pass


def test_blackhole_holds_bytes_until_it_ends(relay: Relay) -> None:
    with connect(relay) as sock:
        relay.blackhole(0.6)
        started = time.monotonic()
        sock.sendall(b"held")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(4)
        sock.settimeout(5)
        assert sock.recv(4) == b"held"  # nothing dropped, only late
        assert time.monotonic() - started >= 0.55


def test_delay_adds_latency(relay: Relay) -> None:
    with connect(relay) as sock:
        relay.delay(0.2)
        started = time.monotonic()
        sock.sendall(b"x")
        assert sock.recv(1) == b"x"
        assert time.monotonic() - started >= 0.4  # once each way
