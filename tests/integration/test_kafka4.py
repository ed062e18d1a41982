"""The proxy in front of Apache Kafka 4.4 (devkit.kafka), with Kafka's own Java clients and tools
beside librdkafka: every API the broker advertises reaches the client but those refused on purpose,
KIP-848 consumer groups (Java and librdkafka) read every record, the perf tools run, transactions
are exactly once, and a quota holds with Kafka enforcing none. Cases that apply to Tansu too are
parametrized over both brokers; the others say they are Kafka's alone."""

from __future__ import annotations

import re
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse

from devkit.kafka import KafkaBroker
from devkit.kafka_jvm import run_tool
from devkit.kafka_specs import valid_versions
from devkit.processes import ProxyProcess
from devkit.producing import Timeline, produce
from kafka_quota_proxy.protocol.api_keys import (
    ALTER_CLIENT_QUOTAS,
    API_VERSIONS,
    DELETE_GROUPS,
    DESCRIBE_CLIENT_QUOTAS,
    REFUSED,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
    SHARE_GROUP_HEARTBEAT,
    TXN_OFFSET_COMMIT,
)
from kafka_quota_proxy.protocol.apis import kafka_python_keys

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

LEADER_AND_ISR = 4  # an inter-broker API, in neither codec
QUOTA = 262_144  # producer_byte_rate of client-id "held", bytes/s
RECORDS = 1000

# Where the proxy advertises less than both Kafka's broker and Kafka's specs allow, on purpose:
# API key -> (the highest version it advertises, or None for none; why). Reviewed: any other
# difference from what Kafka allows, lower or higher, fails the ApiVersions test below. The
# codec takes kafka-python's schema for every key kafka-python has (protocol/apis.py), and every
# request body is checked against its schema before it goes on, so the proxy cannot advertise a
# version that kafka-python 3.0's schemas stop short of. Raising one means vendoring Kafka's spec
# for that key too (devkit/kafka_specs.py vendors only the keys kafka-python lacks).
KNOWN_CAPS: dict[int, tuple[int | None, str]] = {
    API_VERSIONS: (4, "kafka-python's schema stops at v4; v5 adds KIP-1242's ClusterId and NodeId "
                      "checks and REBOOTSTRAP_REQUIRED, and the proxy rewrites this response"),
    TXN_OFFSET_COMMIT: (5, "kafka-python's schema stops at v5; v6 names topics by id (KIP-1319)"),
    DELETE_GROUPS: (2, "kafka-python's schema stops at v2; v3 adds a per-group ErrorMessage"),
}
# The quota APIs the proxy answers itself (docs/quotas.md): advertised at their specs' versions
# even where the broker lacks them (Tansu does).
ANSWERED = frozenset({DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS})


@pytest.fixture(scope="module", params=["tansu", "kafka"])
def upstream(request: pytest.FixtureRequest) -> tuple[str, str, int]:
    """(which, broker address, node id) for each of the two brokers."""
    if request.param == "kafka":
        kafka: KafkaBroker = request.getfixturevalue("kafka_broker")
        return "kafka", kafka.address, kafka.node_id
    return "tansu", request.getfixturevalue("broker").address, request.getfixturevalue("broker_node_id")


@pytest.fixture(scope="module")
def through(upstream: tuple[str, str, int]) -> Iterator[ProxyProcess]:
    """A proxy in front of `upstream`, holding client-id "held" to QUOTA."""
    _, address, node_id = upstream
    proxy = ProxyProcess(address, node_id, extra_config={
        "quotas": [{"client-id": "held", "producer_byte_rate": QUOTA}]}).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def kafka_proxy(kafka_broker: KafkaBroker) -> Iterator[ProxyProcess]:
    """A proxy in front of Kafka, for the cases that are Kafka's alone."""
    proxy = ProxyProcess(kafka_broker.address, kafka_broker.node_id).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the answer
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(60)


def produce_numbered(bootstrap: str, topic: str, count: int = RECORDS) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, f"{i:06d}".encode())
    assert producer.flush(60) == 0


def read_group(bootstrap: str, topic: str, protocol: str, count: int = RECORDS) -> list[int]:
    """Every value a consumer group of `protocol` (classic, or KIP-848's consumer) reads."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": f"{protocol}-{topic}",
                              "auto.offset.reset": "earliest", "group.protocol": protocol}
    consumer = Consumer(config)
    consumer.subscribe([topic])
    seen: list[int] = []
    deadline = time.monotonic() + 90
    try:
        while len(seen) < count and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                seen.append(int(msg.value()))
    finally:
        consumer.close()
    return seen


def api_versions(address: str) -> dict[int, tuple[int, int]]:
    host, port = address.rsplit(":", 1)
    request = ApiVersionsRequest(version=3, client_software_name="kqp-test", client_software_version="1")
    request.with_header(correlation_id=7, client_id="kqp-test")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(bytes(request.encode(version=3, header=True, framed=True)))
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        frame = s.recv(size, socket.MSG_WAITALL)
    msg = ApiVersionsResponse.decode(frame[4:], version=3)  # header v0: the correlation id alone
    return {e.api_key: (e.min_version, e.max_version) for e in msg.api_keys}


# -- both brokers ------------------------------------------------------------------------------


def allowed_versions(broker: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """What the proxy should advertise, from Kafka alone: each API the broker advertises, up to
    the lower of the broker's highest and Kafka's spec's (validVersions in the kafka-clients jar),
    less KNOWN_CAPS; plus ANSWERED. Not from the proxy's codec, so a wrong cap there fails.
    The lowest is the broker's, not the spec's: the proxy passes it on, as clients need (Kafka 4
    advertises Produce from v0, below its spec's v3, for librdkafka: its
    ApiKeys.PRODUCE_API_VERSIONS_RESPONSE_MIN_VERSION; Tansu serves versions Kafka 4's specs
    dropped in KIP-896)."""
    spec = valid_versions()
    allowed: dict[int, tuple[int, int]] = {}
    for key in (set(broker) | ANSWERED) & set(spec):
        low, high = broker.get(key, spec[key])
        cap = KNOWN_CAPS.get(key, (high, ""))[0]
        high = -1 if cap is None else min(high, spec[key][1], cap)
        if low <= high:
            allowed[key] = (low, high)
    return allowed


def test_every_api_the_broker_advertises_reaches_the_client_but_the_refused(
        upstream: tuple[str, str, int], through: ProxyProcess) -> None:
    which, address, _ = upstream
    broker, seen = api_versions(address), api_versions(through.bootstrap)
    allowed = allowed_versions(broker)
    differ = {key: (allowed.get(key), seen.get(key)) for key in sorted(set(allowed) | set(seen))
              if allowed.get(key) != seen.get(key)}
    assert not differ, f"API key: (Kafka allows less KNOWN_CAPS, the proxy advertises): {differ}"
    if which == "kafka":
        # What kafka-python's codec lacks reaches Kafka 4's clients now: KIP-848's consumer groups,
        # delegation tokens, KIP-1071's streams groups ... (KIP-714's telemetry only where the
        # broker has a metrics plugin: this one does not advertise it).
        new = set(broker) - kafka_python_keys() - set(REFUSED)
        assert {38, 39, 40, 41, 68, 69, 88, 89} <= new <= set(seen)
        assert set(REFUSED) <= set(broker) and not set(REFUSED) & set(seen)
        assert {SHARE_GROUP_HEARTBEAT, SHARE_FETCH, SHARE_ACKNOWLEDGE} <= set(seen)  # KIP-932
        # Each known cap is below what Kafka allows, or it would not need a reason.
        assert all(cap is None or cap < broker[key][1] for key, (cap, _) in KNOWN_CAPS.items())


def test_classic_group_reads_every_record_once(through: ProxyProcess, topic_name: str) -> None:
    create_topic(through.bootstrap, topic_name, partitions=3)
    produce_numbered(through.bootstrap, topic_name)
    assert sorted(read_group(through.bootstrap, topic_name, "classic")) == list(range(RECORDS))


def test_a_producer_quota_holds_with_the_broker_enforcing_none(through: ProxyProcess,
                                                               topic_name: str) -> None:
    create_topic(through.bootstrap, topic_name)
    timeline = Timeline()
    produce(through.bootstrap, topic_name, "held", time.monotonic(), 24.0, timeline)
    lo, hi = 11.0, 22.0  # a whole window after the first one's burst
    rate = (timeline.at(hi) - timeline.at(lo)) / (hi - lo)
    assert timeline.errors == 0
    assert 0.6 * QUOTA < rate < 1.3 * QUOTA, f"{rate / QUOTA:.2f} of the quota"


# -- Kafka's alone -----------------------------------------------------------------------------


def test_librdkafka_kip848_consumer_reads_every_record_once(kafka_proxy: ProxyProcess,
                                                            topic_name: str) -> None:
    """Kafka only: Tansu has no KIP-848 group coordinator. Before the proxy carried
    ConsumerGroupHeartbeat this consumer read nothing, silently, for as long as it ran."""
    create_topic(kafka_proxy.bootstrap, topic_name, partitions=3)
    produce_numbered(kafka_proxy.bootstrap, topic_name)
    assert sorted(read_group(kafka_proxy.bootstrap, topic_name, "consumer")) == list(range(RECORDS))


def test_java_kip848_console_consumer_reads_every_record(kafka_proxy: ProxyProcess, topic_name: str) -> None:
    """Kafka only. Before, the Java consumer failed at once: 'The cluster does not support the
    new CONSUMER group protocol'."""
    create_topic(kafka_proxy.bootstrap, topic_name, partitions=3)
    produce_numbered(kafka_proxy.bootstrap, topic_name)
    done = run_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
                    kafka_proxy.bootstrap, "--topic", topic_name, "--group", f"java-{topic_name}",
                    "--consumer-property", "group.protocol=consumer", "--from-beginning",
                    "--max-messages", str(RECORDS), "--timeout-ms", "60000")
    assert done.returncode == 0, done.stderr[-2000:]
    values = re.findall(r"^(\d{6})$", done.stdout, re.M)
    assert sorted(map(int, values)) == list(range(RECORDS)), done.stdout[-1000:]
    assert f"Processed a total of {RECORDS} messages" in done.stderr


def test_kafka_perf_tools_through_the_proxy(kafka_proxy: ProxyProcess, topic_name: str) -> None:
    """Kafka only: the field's own producer and consumer perf tools, acks=all."""
    create_topic(kafka_proxy.bootstrap, topic_name)
    produced = run_tool("ProducerPerformance", "--topic", topic_name, "--num-records", "20000",
                        "--record-size", "512", "--throughput", "-1", "--producer-props",
                        f"bootstrap.servers={kafka_proxy.bootstrap}", "acks=all")
    assert produced.returncode == 0, produced.stderr[-2000:]
    assert re.search(r"^20000 records sent", produced.stdout, re.M), produced.stdout
    consumed = run_tool("ConsumerPerformance", "--bootstrap-server", kafka_proxy.bootstrap, "--topic",
                        topic_name, "--messages", "20000", "--timeout", "60000")
    assert consumed.returncode == 0, consumed.stderr[-2000:]
    row = consumed.stdout.strip().splitlines()[-1].split(", ")
    assert row[4] == "20000", consumed.stdout  # data.consumed.in.nMsg


def test_transactions_are_read_committed_exactly_once(kafka_proxy: ProxyProcess, topic_name: str) -> None:
    """Kafka only (the Tansu path is test_confluent_kafka's): committed records read once, aborted
    ones never, by a read_committed consumer."""
    create_topic(kafka_proxy.bootstrap, topic_name)
    producer = Producer({"bootstrap.servers": kafka_proxy.bootstrap, "transactional.id": f"tx-{topic_name}"})
    producer.init_transactions(60)
    for start, count, commit in ((0, 300, True), (300, 200, False), (500, 300, True)):
        producer.begin_transaction()
        for i in range(start, start + count):
            producer.produce(topic_name, f"{i:06d}".encode())
        (producer.commit_transaction if commit else producer.abort_transaction)(60)
    consumer = Consumer({"bootstrap.servers": kafka_proxy.bootstrap, "group.id": f"rc-{topic_name}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    seen: list[int] = []
    deadline = time.monotonic() + 60
    while len(seen) < 600 and time.monotonic() < deadline:
        seen += [int(m.value()) for m in consumer.consume(500, 0.5) if m.error() is None]
    time.sleep(1)
    seen += [int(m.value()) for m in consumer.consume(500, 1.0) if m.error() is None]
    consumer.close()
    assert seen == list(range(0, 300)) + list(range(500, 800))


def test_java_transactions_with_aborts_are_read_committed_exactly_once(kafka_proxy: ProxyProcess,
                                                                     topic_name: str) -> None:
    """Kafka only: Kafka's own transactional Java client through the proxy. Kafka's system-test
    tool TransactionalMessageCopier copies a topic in transactions of 100 records that also
    commit the consumed offsets (TxnOffsetCommit with the group's metadata) and aborts about one
    transaction in three at random, rewinding to the last commit. A read_committed consumer then
    sees every input record exactly once, in order; a read_uncommitted one sees the aborted
    copies too, so the aborts did happen (30 transactions: none aborted has odds (2/3)^30)."""
    source, copy = f"{topic_name}-in", f"{topic_name}-out"
    create_topic(kafka_proxy.bootstrap, source)
    create_topic(kafka_proxy.bootstrap, copy)
    produce_numbered(kafka_proxy.bootstrap, source, 3000)
    name = f"copier-{topic_name}"
    copied = run_tool("TransactionalMessageCopier", "--broker-list", kafka_proxy.bootstrap,
                      "--input-topic", source, "--input-partition", "0", "--output-topic", copy,
                      "--transactional-id", name, "--consumer-group", name,
                      "--transaction-size", "100", "--max-messages", "3000", "--enable-random-aborts",
                      "--use-group-metadata", timeout=180)
    assert copied.returncode == 0, (copied.stdout + copied.stderr)[-3000:]

    def read(isolation: str) -> list[int]:
        consumer = Consumer({"bootstrap.servers": kafka_proxy.bootstrap, "group.id": f"{isolation}-{copy}",
                             "isolation.level": isolation, "enable.auto.commit": False,
                             "enable.partition.eof": True})
        consumer.assign([TopicPartition(copy, 0, 0)])
        seen: list[int] = []
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                msgs = consumer.consume(1000, 0.5)
                seen += [int(m.value()) for m in msgs if m.error() is None]
                if any((e := m.error()) is not None and e.code() == KafkaError._PARTITION_EOF for m in msgs):
                    break
        finally:
            consumer.close()
        return seen

    assert read("read_committed") == list(range(3000))
    assert len(read("read_uncommitted")) > 3000


def test_an_api_the_proxy_lacks_closes_only_that_connection(kafka_proxy: ProxyProcess) -> None:
    """Kafka only: a request with a key the proxy's codec lacks (LeaderAndIsr, 4, gone from Kafka
    4) is not forwarded unread; the connection closes, as a broker closes one for a key it lacks,
    with one log line naming the key, and the proxy serves on. (Until KIP-932's APIs were charged,
    a refused ShareFetch took this path: api_keys.REFUSED, empty today.)"""
    header = struct.pack(">hhih", LEADER_AND_ISR, 0, 99, 4) + b"test"
    with socket.create_connection(("127.0.0.1", kafka_proxy.port), timeout=10) as s:
        s.sendall(struct.pack(">i", len(header) + 1) + header + b"\x00")
        assert s.recv(16) == b""  # closed, nothing answered
    assert api_versions(kafka_proxy.bootstrap)  # another connection is served
    log = kafka_proxy.log_text()
    assert len(re.findall(r"unknown API key 4\b", log)) == 1, log[-2000:]
