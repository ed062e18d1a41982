"""Quotas enforced through the proxy on real clients against real Tansu, with the rates the
issue asks for: a client held to 1 MiB/s within 10% over a 20 s steady state, while another
client runs free. Rates are measured by the clients themselves (bytes delivered or consumed).

The producer is measured by a proxy that keeps 3 samples of 1 s (`quota.window_num: 3`), not
Kafka's default 11. Kafka's Rate lets a client that has been quiet take (N-1) * W * Q at once,
and a flat-out producer does: with N = 11 a 1 MiB/s client moves in a ~14 s sawtooth of 10 MB
bursts (the burst lands in one sample, and when that sample expires 11 s later the next burst is
allowed). Its long-run rate is the quota, but any 20 s slice of it holds one burst or two: 0.75
to 1.3 MiB/s, measured. A Kafka broker does the same. With N = 3 a burst is 2 MB and a 20 s
slice holds several cycles; with 128 KB batches (librdkafka's default is 1 MB) one request more
or less in the slice is under 1%. The 10% bound then says something about enforcement rather
than about where the slice falls.

The consumer is measured with Kafka's default windows (N = 11) and also moves in bursts: a
fetch over quota is answered empty and its bytes discarded, as Kafka does, so the consumer takes
a window's allowance (~10 MB) in one burst, is throttled until that sample expires, and bursts
again, about every 11 s. A fixed 30 s slice held two bursts or three depending on where the
cycle fell (0.73 or 1.04 MiB/s, measured on the same build), so the consumer's rate is taken
over whole cycles: from the start of one burst to the start of a later one, at least 20 s
apart. Over whole cycles it read 0.966 to 0.982 MiB/s (four spans of one 75 s run). It asks
for 128 KB per fetch (`fetch.max.bytes`; Tansu ignores the per-partition limit) so that the
last fetch of a burst overshoots the allowance by little; with the proxy's 1 MiB cap a cycle
averaged 0.91 to 0.94. With N = 3 the bursts are smaller but the window's length steps from
2.9 s to 2.1 s as samples age (Kafka's Rate.windowSize), throttles of 1 to 2 s follow, and the
consumer reached only 0.66 (1 MiB fetches) or 0.92 (128 KB) over 30 s, measured."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.processes import ProxyProcess
from devkit.tansu import Broker
from tests.support.clients import (
    Progress,
    alter_quota,
    describe_quotas,
    in_thread,
    run_consumer,
    run_producer,
)

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
QUOTA = MiB
# A new client gets a (N-1) * W window first (Kafka's design); on a loaded machine the burst and
# its pay-back take a while to settle, so the 20 s steady state starts at 20 s.
WARM_UP, STEADY_END = 20.0, 40.0
RUN = STEADY_END + 1.0
# The consumer's steady state: whole burst cycles (see the module docstring) that start after
# CONSUMER_WARM_UP and before CONSUMER_END, spanning at least STEADY seconds. A burst is where
# at least 4 MiB (of the ~10 MiB a window allows) arrive within 2 s, which the throttled
# fetches between bursts never reach (at most ~0.6 MiB per 2 s, measured); bursts come ~11 s
# apart, and a slow one on a loaded machine is not counted twice.
CONSUMER_WARM_UP, CONSUMER_END, STEADY = 20.0, 62.0, 20.0
BURST_BYTES, BURST_WITHIN, BURST_APART = 4 * MiB, 2.0, 5.0


QUOTAS = [{"client-id": "limited-producer", "producer_byte_rate": QUOTA},
          {"client-id": "limited-consumer", "consumer_byte_rate": QUOTA}]
SMALLER_BATCHES = {"batch.size": 128 * 1024}
# librdkafka requires fetch.max.bytes >= message.max.bytes (1 MB by default).
SMALLER_FETCHES = {"fetch.max.bytes": 128 * 1024, "message.max.bytes": 128 * 1024}


@pytest.fixture(scope="module")
def quota_proxy(broker: Broker, broker_node_id: int) -> Iterator[ProxyProcess]:
    p = ProxyProcess(broker.address, broker_node_id,
                     extra_config={"quota": {"window_num": 3}, "quotas": QUOTAS}).start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def default_windows_proxy(broker: Broker, broker_node_id: int) -> Iterator[ProxyProcess]:
    p = ProxyProcess(broker.address, broker_node_id, extra_config={"quotas": QUOTAS}).start()
    try:
        yield p
    finally:
        p.stop()


def _topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)


def test_producer_held_to_its_quota_while_another_runs_free(quota_proxy: ProxyProcess,
                                                           topic_name: str) -> None:
    _topic(quota_proxy.bootstrap, topic_name)
    limited, free = Progress(), Progress()
    threads = [in_thread(run_producer, quota_proxy.bootstrap, topic_name, "limited-producer", RUN, limited,
                         config=SMALLER_BATCHES),
               in_thread(run_producer, quota_proxy.bootstrap, topic_name, "free-producer", RUN, free,
                         max_rate=4 * MiB, config=SMALLER_BATCHES)]
    for t in threads:
        t.join(RUN + 90)
    rate = limited.rate(WARM_UP, STEADY_END)
    free_rate = free.rate(WARM_UP, STEADY_END)
    proxy_total = quota_proxy.metric("kafka_quota_proxy_throttle_time_ms_total", quota_type="produce",
                                     user="ANONYMOUS", client_id="limited-producer")
    print(f"limited {rate / MiB:.3f} MiB/s, free {free_rate / MiB:.3f} MiB/s; librdkafka throttle "
          f"max {limited.throttle_max_ms} ms, sum {limited.throttle_sum_ms} ms over "
          f"{limited.throttle_count} responses; proxy throttle total {proxy_total} ms")
    assert limited.errors == [] and free.errors == []
    assert 0.9 * QUOTA <= rate <= 1.1 * QUOTA
    assert free_rate >= 0.9 * 4 * MiB  # the app's own 4 MiB/s: never held back
    # librdkafka's own statistics saw the throttle the proxy put in throttle_time_ms.
    assert limited.throttle_max_ms > 0 and limited.throttle_count > 0
    assert free.throttle_max_ms == 0
    assert quota_proxy.metric("kafka_quota_proxy_throttled_requests_total", quota_type="produce",
                              user="ANONYMOUS", client_id="free-producer") == 0


def test_consumer_held_to_its_quota_while_another_reads_free(default_windows_proxy: ProxyProcess,
                                                            broker: Broker, topic_name: str) -> None:
    quota_proxy = default_windows_proxy
    _topic(broker.address, topic_name)
    p = Producer({"bootstrap.servers": broker.address, "linger.ms": 20, "batch.size": 64 * 1024})
    value = os.urandom(1024)
    for _ in range(90 * 1024):  # 90 MiB, straight to the broker
        while True:
            try:
                p.produce(topic_name, value)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    limited, free = Progress(), Progress()
    t = in_thread(run_consumer, quota_proxy.bootstrap, topic_name, "limited-consumer",
                  CONSUMER_END, limited, config=SMALLER_FETCHES)
    time.sleep(WARM_UP)
    run_consumer(quota_proxy.bootstrap, topic_name, "free-consumer", 8.0, free)
    t.join(CONSUMER_END + 60)
    starts = [at for at in limited.burst_starts(BURST_BYTES, BURST_WITHIN, BURST_APART)
              if CONSUMER_WARM_UP <= at <= CONSUMER_END]
    print(f"limited consumer bursts start at {[round(at, 1) for at in starts]} s; per 2 s (MiB/s): "
          + " ".join(f"{limited.rate(at, at + 2) / MiB:.2f}" for at in range(0, int(CONSUMER_END), 2)))
    assert len(starts) >= 2 and starts[-1] - starts[0] >= STEADY
    rate = limited.rate(starts[0], starts[-1])
    print(f"limited consumer {rate / MiB:.3f} MiB/s over {starts[-1] - starts[0]:.1f} s of whole "
          f"cycles; free consumer {free.rate(0, 4) / MiB:.1f} MiB/s over its first 4 s; librdkafka "
          f"throttle max {limited.throttle_max_ms} ms")
    assert 0.9 * QUOTA <= rate <= 1.1 * QUOTA
    assert free.rate(0.0, 4.0) >= 5 * QUOTA
    assert free.throttle_max_ms == 0
    assert limited.throttle_max_ms > 0 and limited.throttle_count > 0


def test_alter_client_quotas_changes_a_running_producer_within_2s(quota_proxy: ProxyProcess,
                                                                  topic_name: str) -> None:
    _topic(quota_proxy.bootstrap, topic_name)
    entity = [("client-id", "alter-me")]
    progress = Progress()
    start = time.monotonic()
    t = in_thread(run_producer, quota_proxy.bootstrap, topic_name, "alter-me", 14.0, progress,
                  max_rate=2 * MiB)
    time.sleep(8.0)
    before = progress.rate(4.0, 8.0)
    changed_at = time.monotonic() - start
    # kafka-configs.sh --alter --entity-type clients --entity-name alter-me --add-config ...
    assert alter_quota(quota_proxy.bootstrap, entity, "producer_byte_rate", 64 * 1024) == (0, None)
    t.join(60)
    after = progress.rate(changed_at + 2.0, changed_at + 6.0)
    print(f"alter: {before / MiB:.3f} MiB/s before, {after / MiB:.3f} MiB/s from 2 s after the change")
    # Unthrottled before: at least 16x the quota set next (the pacer's 2 MiB/s itself is not
    # always reached beside a loaded CI run: 1.56 MiB/s seen once).
    assert before >= 0.5 * 2 * MiB
    assert after <= 0.25 * before
    described = describe_quotas(quota_proxy.bootstrap, [("client-id", 0, "alter-me")])
    assert described.error_code == 0
    assert [(list(e.entity), list(e.values)) for e in described.entries] == [
        ([("client-id", "alter-me")], [("producer_byte_rate", 65536.0)])]
    assert alter_quota(quota_proxy.bootstrap, entity, "producer_byte_rate", None) == (0, None)


def test_yaml_change_changes_a_running_producer_within_2s(quota_proxy: ProxyProcess,
                                                          topic_name: str) -> None:
    import yaml

    _topic(quota_proxy.bootstrap, topic_name)
    assert quota_proxy.config_path is not None
    original = quota_proxy.config_path.read_text()
    progress = Progress()
    start = time.monotonic()
    t = in_thread(run_producer, quota_proxy.bootstrap, topic_name, "yaml-me", 16.0, progress,
                  max_rate=2 * MiB)
    try:
        time.sleep(8.0)
        before = progress.rate(4.0, 8.0)
        config = yaml.safe_load(original)
        config["quotas"].append({"client-id": "yaml-me", "producer_byte_rate": 64 * 1024})
        quota_proxy.config_path.write_text(yaml.safe_dump(config))
        changed_at = time.monotonic() - start
        t.join(60)
    finally:
        quota_proxy.config_path.write_text(original)
    # The file is polled every second; the next response then carries the throttle.
    after = progress.rate(changed_at + 2.0, changed_at + 6.0)
    print(f"yaml: {before / MiB:.3f} MiB/s before, {after / MiB:.3f} MiB/s from 2 s after the edit")
    # Unthrottled before: at least 16x the quota set next (the pacer's 2 MiB/s itself is not
    # always reached beside a loaded CI run: 1.56 MiB/s seen once).
    assert before >= 0.5 * 2 * MiB
    assert after <= 0.25 * before
    assert "config reloaded" in quota_proxy.log_text()


def test_a_consumer_held_by_throttled_fetches_reads_every_record_once_in_order(
        broker: Broker, broker_node_id: int, topic_name: str) -> None:
    """A fetch over quota gets Kafka's throttled answer: no partitions at all, so no high
    watermark, log start offset or error a consumer could move its position by. A librdkafka
    consumer by plain fetches (the soak's live reader) throttled again and again returns every
    offset once, in order, with no jump (docs/reliability.md, "Soak")."""
    import json

    from confluent_kafka import Consumer, TopicPartition

    _topic(broker.address, topic_name)
    records = 1500  # 1.5 MiB against 64 KiB/s: about 10 s after the first window's allowance
    # One connection, so the records are stored in order (docs/reliability.md, "Soak"), in
    # batches of 16 KiB. Tansu returns a first batch whole whatever max_bytes says, and one larger
    # than the quota allows over a whole window ((N-1) * W * Q, 640 KiB here) is answered empty
    # every time: with librdkafka's default batches (967 records in the first) nothing is read.
    p = Producer({"bootstrap.servers": broker.address, "linger.ms": 20, "batch.size": 16 * 1024})
    for i in range(records):
        p.produce(topic_name, b"%07d" % i + b"." * 1017)
    assert p.flush(60) == 0
    proxy = ProxyProcess(broker.address, broker_node_id, extra_config={
        "quotas": [{"client-id": "held-reader", "consumer_byte_rate": 64 * 1024}]}).start()
    throttles: list[int] = []
    try:
        c = Consumer({"bootstrap.servers": proxy.bootstrap, "client.id": "held-reader",
                      "group.id": "held-reader-unused", "enable.auto.commit": False,
                      "statistics.interval.ms": 500,
                      "stats_cb": lambda s: throttles.extend(
                          b["throttle"]["max"] for b in json.loads(s)["brokers"].values())})
        c.assign([TopicPartition(topic_name, 0, 0)])
        offsets: list[int] = []
        values: list[int] = []
        deadline = time.monotonic() + 60
        while len(offsets) < records and time.monotonic() < deadline:
            for msg in c.consume(500, 0.2):
                assert msg.error() is None, msg.error()
                offsets.append(msg.offset())
                values.append(int(msg.value()[:7]))
        c.close()
        throttled = proxy.metric("kafka_quota_proxy_throttled_requests_total", quota_type="fetch",
                                 user="ANONYMOUS", client_id="held-reader")
    finally:
        proxy.stop()
    assert offsets == list(range(records))
    assert values == list(range(records))
    assert throttled >= 3 and max(throttles) > 0  # throttled again and again, and librdkafka saw it
