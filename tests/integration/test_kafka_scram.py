"""SCRAM users created on Apache Kafka by Kafka's own means (its storage format's --add-scram), the
proxy in SASL passthrough in front of Kafka's SASL_PLAINTEXT listener: the proxy identifies each
user from the exchange Kafka accepts, and quotas by user and by user+client-id hold, with Kafka
itself enforcing none. Kafka only: on Tansu's memory storage no SASL user can be created."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.kafka import KafkaBroker
from devkit.kafka_jvm import run_tool
from devkit.processes import ProxyProcess, free_port
from devkit.producing import Timeline, produce

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

QUOTA = 262_144  # bytes/s
SECONDS = 24.0
PASSWORDS = {"alice": "alice-Secret-1", "bob": "bob-Secret-2", "kqp-refresh": "refresh-Secret-3"}


@pytest.fixture(scope="module")
def scram_kafka() -> Iterator[KafkaBroker]:
    broker = KafkaBroker(sasl_port=free_port(), scram_users=PASSWORDS).start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="module")
def passthrough(scram_kafka: KafkaBroker) -> Iterator[ProxyProcess]:
    proxy = ProxyProcess(scram_kafka.sasl_address, scram_kafka.node_id, extra_config={
        "sasl": {"mode": "passthrough"},
        # The proxy's own metadata refresh at a SASL-only listener; clients bring their own.
        "upstream_sasl": {"mechanism": "SCRAM-SHA-512", "username": "kqp-refresh",
                          "password": PASSWORDS["kqp-refresh"]},
        "quotas": [{"user": "alice", "producer_byte_rate": QUOTA},
                   {"user": "bob", "client-id": "bulk", "producer_byte_rate": QUOTA}]}).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def scram(user: str, mechanism: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": PASSWORDS[user]}


def test_user_and_user_client_quotas_hold_for_kafkas_own_scram_users(
        scram_kafka: KafkaBroker, passthrough: ProxyProcess, topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": passthrough.bootstrap, **scram("alice", "SCRAM-SHA-256")})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(60)
    runs = {"alice (user quota)": ("any", scram("alice", "SCRAM-SHA-256")),
            "bob/bulk (user+client-id quota)": ("bulk", scram("bob", "SCRAM-SHA-512")),
            "bob/other (no quota)": ("other", scram("bob", "SCRAM-SHA-256"))}
    timelines = {name: Timeline() for name in runs}
    start = time.monotonic() + 1.0
    threads = [threading.Thread(target=produce, args=(passthrough.bootstrap, topic_name, client, start,
                                                      SECONDS, timelines[name]), kwargs={"config": auth})
               for name, (client, auth) in runs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lo, hi = 11.0, 22.0  # a whole window after the first one's burst
    rates = {name: (tl.at(hi) - tl.at(lo)) / (hi - lo) / QUOTA for name, tl in timelines.items()}
    print("rate / quota over 11-22 s:", {name: round(r, 2) for name, r in rates.items()})
    assert all(tl.errors == 0 for tl in timelines.values()), rates
    # Over a whole window after the first burst a flat-out producer runs a little over its quota,
    # as on Kafka (whose broker gave one 1.09-1.18x over whole windows): measured 1.05-1.10 in
    # three runs on 2 cores beside other jobs (2026-11-28). Bytes charged 1.5 times (Rate.record)
    # read 0.78, which the old bound (over 0.6) let pass. The upper bound catches gross
    # under-throttling only: the throttle time cut to half read 1.19.
    assert 0.95 < rates["alice (user quota)"] < 1.2, rates
    assert 0.95 < rates["bob/bulk (user+client-id quota)"] < 1.2, rates
    assert rates["bob/other (no quota)"] > 2.0, rates  # the same user, another client-id: free
    log = passthrough.log_text()
    assert "authenticated as alice" in log and "authenticated as bob" in log
    # Kafka enforced nothing: it has no quota configured (asked directly, not through the proxy).
    direct = run_tool("ConfigCommand", "--bootstrap-server", scram_kafka.address, "--describe",
                      "--entity-type", "users")
    assert direct.returncode == 0 and "SCRAM-SHA-256" in direct.stdout, direct.stdout + direct.stderr
    assert "byte_rate" not in direct.stdout
