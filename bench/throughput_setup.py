"""What bench.throughput measures against: its sizes, the paths to the broker (direct,
kafka-quota-proxy with and without quotas, tansu proxy), and starting the processes on them."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from bench.wire import Ring, check_produce, produce_frame, record_batch, round_trip
from devkit.processes import LOOPBACK, ProxyProcess, free_port, wait_for_port
from devkit.tansu import Broker, tansu_binary

REPO = Path(__file__).resolve().parent.parent
KIB = 1024
MIB = 1024 * 1024
QUOTA_BYTE_RATE = 1_000_000_000  # per tenant: configured and measured, never reached


@dataclass(frozen=True, slots=True)
class Sizes:
    """How long each measurement runs and how big it is: the default run and the smoke test's."""

    rounds: int = 5  # five, not three: quotas on/off moved by 0.1 between 5 s runs of one build
    warmup: float = 1.5
    seconds: float = 5.0
    connections: int = 4
    inflight: int = 5
    partitions: int = 4
    large_records: int = 1000  # records of 1 KiB per large request: a batch of about 1 MiB
    record_bytes: int = 1024
    fetch_large_batches: int = 16  # Tansu's fetch slows with the batches in a partition: keep few
    fetch_small_batches: int = 200
    tenants: int = 100
    latency_rate: float = 1000.0
    latency_warmup: float = 1.0
    latency_seconds: float = 8.0
    # The proxy holds two descriptors per client connection under a hard limit of 20,000, so
    # about 9,900 is its ceiling here: 9,000 leaves room for listeners, logs and the rest.
    idle_connections: int = 9000
    idle_settle: float = 3.0


SMOKE = Sizes(rounds=1, warmup=0.3, seconds=0.7, large_records=100, fetch_large_batches=4,
              fetch_small_batches=20, tenants=100, latency_warmup=0.2, latency_seconds=0.7,
              idle_connections=300, idle_settle=0.3)

# Paths: the broker direct, kafka-quota-proxy (without quotas, and with the tenants' quotas),
# and tansu proxy.
DIRECT, OURS, OURS_QUOTAS, TANSU = "direct", "ours", "ours+quotas", "tansu"
PATH_TITLES = {DIRECT: "direct to the broker", OURS: "kafka-quota-proxy",
               OURS_QUOTAS: "kafka-quota-proxy, 100 tenants' quotas on", TANSU: "tansu proxy"}


# -- processes ----------------------------------------------------------------------------------


@dataclass
class TansuProxy:
    """`tansu proxy` in front of the broker: the Rust peer the proxy is compared against."""

    origin: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> TansuProxy:
        url = f"tcp://{self.address}"
        self.proc = subprocess.Popen(
            [tansu_binary(), "proxy", "--listener-url", url, "--advertised-listener-url", url,
             "--origin-url", f"tcp://{self.origin}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
        wait_for_port(self.port, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@dataclass(slots=True)
class Route:
    """One path to the broker: the address clients bootstrap from, and the processes on the way."""

    name: str
    bootstrap: str
    pids: dict[str, int]  # role ("proxy", "broker") -> pid

    @property
    def front_pid(self) -> int:
        """The process the clients connect to."""
        return self.pids.get("proxy", self.pids["broker"])


@dataclass
class Bench:
    """The broker and the proxies of one run, with the topics the workloads use."""

    sizes: Sizes
    broker: Broker
    paths: dict[str, Route]
    log: Callable[[str], None]
    admin: Any = None  # a confluent_kafka AdminClient, direct to the broker
    _topics: int = 0

    def __post_init__(self) -> None:
        self.admin = AdminClient({"bootstrap.servers": self.broker.address})

    def create_topic(self, name: str, partitions: int) -> str:
        for f in self.admin.create_topics([NewTopic(name, partitions, 1)]).values():
            f.result(30)
        return name

    def delete_topic(self, name: str) -> None:
        # Tansu's memory storage keeps every record it was sent until the topic goes.
        for f in self.admin.delete_topics([name]).values():
            f.result(30)

    @contextmanager
    def fresh_topic(self, label: str, partitions: int) -> Iterator[str]:
        self._topics += 1
        name = self.create_topic(f"bench-{label}-{self._topics}", partitions)
        try:
            yield name
        finally:
            self.delete_topic(name)

    def prepare(self, topic: str, batches: int, records: int) -> list[int]:
        """Write `batches` batches of `records` records to partition 0; their first offsets."""
        ring = Ring.of([produce_frame(topic, 0, record_batch(records, self.sizes.record_bytes),
                                      "bench-prepare")], 16)
        with socket.create_connection((LOOPBACK, self.broker.port), timeout=30) as sock:
            for i in range(batches):
                problem = check_produce(round_trip(sock, ring.frame(i)), i % ring.count)
                if problem is not None:
                    raise RuntimeError(f"preparing {topic}: {problem}")
        return [i * records for i in range(batches)]


@contextmanager
def started(sizes: Sizes, log: Callable[[str], None]) -> Iterator[Bench]:
    with ExitStack() as stack:
        broker = Broker().start()
        stack.callback(broker.stop)
        node_id = broker.node_id()
        ours = ProxyProcess(broker.address, node_id).start()
        stack.callback(ours.stop)
        quotas = [{"client-id": tenant(i), "producer_byte_rate": QUOTA_BYTE_RATE}
                  for i in range(sizes.tenants)]
        ours_quotas = ProxyProcess(broker.address, node_id, extra_config={"quotas": quotas}).start()
        stack.callback(ours_quotas.stop)
        tansu = TansuProxy(broker.address).start()
        stack.callback(tansu.stop)
        assert broker.proc and ours.proc and ours_quotas.proc and tansu.proc
        b = broker.proc.pid
        paths = {DIRECT: Route(DIRECT, broker.address, {"broker": b})}
        for name, address, pid in ((OURS, ours.bootstrap, ours.proc.pid),
                                   (OURS_QUOTAS, ours_quotas.bootstrap, ours_quotas.proc.pid),
                                   (TANSU, tansu.address, tansu.proc.pid)):
            paths[name] = Route(name, address, {"proxy": pid, "broker": b})
        log(f"broker {broker.address} (node {node_id}), kafka-quota-proxy {ours.bootstrap} and "
            f"{ours_quotas.bootstrap} (quotas), tansu proxy {tansu.address}")
        yield Bench(sizes, broker, paths, log)


def tenant(i: int) -> str:
    return f"tenant-{i:03d}"


def front_role(path: str) -> str:
    """What the clients of `path` connect to: the broker (direct) or a proxy."""
    return "broker" if path == DIRECT else "proxy"
