"""A Kafka Streams application through the proxy in front of Apache Kafka 4.4 (Kafka only: Tansu
has neither streams groups nor the transactions exactly-once needs), on KIP-1071's streams
rebalance protocol (StreamsGroupHeartbeat and StreamsGroupDescribe, API keys 88 and 89, which
4.4 enables by default) and on the classic one.

The application (devkit/streams/CountApp.java, run by devkit.kafka_streams) drops every fifth
record, repartitions the rest by value % 7 and counts each key in an in-memory store, exactly
once; its input is produced and its output read straight from Kafka, so every count it wrote
is checked, none missing, none repeated. While it runs, each TCP connection its JVM holds is
read: it must reach only the proxy's ports, never the broker's. Its endpoint for interactive
queries (application.server) must come back to it as it was given: the proxy leaves a
UserEndpoint alone (rewrite.NOT_REWRITTEN), and the group's coordinator, which the Admin client
learns from FindCoordinator, must be the proxy's address for the broker."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.kafka import KafkaBroker
from devkit.kafka_streams import CountApp
from devkit.processes import LOOPBACK, ProxyProcess

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

RECORDS = 1000
KEPT = [i for i in range(RECORDS) if i % 5]  # what the application's filter keeps
COUNTS = Counter(f"k{i % 7}" for i in KEPT)  # key -> how many records it counts
ENDPOINT = "streams-app-1:7070"  # application.server: an application's address, resolved by no one
REQUESTS = "kafka_quota_proxy_requests_total"  # the proxy's, by api
GROUP_APIS = ("StreamsGroupHeartbeat", "JoinGroup")  # how a streams and a classic member join


@pytest.fixture(scope="module")
def streams_proxy(kafka_broker: KafkaBroker) -> Iterator[ProxyProcess]:
    proxy = ProxyProcess(kafka_broker.address, kafka_broker.node_id).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def topics(bootstrap: str, *names: str, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for done in admin.create_topics([NewTopic(n, partitions, 1) for n in names]).values():
        done.result(60)


def produce_numbers(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(topic, str(i).encode())
    assert producer.flush(60) == 0


def read_counts(bootstrap: str, topic: str, expected: int) -> dict[str, list[int]]:
    """Each key's counts in the order written (one key: one partition), read_committed, until
    `expected` have come and then 2 s more bring nothing."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    counts: dict[str, list[int]] = {}
    seen, deadline, quiet_until = 0, time.monotonic() + 60, None
    try:
        while time.monotonic() < deadline and (quiet_until is None or time.monotonic() < quiet_until):
            for msg in consumer.consume(500, 0.5):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                counts.setdefault(msg.key().decode(), []).append(int(msg.value()))
                seen += 1
            if seen >= expected and quiet_until is None:
                quiet_until = time.monotonic() + 2
    finally:
        consumer.close()
    return counts


@pytest.mark.parametrize("protocol", ["streams", "classic"])
def test_a_streams_application_counts_every_record_exactly_once(
        kafka_broker: KafkaBroker, streams_proxy: ProxyProcess, protocol: str) -> None:
    name = f"{protocol}-{uuid.uuid4().hex[:8]}"
    source, sink = f"numbers-{name}", f"counts-{name}"
    topics(kafka_broker.bootstrap, source, sink)
    produce_numbers(kafka_broker.bootstrap, source)
    before = {api: streams_proxy.metric(REQUESTS, api=api) for api in GROUP_APIS}

    run = CountApp(streams_proxy.bootstrap, f"app-{name}", source, sink, expected=len(KEPT),
                   group_protocol=protocol, application_server=ENDPOINT).run()

    assert run.returncode == 0, run.output[-4000:]
    assert run.said("written") == [f"{len(KEPT)} of {len(KEPT)}"]
    assert read_counts(kafka_broker.bootstrap, sink, len(KEPT)) == {
        key: list(range(1, count + 1)) for key, count in COUNTS.items()}
    # What the application learnt through the proxy: its own endpoint as given, and the proxy's
    # address for the broker as the group's coordinator.
    assert run.said("endpoint") == [ENDPOINT]
    coordinator = f"{LOOPBACK}:{streams_proxy.node_port}"
    sent = {api: streams_proxy.metric(REQUESTS, api=api) - n for api, n in before.items()}
    if protocol == "streams":  # a streams group, else StreamsGroupDescribe would say it is not one
        assert sent["StreamsGroupHeartbeat"] > 0 and sent["JoinGroup"] == 0, sent
        assert run.said("group") == [f"streams Stable coordinator {coordinator}"]
        assert run.said("member") == [f"/{LOOPBACK} endpoint {ENDPOINT}"]
    else:
        assert sent["StreamsGroupHeartbeat"] == 0 and sent["JoinGroup"] > 0, sent
        assert run.said("group") == [f"Classic Stable coordinator {coordinator}"]
        assert run.said("member") == [f"/{LOOPBACK}"]
    # Every connection it held, the Admin client's too, was to the proxy (the bootstrap one may
    # be closed before it is seen), none to the broker.
    proxy = {(LOOPBACK, streams_proxy.port), (LOOPBACK, streams_proxy.node_port)}
    assert (LOOPBACK, streams_proxy.node_port) in run.peers and run.peers <= proxy, run.peers
