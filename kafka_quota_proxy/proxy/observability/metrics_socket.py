"""A worker's metrics on a Unix socket, for its supervisor to merge: connect, read the
Prometheus text exposition to the end, done. No HTTP: only the supervisor reads it, and a socket
in the supervisor's private directory needs no port and cannot be reached from the network.

Served from a thread, as the HTTP endpoint of a lone process is, so a scrape never runs on the
event loop (the quota collector hands its own part to the loop; observability/quota_metrics.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import threading

from prometheus_client import CollectorRegistry, generate_latest


class MetricsSocket:
    """Serves `registry` on the Unix socket `path` until `close`."""

    def __init__(self, path: str, registry: CollectorRegistry) -> None:
        self.path = path
        registry_ = registry

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                with contextlib.suppress(OSError):  # the supervisor gave up waiting
                    self.wfile.write(generate_latest(registry_))

        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a previous worker's, in the same slot
        # Bound under a temporary name and renamed into place: the supervisor takes the socket's
        # appearance for "this worker is serving", so it must appear ready to answer.
        staging = f"{path}.{os.getpid()}"
        self.server = socketserver.ThreadingUnixStreamServer(staging, Handler)
        self.server.daemon_threads = True
        os.rename(staging, path)
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics-socket",
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def read_metrics(path: str, timeout: float) -> str:
    """One worker's exposition, read from its socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        chunks = []
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    return b"".join(chunks).decode()
