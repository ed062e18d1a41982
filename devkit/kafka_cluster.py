"""A Kafka cluster for the tests and benches: brokers and one dedicated KRaft controller from
devkit.kafka's nodes, on free loopback ports."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from devkit.kafka import KafkaBroker
from devkit.kafka_jvm import LOOPBACK, free_port, lib_dir, new_cluster_id


@dataclass
class KafkaCluster:
    """`brokers` broker-only nodes (ids 1..N) and one dedicated KRaft controller (id 0), each
    its own process on its own free loopback ports. A single broker stops, is killed and
    restarts through its node: `cluster.broker(2).kill()`."""

    brokers: int = 3
    scram_users: Mapping[str, str] = field(default_factory=dict)
    sasl: bool = False  # a SASL_PLAINTEXT listener on every broker
    delegation_tokens: bool = False  # on every node, with one secret key (KafkaBroker's)
    heap: str = "512m"
    lib: Path | None = None
    # One folder per node below it; None: a temporary one, removed by close() or at exit.
    directory: Path | None = None
    controller: KafkaBroker = field(init=False)
    nodes: list[KafkaBroker] = field(init=False)
    own_directory: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.lib = lib_dir(self.lib)
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="kafka-cluster-"))
            self.own_directory = True
            atexit.register(self.close)
        root = self.directory
        cluster_id = new_cluster_id()
        self.controller = KafkaBroker(node_id=0, roles="controller", cluster_id=cluster_id,
                                      heap=self.heap, lib=self.lib, directory=root / "controller-0",
                                      scram_users=self.scram_users, delegation_tokens=self.delegation_tokens)
        voters = f"0@{LOOPBACK}:{self.controller.controller_port}"
        self.nodes = [KafkaBroker(node_id=i, roles="broker", voters=voters, cluster_id=cluster_id,
                                  heap=self.heap, lib=self.lib, directory=root / f"broker-{i}",
                                  sasl_port=free_port() if self.sasl else None,
                                  delegation_tokens=self.delegation_tokens)
                      for i in range(1, self.brokers + 1)]

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes)

    def broker(self, node_id: int) -> KafkaBroker:
        return next(n for n in self.nodes if n.node_id == node_id)

    def start(self, timeout: float = 120.0) -> KafkaCluster:
        """Format every node side by side, start the controller and then all brokers, and wait
        until each lists itself in Metadata; every node stopped if one fails."""
        everyone = [self.controller, *self.nodes]
        try:
            with ThreadPoolExecutor(len(everyone)) as pool:
                list(pool.map(KafkaBroker.format, everyone))
            self.controller.launch()
            for node in self.nodes:
                node.launch()
            for node in everyone:
                node.wait(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Brokers first: their controlled shutdown asks the controller."""
        running = [n for n in self.nodes if not n.stopped]
        try:
            with ThreadPoolExecutor(max(len(running), 1)) as pool:
                list(pool.map(KafkaBroker.stop, running))
        except RuntimeError:  # at exit no new thread starts: one after the other
            for node in running:
                node.stop()
        self.controller.stop()

    def close(self) -> None:
        """stop(), then remove the directory if the cluster made it itself."""
        self.stop()
        if self.own_directory and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.own_directory = False
            atexit.unregister(self.close)
