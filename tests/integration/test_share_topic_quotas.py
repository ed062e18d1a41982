"""A topic's consumer_byte_rate at the proxy holds the KIP-932 share consumers of the topic, in
front of Apache Kafka 4.4 (Kafka only: Tansu has no share groups), and the usage log counts their
bytes per topic (docs/topic-quotas.md, "What a client sees"; docs/usage-log.md).

Kafka's own ShareConsumerPerformance reads a topic whose quota is set at the proxy, the client
itself having none: each ShareFetch is delivered whole (its records were acquired for the member)
and the connection waits out the topic's throttle, so after the burst a fresh rate allows (ten
seconds of quota) the consumer is held at about the topic's quota, in window-sized bursts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.kafka import KafkaBroker
from devkit.processes import ProxyProcess
from tests.integration.test_share_groups import RECORD_SIZE, create_topic, fill, rate, share_perf
from tests.support.usage import topic_totals, usage_records

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

TOPIC = f"share-hot-{uuid.uuid4().hex[:8]}"
QUOTA = 262_144  # the topic's consumer_byte_rate, bytes/s
RECORDS = 8000  # ~8 MB: a burst of 10 s of quota (2.6 MB) at once, then held: about 25 s
WINDOW_S = 11  # quota.window.num * quota.window.size.seconds


@pytest.fixture(scope="module")
def usage_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("share-topic-usage")


@pytest.fixture(scope="module")
def topic_proxy(kafka_broker: KafkaBroker, usage_dir: Path) -> Iterator[ProxyProcess]:
    proxy = ProxyProcess(kafka_broker.address, kafka_broker.node_id, extra_config={
        "quotas": [{"topic": TOPIC, "consumer_byte_rate": QUOTA}],
        "usage_log": {"dir": str(usage_dir), "instance": "share", "topics": True}}).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def test_a_topic_quota_holds_its_share_consumer_and_the_usage_log_counts_it(
        kafka_broker: KafkaBroker, topic_proxy: ProxyProcess, usage_dir: Path) -> None:
    create_topic(kafka_broker.bootstrap, TOPIC)
    fill(kafka_broker.bootstrap, TOPIC, RECORDS)

    rows = share_perf(topic_proxy.bootstrap, TOPIC, f"share-{TOPIC}", "share-topic", RECORDS)
    end = rows[-1][0]
    held = rate(rows, 0.0, end)
    throttled = topic_proxy.metric("kafka_quota_proxy_topic_throttled_requests_total",
                                   quota_type="topic_fetch", topic=TOPIC)
    print(f"share consumer of a topic at {QUOTA} B/s: {held / QUOTA:.3f} x the quota over the whole "
          f"{end:.0f} s run; {throttled} ShareFetches over the topic's quota; progress (s, MB): {rows}")
    assert throttled > 0  # the ShareFetch responses were charged to the topic, and went over
    assert end >= WINDOW_S + 5, rows  # unheld, it reads the topic in a second or two
    # Held, neither free (it reads ~100x without a quota) nor stalled. Judged over the whole run,
    # as the held share consumer of a client quota is (tests/integration/test_share_groups.py):
    # it moves in window-sized bursts, a fresh rate allowing ten seconds of quota at once and
    # again each time a burst leaves the window, so the whole run holds that first burst on top
    # of its quota. Measured 1.407, 1.408 and 1.406 over 22 s runs (2026-11-28, 2 cores beside
    # other jobs); bytes charged 1.5 times (Rate.record) read 0.966, which the old bound
    # (0.5-2.0) let pass.
    assert 1.25 <= held / QUOTA <= 1.55, rows

    # The usage log: the topic's record sets, delivered (a little over the values: batch and
    # record headers), none refused: a ShareFetch's records are never taken out.
    topic_proxy.terminate()  # SIGTERM: the last interval is written
    logged = topic_totals(usage_records(usage_dir, "share"))[TOPIC]
    print(f"logged {logged}")
    assert RECORDS * RECORD_SIZE <= logged["fetch_bytes"] <= 1.1 * RECORDS * RECORD_SIZE
    assert logged["fetch_refused_bytes"] == 0
