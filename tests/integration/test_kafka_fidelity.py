"""Kafka-exact, checked against Kafka itself (issue 36's reduced case): one librdkafka producer
flat out under a `producer_byte_rate` of 1,000,000 B/s, straight to a Kafka 4.4 broker that
enforces the quota (set with kafka-configs.sh), then through a proxy enforcing the same quota in
front of the same broker with the broker's quota deleted. The proxy's rate must be Kafka's own,
within 5%, so that a regression in Kafka-exactness fails `make test`.

Each side runs 33 s, measured over the two whole 11 s windows after Kafka's first allowance
(10 s of quota at once) is paid back. `python -m bench.many_connections --producers 1
--consumers 0 --batch-kib 128 --runs 3` measures the same for 55 s; the fidelity bounds of the
full bench are tighter (rate within 3% on the medians of three rounds, docs/quotas.md).
Measured here before the bound was set (2026-11-29, this 2-core machine, quiet otherwise, three
rounds on one broker): Kafka gave 1.009, 1.015 and 1.009 of the quota, the proxy 1.003 each
time, so the proxy's rate over Kafka's was 0.994, 0.989 and 0.994.
"""

from __future__ import annotations

import time

import pytest

from bench.many_connections import QUOTA, broker_quota, create_topic, measure
from devkit.kafka import KafkaBroker
from devkit.processes import ProxyProcess

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

SECONDS = 33.0  # three whole 11 s windows
WARM_UP = 11.0  # the first one holds Kafka's first allowance and its pay-back
BATCH_KIB = 128  # devkit's batches: a 1 MB batch is a second of quota, and moves a run's rate


def test_one_producer_gets_from_the_proxy_what_kafkas_broker_gives_it(kafka_broker: KafkaBroker) -> None:
    client_id = f"fidelity-{int(time.time())}"  # its own quotas on the shared broker
    proxy = ProxyProcess(kafka_broker.address, kafka_broker.node_id, extra_config={
        "quotas": [{"client-id": client_id, "producer_byte_rate": QUOTA}]}).start()
    try:
        topics = {path: f"{client_id}-{path}" for path in ("kafka", "proxy")}
        for topic in topics.values():
            create_topic(kafka_broker.bootstrap, topic, 1)
        broker_quota(kafka_broker, "producer_byte_rate", QUOTA, client_id)
        try:
            kafka = measure("kafka", "produce", 1, kafka_broker.bootstrap, topics["kafka"], SECONDS,
                            WARM_UP, BATCH_KIB, client_id, broker=kafka_broker.bootstrap)
        finally:
            broker_quota(kafka_broker, "producer_byte_rate", None, client_id)
        proxied = measure("proxy", "produce", 1, proxy.bootstrap, topics["proxy"], SECONDS,
                          WARM_UP, BATCH_KIB, client_id, broker=kafka_broker.bootstrap)
    finally:
        proxy.stop()
    assert kafka.errors == 0 and proxied.errors == 0
    # Both held near the quota at all (a quota not applied on either side would be 10x over).
    assert 0.8 < kafka.rate / QUOTA < 1.3, kafka.rate / QUOTA
    assert proxied.rate / kafka.rate == pytest.approx(1.0, abs=0.05), (proxied.rate / QUOTA,
                                                                      kafka.rate / QUOTA)
