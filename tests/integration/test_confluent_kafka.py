"""librdkafka (confluent-kafka) through the proxy to a real Tansu broker."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.processes import ProxyProcess

pytestmark = pytest.mark.integration


def create_topic(bootstrap: str, name: str, partitions: int) -> AdminClient:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    futures[name].result(timeout=30)
    return admin


def produce(bootstrap: str, topic: str, n: int, **conf: object) -> list[tuple[int, int]]:
    """Produce n records; return (partition, offset) of each delivered record."""
    delivered: list[tuple[int, int]] = []
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: object) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append((msg.partition(), msg.offset()))  # type: ignore[attr-defined]

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    for i in range(n):
        p.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), on_delivery=on_delivery)
        p.poll(0)
    assert p.flush(30) == 0
    assert errors == []
    return delivered


def consume_assigned(bootstrap: str, topic: str, partition: int, expected: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, partition, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < expected and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is not None and msg.error() is None:
            values.append(msg.value())
    c.close()
    return values


def test_metadata_names_only_proxy_addresses(proxy: ProxyProcess, topic_name: str) -> None:
    admin = create_topic(proxy.bootstrap, topic_name, 3)
    md = admin.list_topics(timeout=10)
    assert {(b.host, b.port) for b in md.brokers.values()} == {("127.0.0.1", proxy.node_port)}
    assert len(md.topics[topic_name].partitions) == 3
    assert md.controller_id in md.brokers


def test_create_and_delete_topics(proxy: ProxyProcess, topic_name: str) -> None:
    admin = create_topic(proxy.bootstrap, topic_name, 2)
    assert topic_name in admin.list_topics(timeout=10).topics
    admin.delete_topics([topic_name])[topic_name].result(timeout=30)
    deadline = time.monotonic() + 10
    while topic_name in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    assert topic_name not in admin.list_topics(timeout=10).topics


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_produce_with_each_acks_then_consume(proxy: ProxyProcess, topic_name: str, acks: str) -> None:
    create_topic(proxy.bootstrap, topic_name, 1)
    delivered = produce(proxy.bootstrap, topic_name, 200, acks=acks)
    assert len(delivered) == 200
    if acks != "0":  # with acks=0 the client never learns offsets
        assert [o for _, o in delivered] == list(range(200))
    values = consume_assigned(proxy.bootstrap, topic_name, 0, 200)
    assert values == [f"v{i}".encode() for i in range(200)]


def test_idempotent_producer(proxy: ProxyProcess, topic_name: str) -> None:
    create_topic(proxy.bootstrap, topic_name, 1)
    delivered = produce(proxy.bootstrap, topic_name, 500, **{"enable.idempotence": True})
    assert [o for _, o in delivered] == list(range(500))
    assert consume_assigned(proxy.bootstrap, topic_name, 0, 500) == [f"v{i}".encode() for i in range(500)]


def test_consumer_group(proxy: ProxyProcess, topic_name: str) -> None:
    create_topic(proxy.bootstrap, topic_name, 2)
    produce(proxy.bootstrap, topic_name, 100, acks="all")
    c = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": f"g-{topic_name}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic_name])
    seen: set[bytes] = set()
    deadline = time.monotonic() + 90  # Tansu's first group join takes about 20 s
    while len(seen) < 100 and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is not None and msg.error() is None:
            seen.add(msg.value())
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)], timeout=10)
    c.close()
    assert seen == {f"v{i}".encode() for i in range(100)}
    assert sum(tp.offset for tp in committed) == 100
