"""Real clients for quota tests: producers and consumers that record their progress over time,
and the DescribeClientQuotas/AlterClientQuotas requests kafka-configs.sh sends."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

RECORD = 1024


@dataclass
class Progress:
    """(seconds since start, bytes so far) once per ~0.25 s, and librdkafka's throttle stats."""

    marks: list[tuple[float, int]] = field(default_factory=list)
    throttle_max_ms: int = 0
    throttle_sum_ms: int = 0
    throttle_count: int = 0
    errors: list[Any] = field(default_factory=list)

    def on_stats(self, text: str) -> None:
        for broker in json.loads(text)["brokers"].values():
            if broker.get("nodeid", -1) >= 0:
                t = broker["throttle"]
                self.throttle_max_ms = max(self.throttle_max_ms, t["max"])
                self.throttle_sum_ms += t["sum"]
                self.throttle_count += t["cnt"]

    def bytes_at(self, t: float) -> int:
        """Bytes done by time t (the last mark at or before it)."""
        done = 0
        for at, n in self.marks:
            if at > t:
                break
            done = n
        return done

    def rate(self, start: float, end: float) -> float:
        return (self.bytes_at(end) - self.bytes_at(start)) / (end - start)

    def burst_starts(self, min_bytes: int, within: float, apart: float) -> list[float]:
        """Where bursts begin: the mark just before bytes move, when at least `min_bytes` follow
        within `within` seconds; a burst begins at least `apart` seconds after the one before."""
        starts: list[float] = []
        prev: tuple[float, int] | None = None
        for at, n in self.marks:
            if (prev is not None and n > prev[1] and (not starts or prev[0] >= starts[-1] + apart)
                    and self.bytes_at(prev[0] + within) - prev[1] >= min_bytes):
                starts.append(prev[0])
            prev = (at, n)
        return starts


def run_producer(bootstrap: str, topic: str, client_id: str, seconds: float, progress: Progress,
                 max_rate: float | None = None, stop: threading.Event | None = None,
                 config: dict[str, Any] | None = None) -> None:
    """Produce 1 KiB records flat out (or at most max_rate bytes/s) for `seconds`; `config`
    adds to (or overrides) the producer's settings."""
    done = [0]

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            if err.code() != KafkaError._PURGE_QUEUE:  # the backlog dropped at the end
                progress.errors.append(err)
        else:
            done[0] += len(msg.value())

    p = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5, "acks": 1,
                  "statistics.interval.ms": 500, "stats_cb": progress.on_stats, **(config or {})})
    value = os.urandom(RECORD)
    start = time.monotonic()
    sent = 0
    next_mark = 0.0
    while (elapsed := time.monotonic() - start) < seconds and not (stop and stop.is_set()):
        if max_rate is not None and sent > max_rate * elapsed:
            p.poll(0.005)
        else:
            try:
                p.produce(topic, value, on_delivery=delivered)
                sent += RECORD
            except BufferError:
                p.poll(0.01)
            p.poll(0)
        if elapsed >= next_mark:
            progress.marks.append((elapsed, done[0]))
            next_mark += 0.25
    p.purge(in_flight=False)  # a flat-out producer's backlog is not the measurement
    p.flush(30)
    progress.marks.append((time.monotonic() - start, done[0]))


def run_consumer(bootstrap: str, topic: str, client_id: str, seconds: float, progress: Progress,
                 partitions: int = 1, config: dict[str, Any] | None = None) -> None:
    """Consume from offset 0 for `seconds`; `config` adds to (or overrides) the consumer's settings."""
    c = Consumer({"bootstrap.servers": bootstrap, "client.id": client_id, "group.id": client_id,
                  "enable.auto.commit": False, "statistics.interval.ms": 500,
                  "stats_cb": progress.on_stats, **(config or {})})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    start = time.monotonic()
    done = 0
    next_mark = 0.0
    while (elapsed := time.monotonic() - start) < seconds:
        for msg in c.consume(500, 0.1):
            if msg.error() is None:
                done += len(msg.value())
        if elapsed >= next_mark:
            progress.marks.append((elapsed, done))
            next_mark += 0.25
    progress.marks.append((time.monotonic() - start, done))
    c.close()


def in_thread(target: Any, *args: Any, **kwargs: Any) -> threading.Thread:
    t = threading.Thread(target=target, args=args, kwargs=kwargs, daemon=True)
    t.start()
    return t


def _call(bootstrap: str, request: Any, version: int, response_cls: Any) -> Any:
    host, port = bootstrap.rsplit(":", 1)
    request.with_header(correlation_id=1, client_id="kafka-configs")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request.encode(version=version, header=True, framed=True))
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        data = s.recv(size, socket.MSG_WAITALL)
    header = 5 if version >= 1 else 4  # correlation id, and tagged fields from v1 (flexible)
    return response_cls.decode(data[header:], version=version)


def alter_quota(bootstrap: str, entity: list[tuple[str, str | None]], key: str, value: float | None,
                version: int = 1) -> tuple[int, str | None]:
    """What `kafka-configs.sh --alter --add-config key=value` (or --delete-config) sends."""
    cls: Any = AlterClientQuotasRequest
    req = cls(entries=[cls.EntryData(
        entity=[cls.EntryData.EntityData(entity_type=t, entity_name=n) for t, n in entity],
        ops=[cls.EntryData.OpData(key=key, value=value or 0.0, remove=value is None)])],
        validate_only=False)
    resp = _call(bootstrap, req, version, AlterClientQuotasResponse)
    return resp.entries[0].error_code, resp.entries[0].error_message


def describe_quotas(bootstrap: str, components: list[tuple[str, int, str | None]], strict: bool = True,
                    version: int = 1) -> Any:
    """What `kafka-configs.sh --describe` sends (Strict=true)."""
    cls: Any = DescribeClientQuotasRequest
    req = cls(components=[cls.ComponentData(entity_type=t, match_type=m, match=n) for t, m, n in components],
              strict=strict)
    return _call(bootstrap, req, version, DescribeClientQuotasResponse)


def assert_no_lasting_degradation(log: str) -> None:
    """At most one moment of degradation, and over: on a CI machine running the whole suite, the
    store (or this proxy) can go unscheduled for longer than the watchdog's 2-3 sync intervals
    (CI on 637fffc: once, in a healthy run whose quota was held at 1.02x). Degradation itself is
    tested against real store faults (test_store_sync.py, test_shared_quotas.py's store fault test)."""
    degraded = log.count("enforced as this replica's share")
    assert degraded <= 1 and log.count("answers again") == degraded, log
