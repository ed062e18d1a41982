"""KIP-932 share groups through the proxy in front of Apache Kafka 4.4 (Kafka only: Tansu has no
share groups). Kafka's own share consumers read every record through it, and a share consumer
under a consumer_byte_rate quota set at the proxy is held to it (Kafka itself enforcing none), as
Kafka charges a ShareFetch (docs/quotas.md, "Share groups"), while the same consumer without the
quota reads much faster.

Share groups need no broker flag in 4.4 (share.version=2 is set at format). A share group starts
at the latest offset, so each group is set to share.auto.offset.reset=earliest first."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.kafka import KafkaBroker
from devkit.kafka_jvm import run_tool, share_from_earliest
from devkit.processes import ProxyProcess

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

QUOTA = 262_144  # consumer_byte_rate of client-id "share-held", bytes/s
RECORD_SIZE = 1000
FILLED = 30_000  # records of RECORD_SIZE in the perf topic: ~30 MB, far more than two windows
HELD_RECORDS = 12_000  # ~11.7 MB: ~2.7 MB at once, then ~36 s at the quota
WINDOW_S = 11  # quota.window.num * quota.window.size.seconds


@pytest.fixture(scope="module")
def share_proxy(kafka_broker: KafkaBroker) -> Iterator[ProxyProcess]:
    proxy = ProxyProcess(kafka_broker.address, kafka_broker.node_id, extra_config={
        "quotas": [{"client-id": "share-held", "consumer_byte_rate": QUOTA}]}).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(60)


def fill(bootstrap: str, topic: str, records: int) -> None:
    done = run_tool("ProducerPerformance", "--topic", topic, "--num-records", str(records),
                    "--record-size", str(RECORD_SIZE), "--throughput", "-1", "--producer-props",
                    f"bootstrap.servers={bootstrap}", "acks=1", "linger.ms=5", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def share_perf(bootstrap: str, topic: str, group: str, client_id: str,
               records: int) -> list[tuple[float, float]]:
    """ShareConsumerPerformance's own per-second progress: (seconds since its first report, MB
    consumed so far), from --show-detailed-stats, timed by each row's end (its closing summary
    row starts where the run started)."""
    share_from_earliest(bootstrap, group)
    done = run_tool("ShareConsumerPerformance", "--bootstrap-server", bootstrap, "--topic", topic,
                    "--group", group, "--num-records", str(records), "--show-detailed-stats",
                    "--reporting-interval", "1000", "--timeout", "60000",
                    "--command-property", f"client.id={client_id}", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1500:]
    rows = []
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 3 and re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{3}", cells[1]):
            rows.append((_seconds(cells[1]), float(cells[2])))
    assert rows, done.stdout[-2000:]
    start = rows[0][0]
    return [(t - start, mb) for t, mb in rows]


def _seconds(stamp: str) -> float:
    h, m, s, ms = map(int, re.findall(r"\d+", stamp)[3:7])
    return h * 3600 + m * 60 + s + ms / 1000


def rate(rows: list[tuple[float, float]], since: float, until: float) -> float:
    """Bytes/s between the first reports at or after `since` and `until`."""
    t0, mb0 = next(r for r in rows if r[0] >= since)
    t1, mb1 = next(r for r in rows if r[0] >= until)
    return (mb1 - mb0) * 1024 * 1024 / (t1 - t0)


def test_console_share_consumer_reads_every_record(share_proxy: ProxyProcess, topic_name: str) -> None:
    create_topic(share_proxy.bootstrap, topic_name, partitions=3)
    done = run_tool("ProducerPerformance", "--topic", topic_name, "--num-records", "1000",
                    "--payload-monotonic", "--throughput", "-1", "--producer-props",
                    f"bootstrap.servers={share_proxy.bootstrap}", "acks=all")
    assert done.returncode == 0, done.stderr[-2000:]
    group = f"share-{topic_name}"
    share_from_earliest(share_proxy.bootstrap, group)
    read = run_tool("org.apache.kafka.tools.consumer.ConsoleShareConsumer", "--bootstrap-server",
                    share_proxy.bootstrap, "--topic", topic_name, "--group", group,
                    "--max-messages", "1000", "--timeout-ms", "60000")
    assert read.returncode == 0, read.stderr[-2000:]
    values = re.findall(r"^(\d+)$", read.stdout, re.M)
    assert sorted(map(int, values)) == list(range(1000)), read.stdout[-1000:]


def test_a_share_consumer_is_held_to_its_quota(kafka_broker: KafkaBroker, share_proxy: ProxyProcess,
                                               topic_name: str) -> None:
    create_topic(kafka_broker.bootstrap, topic_name)
    fill(kafka_broker.bootstrap, topic_name, FILLED)

    free = share_perf(share_proxy.bootstrap, topic_name, f"free-{topic_name}", "share-free", FILLED)
    free_rate = free[-1][1] * 1024 * 1024 / max(free[-1][0], 1.0)

    held = share_perf(share_proxy.bootstrap, topic_name, f"held-{topic_name}", "share-held", HELD_RECORDS)
    # Kafka lets (N-1) windows' worth of the quota through at once before the first throttle;
    # from then on the consumer is held for each response's bytes at the quota.
    burst = next(t for t, mb in held if mb * 1024 * 1024 >= QUOTA * (WINDOW_S - 1))
    end = held[-1][0]
    assert end >= burst + 2 * WINDOW_S + 4, held  # a few two-window spans after the burst
    spans = [(t, rate(held, t, t + 2 * WINDOW_S) / QUOTA) for t, _ in held
             if burst <= t and t + 2 * WINDOW_S <= end]
    whole = rate(held, 0.0, end) / QUOTA
    print(f"share consumer: held {min(x for _, x in spans):.3f}-{max(x for _, x in spans):.3f} x "
          f"quota over each two whole windows after its first {burst:.1f} s, {whole:.3f} x over "
          f"the whole {end:.0f} s run; free {free_rate / QUOTA:.1f} x quota")
    assert all(0.9 <= x <= 1.1 for _, x in spans), (spans, held)
    assert free_rate > 3 * QUOTA, free
