"""Free loopback ports, and kafka-quota-proxy as a real process on them (Tansu is in devkit.tansu)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parents[1]  # the checkout this devkit belongs to


_handed_out: set[int] = set()

# Under pytest-xdist each worker process (PYTEST_XDIST_WORKER = gw0, gw1, ...) takes its ports
# from its own slice of 20000-31999, below Linux's ephemeral range (32768-60999): the kernel then
# never offers one of them to another worker, to a `bind(0)` or as a client's source port, so
# two workers cannot be handed the same port. Each one is still checked free before it is handed out.
_WORKER_PORTS = (20000, 32000)
_cursor: int | None = None


def _worker_slice() -> range | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return None
    index = int(worker[2:])
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), index + 1)
    width = (_WORKER_PORTS[1] - _WORKER_PORTS[0]) // count
    start = _WORKER_PORTS[0] + index * width
    return range(start, start + width)


def is_free(port: int) -> bool:
    """Whether `port` can be bound on the loopback address now (another may take it after)."""
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nothing listens on, never one this process handed out before: the kernel may
    offer a just-released port again, and two of a proxy's ports once came out equal (CI:
    "node_ports.111: must differ from the listen port"). Under pytest-xdist, one from this
    worker's own slice (above)."""
    ports = _worker_slice()
    if ports is not None:
        return _free_port_in(ports)
    while True:
        with socket.socket() as s:
            s.bind((LOOPBACK, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def _free_port_in(ports: range) -> int:
    """The next free port of `ports` after the last one handed out, round and round: a port
    comes back only after the whole slice has gone by, and then only if it is free again."""
    global _cursor
    if _cursor is None or _cursor not in ports:
        _cursor = ports.start
    for _ in range(2 * len(ports)):
        port = _cursor
        _cursor = port + 1 if port + 1 < ports.stop else ports.start
        if _cursor == ports.start:
            _handed_out.difference_update(ports)  # a lap done: the oldest may be handed out again
        if port not in _handed_out and is_free(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: have the kernel SIGKILL the child if this process dies without cleaning up
    (`preexec_fn` of the servers devkit starts: Tansu, weed).

    Strictly, when the thread that started it ends: start servers from a thread that outlives
    it (the main thread, as the demo, the tests and the benchmarks do)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def log_tail(path: Path | None, lines: int = 15) -> str:
    """The last lines of a child's log file ("" if there is none)."""
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def wait_for_port(port: int, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port} after {timeout}s")


# Every ProxyProcess started in this process, newest last: the test suite's failure report adds
# the log tail and exit status of those a failed test started (tests/conftest.py).
STARTED: list[ProxyProcess] = []


@dataclass
class ProxyProcess:
    """kafka-quota-proxy run through its console entry point, as a user runs it."""

    upstream: str
    node_id: int
    extra_config: dict = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    node_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    config_path: Path | None = None
    # The interpreter that runs it: this one, or another install's (a fresh venv's, say).
    python: str = sys.executable

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def config(self) -> dict:
        return {
            "upstream": self.upstream,
            "listen": f"{LOOPBACK}:{self.port}",
            "node_ports": {self.node_id: self.node_port},
            "metrics": f"{LOOPBACK}:{self.metrics_port}",
            "log_level": "INFO",
            **self.extra_config,
        }

    def env(self) -> dict[str, str] | None:
        """The child's environment: this checkout first on PYTHONPATH when it runs this interpreter.
        `python -m` puts only the working directory first, and from any other folder the venv's
        editable install answers, which may be another checkout's (a git worktree sharing the main
        tree's venv). Another interpreter (a plain install's) and a PYTHONPATH already set
        (bench.ab's) are left to choose."""
        if self.python != sys.executable or os.environ.get("PYTHONPATH"):
            return None
        return {**os.environ, "PYTHONPATH": str(REPO)}

    def start(self, wait_for_broker: bool = True) -> ProxyProcess:
        tmp = Path(tempfile.mkdtemp(prefix="kqp-"))
        self.config_path = tmp / "proxy.yaml"
        self.config_path.write_text(yaml.safe_dump(self.config()))
        self.log_path = tmp / "proxy.log"
        env = self.env()
        STARTED.append(self)
        with open(self.log_path, "wb") as log:
            # Where the caller chose the code (another interpreter, a PYTHONPATH of its own), the
            # child starts in its own folder: `python -m` puts the working directory first, and
            # from a checkout that imported the checkout's code, not the install under test.
            self.proc = subprocess.Popen(
                [self.python, "-m", "kafka_quota_proxy", "--config", str(self.config_path)],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp if env is None else None)
        wait_for_port(self.port, proc=self.proc)
        if self.workers > 1:
            self.wait_for_workers()
        if wait_for_broker:
            wait_for_port(self.node_port, proc=self.proc)
        return self

    @property
    def workers(self) -> int:
        return int(self.config().get("workers", 1))

    def wait_for_workers(self, count: int | None = None, timeout: float = 60.0) -> None:
        """Until `count` (default: all) workers serve, as the supervisor's metrics say."""
        want = self.workers if count is None else count
        deadline = time.monotonic() + timeout
        while self.metric("kafka_quota_proxy_workers") != want:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the supervisor exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{want} workers not serving after {timeout}s")
            time.sleep(0.1)

    def worker_pids(self) -> list[int]:
        """The pids of the supervisor's workers (its children running the proxy), by index."""
        import psutil

        assert self.proc is not None
        found: dict[int, int] = {}
        for child in psutil.Process(self.proc.pid).children():
            with contextlib.suppress(psutil.Error):
                cmd = child.cmdline()
                if "--worker-role" in cmd:
                    role = json.loads(cmd[cmd.index("--worker-role") + 1])
                    found[role["index"]] = child.pid
        return [found[i] for i in sorted(found)]

    def log_text(self) -> str:
        assert self.log_path is not None
        return self.log_path.read_text()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample, 0.0 if absent."""
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
                       if labels else "")
        for line in self.metrics().splitlines():
            if line.startswith(want + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            workers = self.worker_pids() if self.workers > 1 else []
            private = self._supervisor_dir()
            self.proc.kill()
            self.proc.wait(10)
            _kill_all(workers)  # the kernel SIGTERMs them; a test does not wait for their drains
            if private is not None:  # what a killed supervisor leaves (docs/deployment.md)
                shutil.rmtree(private, ignore_errors=True)

    def _supervisor_dir(self) -> Path | None:
        """The supervisor's private directory, where its workers' metrics sockets are."""
        import psutil

        assert self.proc is not None
        for child in psutil.Process(self.proc.pid).children():
            with contextlib.suppress(psutil.Error, ValueError, IndexError, KeyError):
                cmd = child.cmdline()
                role = json.loads(cmd[cmd.index("--worker-role") + 1])
                return Path(role["metrics_socket"]).parent
        return None


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
