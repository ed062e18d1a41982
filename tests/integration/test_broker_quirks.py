"""Kafka-compatible brokers that differ from Kafka, through the proxy (docs/reliability.md,
"Broker quirks"). Tansu answers Produce requests sent with acks=0, which Kafka never does."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.tansu_perf import Load, log_end, perf_produce
from devkit.processes import ProxyProcess
from devkit.tansu import Broker

pytestmark = pytest.mark.integration


def create_topic(broker: Broker, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.address})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)


def records_at(broker: Broker, topic: str, expect: int) -> list[int]:
    """The sequence numbers of partition 0's records, read directly from the broker until
    `expect` have come or 10 s pass with none (acks=0 records may still be on their way)."""
    c = Consumer({"bootstrap.servers": broker.address, "group.id": "quirks", "enable.auto.commit": False,
                  "fetch.max.bytes": 50 * 1024 * 1024})
    c.assign([TopicPartition(topic, 0, 0)])
    seen: list[int] = []
    quiet_until = time.monotonic() + 10
    try:
        while len(seen) < expect and time.monotonic() < quiet_until:
            for msg in c.consume(10_000, 0.5):
                if msg.error() is None:
                    seen.append(int(msg.value()[:7]))
                    quiet_until = time.monotonic() + 10
        return seen
    finally:
        c.close()


def broker_errors(proxy: ProxyProcess) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in proxy.metrics().splitlines()
               if line.startswith('kafka_quota_proxy_protocol_errors_total{kind="broker_'))


def test_librdkafka_acks0_producer_sends_100k_records_without_reconnecting(
        broker: Broker, proxy: ProxyProcess, topic_name: str) -> None:
    create_topic(broker, topic_name)
    errors_before = broker_errors(proxy)
    stats: list[dict] = []
    failures: list[KafkaError] = []
    p = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "0", "linger.ms": 5,
                  "statistics.interval.ms": 500, "stats_cb": lambda s: stats.append(json.loads(s)),
                  "error_cb": failures.append})
    for i in range(100_000):
        while True:
            try:
                p.produce(topic_name, value=b"%07d" % i + b"." * 93)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(60) == 0
    # With acks=0, flush() returns once the requests are written, while the broker may still be
    # seconds behind: close the producer before then and the kernel resets the connection under
    # Tansu's unread answers, which discards requests not yet read, directly or through the
    # proxy (docs/reliability.md). So the records are read back with the producer still connected.
    assert records_at(broker, topic_name, 100_000) == list(range(100_000))  # all there, in order
    p.poll(1.0)  # one more statistics report after the last request
    assert failures == []
    last = stats[-1]["brokers"]
    # One connection to the broker, never dropped (before the fix, each answer to an acks=0
    # Produce closed it); the bootstrap connection is librdkafka's own business.
    (node,) = [b for b in last.values() if b["nodeid"] >= 0]
    assert (node["connects"], node["disconnects"]) == (1, 0)
    # The records went as many requests, and every answer Tansu gave came back through.
    assert node["tx"] > 10 and node["rx"] == node["tx"]
    assert broker_errors(proxy) == errors_before
    del p


def test_tansu_perf_produce_runs_through_the_proxy(
        broker: Broker, proxy: ProxyProcess, topic_name: str) -> None:
    create_topic(broker, topic_name)
    requests_before = proxy.metric("kafka_quota_proxy_requests_total", api="Produce")
    answered_before = proxy.metric("kafka_quota_proxy_response_bytes_total", api="Produce")
    errors_before = broker_errors(proxy)
    load = Load("t", "t", batch_size=10, record_size=100, producers=1)
    done = perf_produce(proxy.bootstrap, topic_name, load, seconds=2)
    assert done.returncode == 0, done.stderr[-2000:]
    requests = proxy.metric("kafka_quota_proxy_requests_total", api="Produce") - requests_before
    # Before the fix it stopped after its first request: the proxy closed the connection.
    assert requests > 100
    assert log_end(broker.address, topic_name) >= requests  # at least a record a request
    # Every request's answer went back to it (an empty Produce v11 response is more than 30 bytes).
    answered = proxy.metric("kafka_quota_proxy_response_bytes_total", api="Produce") - answered_before
    assert answered > 30 * requests
    assert broker_errors(proxy) == errors_before
