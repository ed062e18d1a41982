"""The soak's disturbers beside its producers and readers: connections churned and closed abruptly,
quotas changed through the admin API, and the config file rewritten under a running proxy."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from devkit.soak.quota_admin import QuotaAdmin
from devkit.soak.workload import FLUSH_SECONDS, SIZE, Ledger, Worker, record_key


class Churn(Worker):
    """Clients that connect, do a little work and close, one after another, round and round:
    an idempotent librdkafka producer, an idempotent kafka-python producer, an aiokafka producer
    (not idempotent: Tansu refuses aiokafka's InitProducerId), and a kafka-python consumer that
    fetches under a consumer_byte_rate quota."""

    RECORDS = 50

    def __init__(self, bootstrap: str, topic: str, ledger: Ledger, first_index: int) -> None:
        super().__init__("churn")
        self.bootstrap, self.topic, self.ledger = bootstrap, topic, ledger
        self.indexes = {"confluent": first_index, "kafka-python": first_index + 1,
                        "aiokafka": first_index + 2}
        ledger.idempotent.update({first_index, first_index + 1})
        self.seqs = dict.fromkeys(self.indexes, 0)
        self.fetched = 0
        self.steps: list[Callable[[], None]] = [self._confluent, self._kafka_python, self._aiokafka,
                                                self._fetch]

    def run(self) -> None:
        while not self.halt.is_set():
            step = self.steps[self.rounds % len(self.steps)]
            try:
                step()
            except Exception as exc:  # a client library's failure: reported, the soak goes on
                self.fail(f"{step.__name__}: {exc!r}")
            self.rounds += 1
            self.nap(0.5)

    def _keys(self, kind: str) -> list[tuple[int, int]]:
        index, first = self.indexes[kind], self.seqs[kind]
        self.seqs[kind] += self.RECORDS
        return [(index, s) for s in range(first, first + self.RECORDS)]

    def _confluent(self) -> None:
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": self.bootstrap, "client.id": "soak-churn-confluent",
                      "enable.idempotence": True, "linger.ms": 5})

        def delivered(err: Any, msg: Any) -> None:
            index, seq = divmod(int.from_bytes(msg.key(), "big"), 1 << 56)
            if err is None:
                self.ledger.ack(index, seq)
            else:
                self.ledger.error(f"churn confluent: {err}")

        for index, seq in self._keys("confluent"):
            p.produce(self.topic, key=record_key(index, seq), value=b"c" * SIZE, on_delivery=delivered)
        if p.flush(FLUSH_SECONDS):
            self.fail("confluent: not flushed")
        del p  # the handle is destroyed and its connections closed here

    def _kafka_python(self) -> None:
        from kafka import KafkaProducer

        p = KafkaProducer(bootstrap_servers=self.bootstrap, client_id="soak-churn-kafka-python",
                          enable_idempotence=True, acks="all")
        futures = [(index, seq, p.send(self.topic, key=record_key(index, seq), value=b"k" * SIZE))
                   for index, seq in self._keys("kafka-python")]
        p.flush(timeout=FLUSH_SECONDS)
        for index, seq, f in futures:
            try:
                f.get(timeout=1)
            except Exception as exc:
                self.ledger.error(f"churn kafka-python: {exc!r}", cause=exc)
            else:
                self.ledger.ack(index, seq)
        p.close(timeout=10)

    def _aiokafka(self) -> None:
        from aiokafka import AIOKafkaProducer

        async def work() -> None:
            p = AIOKafkaProducer(bootstrap_servers=self.bootstrap, client_id="soak-churn-aiokafka",
                                 acks="all")
            await p.start()
            try:
                for index, seq in self._keys("aiokafka"):
                    await p.send_and_wait(self.topic, key=record_key(index, seq), value=b"a" * SIZE)
                    self.ledger.ack(index, seq)
            finally:
                await p.stop()

        asyncio.run(work())

    def _fetch(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        c = KafkaConsumer(bootstrap_servers=self.bootstrap, client_id="soak-churn-fetch",
                          enable_auto_commit=False, consumer_timeout_ms=3000)
        c.assign([TopicPartition(self.topic, 0)])
        c.seek_to_beginning()
        for n, _ in enumerate(c, 1):
            self.fetched += 1
            if n >= 2000:
                break
        c.close()


class AbruptCloser(Worker):
    """Connections that end without a goodbye (a reset, SO_LINGER 0), round and round: right after
    connecting, in the middle of a request frame, and with a request in flight."""

    EVERY_SECONDS = 10.0

    def __init__(self, host: str, port: int) -> None:
        super().__init__("abrupt")
        self.address = (host, port)

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                with socket.create_connection(self.address, timeout=10) as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    frame = _metadata_request(self.rounds)
                    if self.rounds % 3 == 1:
                        s.sendall(frame[: len(frame) // 2])
                    elif self.rounds % 3 == 2:
                        s.sendall(frame)
                    # leaving the block closes the socket: a reset, with SO_LINGER 0
            except OSError as exc:
                self.fail(f"abrupt: {exc!r}")
            self.rounds += 1
            self.nap(self.EVERY_SECONDS)


def _metadata_request(correlation_id: int) -> bytes:
    from kafka.protocol.metadata import MetadataRequest

    req: Any = MetadataRequest[1](topics=None)
    req.with_header(correlation_id=correlation_id, client_id="soak-abrupt")
    return bytes(req.encode(version=1, header=True, framed=True))


class QuotaChanger(Worker):
    """AlterClientQuotas every `every` seconds: the throttled producer's producer_byte_rate goes
    round `values`; every fifth change is read back with DescribeClientQuotas."""

    def __init__(self, host: str, port: int, client_id: str, values: list[int], every: float) -> None:
        super().__init__("quota-changer")
        self.admin = QuotaAdmin(host, port)
        self.client_id, self.values, self.every = client_id, values, every
        self.changes = 0

    def run(self) -> None:
        while not self.halt.is_set():
            value = self.values[self.rounds % len(self.values)]
            try:
                code = self.admin.alter([("client-id", self.client_id)], "producer_byte_rate", value)
                if code != 0:
                    self.fail(f"AlterClientQuotas: error code {code}")
                else:
                    self.changes += 1
                if self.rounds % 5 == 0:
                    described = self.admin.describe(self.client_id)
                    if described != {"producer_byte_rate": float(value)}:
                        self.fail(f"DescribeClientQuotas: {described}, expected {value}")
            except OSError as exc:
                self.fail(f"quota admin: {exc!r}")
            self.rounds += 1
            self.halt.wait(self.every)
        self.admin.close()


class ConfigRewriter(Worker):
    """Rewrites the proxy's YAML every `every` seconds, its `quotas:` list going round `variants`.
    The file is replaced (a temporary file renamed over it), as an editor or a config manager does."""

    def __init__(self, path: Path, variants: list[list[dict[str, Any]]], every: float) -> None:
        super().__init__("config-rewriter")
        self.path, self.variants, self.every = path, variants, every
        self.rewrites = 0

    def write(self, quotas: list[dict[str, Any]]) -> None:
        config = yaml.safe_load(self.path.read_text())
        config["quotas"] = quotas
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config))
        os.replace(tmp, self.path)

    def run(self) -> None:
        while not self.halt.wait(self.every):
            self.rounds += 1
            try:
                self.write(self.variants[self.rounds % len(self.variants)])
                self.rewrites += 1
            except OSError as exc:
                self.fail(f"config rewrite: {exc!r}")
