"""The supervisor of `--workers N`: N proxy processes on one host behind the same ports.

Each worker is this same program, started again (`python -m kafka_quota_proxy`, the supervisor's
own arguments and a hidden `--worker-role`), so it has its own interpreter, event loop (uvloop)
and threads: nothing is forked from a process that already runs a loop or threads. Every worker
opens the bootstrap and per-broker listeners itself with SO_REUSEPORT, and the kernel spreads
new connections among them.

The supervisor itself serves no Kafka traffic. It
- checks the bootstrap port is free (one error line, exit 1, before any worker starts);
- starts the quota store the workers share when none is configured (store/embedded.py);
- starts worker 0, then the rest once it serves; restarts a worker that dies, with backoff and
  one log line; gives up (exit 1) when workers keep dying before they serve;
- serves the one --metrics endpoint: every worker's metrics merged (workers/merge.py);
- on SIGTERM or SIGINT, passes the signal on, waits for every worker's drain, exits 0.
Workers and the store get SIGTERM from the kernel if the supervisor is killed (proxy/parent_death.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from kafka_quota_proxy.config import HostPort, Settings
from kafka_quota_proxy.config.worker_settings import WORKER_ROLE_FLAG, WorkerRole
from kafka_quota_proxy.proxy.observability.metrics import METRIC_PREFIX
from kafka_quota_proxy.proxy.observability.metrics_socket import read_metrics
from kafka_quota_proxy.proxy.store.embedded import EmbeddedStore, EmbeddedStoreError, start_embedded_store
from kafka_quota_proxy.proxy.workers.merge import Retired, merge

log = logging.getLogger("kafka_quota_proxy.workers")

POLL_SECONDS = 0.1
FIRST_READY_TIMEOUT_SECONDS = 60.0  # worker 0's start: imports, config, listeners
RESTART_DELAYS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # backoff between restarts of one worker
STABLE_SECONDS = 30.0  # a worker that served this long starts its backoff afresh when it dies
START_FAILURES_LIMIT = 5  # deaths before serving, in a row, after which the supervisor gives up
SCRAPE_TIMEOUT_SECONDS = 10.0
KILL_GRACE_SECONDS = 10.0  # beyond shutdown_timeout_seconds, before SIGKILL


class StartError(Exception):
    """The supervisor could not start (a port in use, the store); one line, exit 1."""


@dataclass
class Slot:
    """One worker position: its process while it runs, and its restart bookkeeping."""

    role: WorkerRole
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ready: bool = False
    restart_at: float = 0.0
    restarts: int = 0  # in a row, for the backoff
    start_failures: int = 0  # deaths before serving, in a row

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Supervisor:
    """Runs N workers until a signal; `run` returns the exit status."""

    def __init__(self, settings: Settings, argv: Sequence[str]) -> None:
        self.settings = settings
        self.argv = list(argv)
        self.tmp = Path(tempfile.mkdtemp(prefix="kafka-quota-proxy-"))
        self.store: EmbeddedStore | None = None
        self.slots: list[Slot] = []
        self.stop_signal: int | None = None
        self._wake = threading.Event()
        self.registry = CollectorRegistry()
        self.collector = WorkersCollector(self)
        self.registry.register(self.collector)
        Gauge(METRIC_PREFIX + "workers", "Worker processes alive and serving",
              registry=self.registry).set_function(lambda: sum(s.alive and s.ready for s in self.slots))
        self.restarts = Counter(METRIC_PREFIX + "worker_restarts", "Worker processes restarted "
                                "after they died", registry=self.registry)
        self._metrics_server: Any = None

    def run(self) -> int:
        try:
            if not sys.platform.startswith("linux"):
                raise StartError("--workers needs Linux: its SO_REUSEPORT spreads connections "
                                 "over the workers, and its parent-death signal stops them")
            check_port_free(self.settings.listen, "listen")
            store_url = self._start_store()
            for i in range(self.settings.workers):
                self.slots.append(Slot(WorkerRole(i, self.settings.workers, os.getpid(),
                                                  str(self.tmp / f"w{i}.metrics"), store_url)))
            if self.settings.metrics is not None:
                m = self.settings.metrics
                try:
                    self._metrics_server, _ = start_http_server(m.port, m.host, registry=self.registry)
                except OSError as exc:
                    raise StartError(f"metrics {m}: {exc.strerror or exc}") from None
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
            log.info("supervisor %d: starting %d workers", os.getpid(), len(self.slots))
            if not self._start_first():
                return 1
            for slot in self.slots[1:]:
                if self.stop_signal is None:
                    self._start(slot)
            return self._supervise()
        except StartError as exc:
            print(f"kafka-quota-proxy: cannot start: {exc}", file=sys.stderr)
            return 1
        finally:
            self._stop_all()
            if self._metrics_server is not None:
                self._metrics_server.shutdown()
                self._metrics_server.server_close()
            if self.store is not None:
                self.store.stop()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _start_store(self) -> str | None:
        # A configured `store:` is used as it is (each worker syncs with it as a replica of its
        # own); the embedded one is started only when there is none.
        if self.settings.store is not None:
            return None
        try:
            self.store = start_embedded_store(self.tmp)
        except EmbeddedStoreError as exc:
            raise StartError(f"the embedded quota store: {exc}") from None
        log.info("quota store for the workers: embedded Valkey at %s", self.store.url)
        return self.store.url

    # -- workers ---------------------------------------------------------------------------------

    def _start(self, slot: Slot) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(slot.role.metrics_socket)
        cmd = [sys.executable, "-m", "kafka_quota_proxy", *self.argv,
               WORKER_ROLE_FLAG, slot.role.encode()]
        slot.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        slot.started = time.monotonic()
        slot.ready = False

    def _check_ready(self, slot: Slot) -> None:
        if not slot.ready and slot.alive and os.path.exists(slot.role.metrics_socket):
            slot.ready = True
            slot.start_failures = 0
            # A restart was announced by the death's own line.
            log.log(logging.DEBUG if slot.restarts else logging.INFO, "worker %d (pid %d) serving",
                    slot.role.index, slot.proc.pid if slot.proc else -1)

    def _start_first(self) -> bool:
        """Worker 0 alone first: a start-up problem every worker would share shows once."""
        first = self.slots[0]
        self._start(first)
        deadline = time.monotonic() + FIRST_READY_TIMEOUT_SECONDS
        while not first.ready:
            if self.stop_signal is not None:
                return True  # _supervise stops it
            self._check_ready(first)
            assert first.proc is not None
            if first.proc.poll() is not None:
                print(f"kafka-quota-proxy: worker 0 exited with status {first.proc.returncode} "
                      "before it served; not starting the others", file=sys.stderr)
                return False
            if time.monotonic() > deadline:
                print(f"kafka-quota-proxy: worker 0 did not serve within "
                      f"{FIRST_READY_TIMEOUT_SECONDS:.0f}s; stopping", file=sys.stderr)
                return False
            self._wake.wait(POLL_SECONDS)
        return True

    def _supervise(self) -> int:
        while self.stop_signal is None:
            now = time.monotonic()
            for slot in self.slots:
                self._check_ready(slot)
                if slot.proc is not None and slot.proc.poll() is not None:
                    if not self._died(slot, now):
                        return 1
                elif slot.proc is None and now >= slot.restart_at:
                    self._start(slot)
            self._wake.wait(POLL_SECONDS)
        return 0

    def _died(self, slot: Slot, now: float) -> bool:
        """Schedule the restart of a dead worker; False when workers keep dying at start."""
        assert slot.proc is not None
        status, lived, pid = slot.proc.returncode, now - slot.started, slot.proc.pid
        slot.proc = None
        if not slot.ready:
            slot.start_failures += 1
            if slot.start_failures >= START_FAILURES_LIMIT:
                log.error("worker %d exited with status %s before it served, %d times in a row; "
                          "stopping", slot.role.index, status, slot.start_failures)
                return False
        if slot.ready and lived >= STABLE_SECONDS:
            slot.restarts = 0
        delay = RESTART_DELAYS[min(slot.restarts, len(RESTART_DELAYS) - 1)]
        slot.restarts += 1
        slot.restart_at = now + delay
        slot.ready = False
        self.restarts.inc()
        log.error("worker %d (pid %d) exited with status %s after %.1fs; restarting it in %.1fs",
                  slot.role.index, pid, status, lived, delay)
        return True

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
        self._wake.set()

    def _stop_all(self) -> None:
        """Pass the stop signal to every worker, wait for their drains, then kill what is left."""
        live = [s for s in self.slots if s.alive]
        if not live:
            return
        sig = self.stop_signal or signal.SIGTERM
        log.info("stopping %d workers (%s): each drains its connections, up to %.0fs", len(live),
                 signal.Signals(sig).name, self.settings.shutdown_timeout_seconds)
        for slot in live:
            assert slot.proc is not None
            with contextlib.suppress(ProcessLookupError):
                slot.proc.send_signal(sig)
        deadline = time.monotonic() + self.settings.shutdown_timeout_seconds + KILL_GRACE_SECONDS
        for slot in live:
            assert slot.proc is not None
            try:
                slot.proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.error("worker %d (pid %d) still running after its drain; killing it",
                          slot.role.index, slot.proc.pid)
                slot.proc.kill()
                slot.proc.wait()
        log.info("all workers stopped")

    @property
    def shares_store(self) -> bool:
        """Whether the workers sync their quota state through a store (metrics merge differently):
        the configured one, or the embedded one started for them."""
        return self.settings.store is not None or self.store is not None

    def serving(self) -> list[tuple[Slot, int]]:
        """The workers that serve now, with their pids."""
        return [(s, s.proc.pid) for s in self.slots if s.proc is not None and s.alive and s.ready]


class WorkersCollector(Collector):
    """The supervisor's /metrics: every serving worker's metrics, read from its socket at scrape
    time and merged (workers/merge.py). A worker that does not answer in time is shown as last
    read; the counts of a worker that is gone carry on (merge.Retired)."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.lock = threading.Lock()
        self.last: dict[int, tuple[int, list[Metric]]] = {}  # index -> (pid, families)
        self.retired = Retired()
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="scrape")

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            serving = self.supervisor.serving()
            reads = {slot.role.index: self.pool.submit(read_metrics, slot.role.metrics_socket,
                                                       SCRAPE_TIMEOUT_SECONDS)
                     for slot, _ in serving}
            pids = {slot.role.index: pid for slot, pid in serving}
            shared = self.supervisor.shares_store
            for index, (pid, families) in list(self.last.items()):
                if pids.get(index) != pid:  # died (and perhaps restarted) since the last scrape
                    self.retired.add(families, shared)
                    del self.last[index]
            for index, future in reads.items():
                try:
                    text = future.result()
                except OSError as exc:
                    log.warning("metrics of worker %d not read (%s); showing its last", index, exc)
                    continue
                self.last[index] = (pids[index], list(text_string_to_metric_families(text)))
            merged = merge([families for _, families in self.last.values()], self.retired, shared)
        return iter(merged)


def check_port_free(address: HostPort, key: str) -> None:
    """Raise StartError if something listens on `address` already. The workers bind it with
    SO_REUSEPORT, which would otherwise let them join another process's listeners silently."""
    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise StartError(f"{key} {address}: {exc.strerror or exc}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(addr)
        except OSError as exc:
            raise StartError(f"{key} {address}: {exc.strerror or exc}") from None
