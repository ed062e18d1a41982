"""10,000 records of random sizes, with keys and headers, produced through the proxy by
librdkafka and consumed through it by kafka-python: complete, byte-exact, in order per partition,
with the bulk of the large Fetch responses moved by splice(2)."""

from __future__ import annotations

import hashlib
import random

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, TopicPartition

from devkit.processes import ProxyProcess

pytestmark = pytest.mark.integration

RECORDS = 10_000
PARTITIONS = 4


def make_records(seed: int) -> list[tuple[int, bytes, bytes, list[tuple[str, bytes]]]]:
    rng = random.Random(seed)
    big = set(rng.sample(range(RECORDS), 12))  # a few records from 256 KiB up to 1 MiB
    records = []
    for i in range(RECORDS):
        size = rng.randint(256 * 1024, 1024 * 1024) if i in big else rng.randint(0, 16 * 1024 - 1)
        value = rng.randbytes(size)
        key = f"key-{i}-{rng.randint(0, 1 << 30)}".encode()
        headers = [("seq", str(i).encode()), ("sha", hashlib.sha256(value).digest()[:8])]
        records.append((i % PARTITIONS, key, value, headers))
    return records


def test_ten_thousand_records_byte_exact_in_order(proxy: ProxyProcess, topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.create_topics([NewTopic(topic_name, num_partitions=PARTITIONS, replication_factor=1)])[
        topic_name].result(30)
    records = make_records(seed=20261121)

    errors: list[object] = []
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 10,
                         "message.max.bytes": 2 * 1024 * 1024})
    for partition, key, value, headers in records:
        while True:
            try:
                producer.produce(topic_name, value=value, key=key, headers=headers, partition=partition,
                                 on_delivery=lambda err, _msg: err and errors.append(err))
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(120) == 0
    assert errors == []

    expected = {p: [(k, v, h) for (pp, k, v, h) in records if pp == p] for p in range(PARTITIONS)}
    consumer = KafkaConsumer(bootstrap_servers=proxy.bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=15000, max_partition_fetch_bytes=2 * 1024 * 1024,
                             fetch_max_bytes=8 * 1024 * 1024)
    tps = [TopicPartition(topic_name, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    consumer.seek_to_beginning()
    got: dict[int, list[tuple[bytes, bytes, list[tuple[str, bytes]]]]] = {p: [] for p in range(PARTITIONS)}
    offsets: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    total = 0
    for msg in consumer:
        got[msg.partition].append((msg.key, msg.value, list(msg.headers)))
        offsets[msg.partition].append(msg.offset)
        total += 1
        if total == RECORDS:
            break
    consumer.close()
    for p in range(PARTITIONS):
        assert offsets[p] == list(range(len(expected[p])))
        assert len(got[p]) == len(expected[p])
        assert got[p] == expected[p], f"partition {p} differs"
    # The large fetches came by splice(2), most of their bytes never entering the proxy's memory.
    spliced = proxy.metric("kafka_quota_proxy_spliced_bytes_total")
    fetched = proxy.metric("kafka_quota_proxy_response_bytes_total", api="Fetch")
    assert 0.5 * fetched < spliced < fetched
