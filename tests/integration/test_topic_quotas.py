"""Topic quotas end to end (issue 15's acceptance): real librdkafka producers through a real proxy
process to Tansu. Three clients write a hot topic and a cold topic; the hot topic has a
`producer_byte_rate` of 256 KiB/s, which the three together offer 1.4 times over. The hot topic
is held to its quota over whole windows, the cold topic's rate is what it is without the quota,
and every record reaches the broker exactly once.

Each client writes both topics through one producer, so both topics share its connection and
its Produce requests: the proxy refuses the hot topic's partitions (NOT_ENOUGH_REPLICAS, which
librdkafka retries) while the cold topic's partitions in the same requests go on.

The rate is Kafka's with its default windows (N = 11 samples of 1 s): the hot topic's first burst
is paid back in refusals, and its bytes then come in bursts a window apart (per second: ~6 s at
the offered 1.4 Q, ~4 s near nothing), the echo of the first burst leaving the window. So the
steady state is measured over two whole windows, 13-35 s: over 15-35 s, which is not a whole
number of windows, the same runs read 0.90-0.94 of the quota depending on the bursts' phase (an
earlier run 0.895), over 13-35 s 0.95-0.98. Rates are what the clients saw acknowledged. The
producers retry a refused batch after at most 100 ms (`retry.backoff.max.ms`):
with librdkafka's default, a backoff that grows to 1 s, a partition waiting for its refused batch
sits idle after the topic has room again. The quota counts record sets, so records are 8 KiB:
batch and record headers are ~1% of them (with 1 KiB records, ~8% of what the proxy counts was
not in the clients' count). Measured over 15-35 s before: 0.933 and 0.948 of the quota (the
proxy's own rate of the topic read 255-276 KiB/s all through the steady state); with 1 KiB
records and librdkafka's default backoff 0.86-0.90. docs/topic-quotas.md has the numbers.

Tansu's high watermark lags its log, so the final check reads each topic until nothing more
comes rather than up to the watermark: read up to the watermark, 100 records looked missing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.processes import ProxyProcess
from devkit.tansu import Broker
from tests.support.clients import in_thread
from tests.support.topic_clients import RECORD, Acks, KiB, assert_each_once, produce_both, read_all
from tests.support.usage import topic_totals, usage_records

pytestmark = pytest.mark.integration

QUOTA = 256 * KiB
CLIENTS = 3
HOT_EACH, COLD_EACH = 120 * KiB, 40 * KiB  # offered per client: hot 360 KiB/s in all, cold 120
RUN = 35.0
STEADY_FROM, STEADY_TO = 13.0, 35.0  # two whole 11 s windows
PARTITIONS = 3


@pytest.fixture(scope="module")
def topic_proxy(broker: Broker, broker_node_id: int) -> Iterator[ProxyProcess]:
    p = ProxyProcess(broker.address, broker_node_id, extra_config={
        "quotas": [{"topic": "hot-topic-quota", "producer_byte_rate": QUOTA}]}).start()
    try:
        yield p
    finally:
        p.stop()


def run_clients(bootstrap: str, hot: str, cold: str) -> list[Acks]:
    results = [Acks() for _ in range(CLIENTS)]
    start = time.monotonic()
    threads = [in_thread(produce_both, bootstrap, i, {hot: HOT_EACH, cold: COLD_EACH}, RUN, results[i],
                         start) for i in range(CLIENTS)]
    for t in threads:
        t.join(RUN + 120)
    return results


def rate(results: list[Acks], topic: str) -> float:
    return sum(r.rate(topic, STEADY_FROM, STEADY_TO) for r in results)


def test_a_hot_topic_is_held_to_its_quota_while_the_cold_one_is_not_slowed(
        topic_proxy: ProxyProcess, broker: Broker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.address})
    names = ["hot-topic-quota", "cold-topic-quota", "hot-topic-free", "cold-topic-free"]
    for future in admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names]).values():
        future.result(30)

    # The same clients through the same proxy, first on topics without a quota.
    free = run_clients(topic_proxy.bootstrap, "hot-topic-free", "cold-topic-free")
    held = run_clients(topic_proxy.bootstrap, "hot-topic-quota", "cold-topic-quota")

    hot, cold_held, cold_free = (rate(held, "hot-topic-quota"), rate(held, "cold-topic-quota"),
                                 rate(free, "cold-topic-free"))
    refused = topic_proxy.metric("kafka_quota_proxy_topic_throttled_requests_total",
                                 quota_type="topic_produce", topic="hot-topic-quota")
    print(f"hot {hot / KiB:.1f} KiB/s against {QUOTA / KiB:.0f}; cold {cold_held / KiB:.1f} KiB/s, "
          f"without the quota {cold_free / KiB:.1f}; hot free {rate(free, 'hot-topic-free') / KiB:.1f}; "
          f"{refused} refusals")
    assert [r.errors for r in free + held] == [[]] * (2 * CLIENTS)
    for topic in ("hot-topic-quota", "cold-topic-quota"):
        expected = sum(r.sent[topic] for r in held)
        assert_each_once(read_all(broker.address, topic, expected, PARTITIONS), held, topic)
    assert 0.9 * QUOTA <= hot <= 1.1 * QUOTA
    assert rate(free, "hot-topic-free") >= 1.3 * QUOTA  # the clients do offer more than the quota
    assert refused is not None and refused > 0
    assert 0.9 * cold_free <= cold_held <= 1.1 * cold_free


@pytest.fixture(scope="module")
def usage_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("topic-usage")


@pytest.fixture(scope="module")
def fetch_proxy(broker: Broker, broker_node_id: int, usage_dir: Path) -> Iterator[ProxyProcess]:
    p = ProxyProcess(broker.address, broker_node_id, extra_config={
        "quotas": [{"topic": "hot-read", "consumer_byte_rate": QUOTA}],
        "usage_log": {"dir": str(usage_dir), "instance": "topics", "topics": True}}).start()
    try:
        yield p
    finally:
        p.stop()


def test_a_hot_topic_is_read_at_its_quota_while_the_cold_one_is_read_at_once(
        fetch_proxy: ProxyProcess, broker: Broker, usage_dir: Path) -> None:
    """One librdkafka consumer reads both topics through the proxy: the hot topic's partitions
    come back empty while it is over its consumer_byte_rate, the cold topic's data comes at once.

    A fetch is all or nothing, as on Kafka: one over the bound delivers none of the topic's bytes,
    and a response with nothing else waits up to max_wait_ms. So the hot topic is read under its
    quota, as a client's consumer quota is (8.5-20.5% under for one proxy, docs/cluster-quotas.md):
    0.76 of it here on a quiet machine, 0.58 in a CI run with the rest of the suite beside it (the
    consumer comes back later after each empty answer). The bounds below are for enforcement (never
    over) and for the topic not being starved, not those figures."""
    admin = AdminClient({"bootstrap.servers": broker.address})
    new = [NewTopic(n, PARTITIONS, 1) for n in ("hot-read", "cold-read")]
    for future in admin.create_topics(new).values():
        future.result(30)
    p = Producer({"bootstrap.servers": broker.address, "linger.ms": 20})
    hot_records, cold_records = 40 * QUOTA // RECORD, 64
    for topic, count in (("hot-read", hot_records), ("cold-read", cold_records)):
        for n in range(count):
            while True:
                try:
                    p.produce(topic, f"{n}:".encode().ljust(RECORD, b"."), key=str(n).encode())
                    break
                except BufferError:
                    p.poll(0.05)
    assert p.flush(60) == 0

    c = Consumer({"bootstrap.servers": fetch_proxy.bootstrap, "group.id": "topic-reader",
                  "client.id": "topic-reader", "enable.auto.commit": False,
                  "fetch.max.bytes": 128 * KiB, "message.max.bytes": 128 * KiB})
    c.assign([TopicPartition(t, n, 0) for t in ("hot-read", "cold-read") for n in range(PARTITIONS)])
    start = time.monotonic()
    got: dict[str, list[tuple[float, bytes]]] = {"hot-read": [], "cold-read": []}
    while time.monotonic() - start < RUN:
        for msg in c.consume(200, 0.2):
            if msg.error() is None:
                got[msg.topic()].append((time.monotonic() - start, msg.value()))
    c.close()
    steady = [v for t, v in got["hot-read"] if STEADY_FROM <= t < STEADY_TO]
    hot = sum(len(v) for v in steady) / (STEADY_TO - STEADY_FROM)
    cold_done = max(t for t, _ in got["cold-read"]) if len(got["cold-read"]) == cold_records else None
    emptied = fetch_proxy.metric("kafka_quota_proxy_topic_throttled_requests_total",
                                 quota_type="topic_fetch", topic="hot-read")
    print(f"hot read {hot / KiB:.1f} KiB/s against {QUOTA / KiB:.0f}; cold read whole after {cold_done} s;"
          f" {emptied} fetches answered the hot topic empty")
    assert cold_done is not None and cold_done < 10.0
    assert emptied is not None and emptied > 0
    assert 0.4 * QUOTA <= hot <= 1.1 * QUOTA
    # Nothing read twice: an emptied partition is fetched again from the same offset.
    values = [v for _, v in got["hot-read"]]
    assert len(values) == len(set(values))
    # The usage log (usage_log.topics) has each topic's bytes as delivered and refused: record
    # sets, so a little more than the values (batch and record headers); librdkafka may hold a
    # fetch or two it had not handed over when it closed.
    fetch_proxy.terminate()  # SIGTERM: the last interval is written
    logged = topic_totals(usage_records(usage_dir, "topics"))
    consumed = {topic: sum(len(v) for _, v in got[topic]) for topic in got}
    print(f"logged {logged}; consumed {consumed}")
    hot_logged = logged["hot-read"]["fetch_bytes"]
    assert consumed["hot-read"] <= hot_logged <= 1.02 * consumed["hot-read"] + 256 * KiB
    assert logged["hot-read"]["fetch_refused_bytes"] > 0
    assert consumed["cold-read"] <= logged["cold-read"]["fetch_bytes"] <= 1.02 * consumed["cold-read"]
    assert logged["cold-read"]["fetch_refused_bytes"] == 0

