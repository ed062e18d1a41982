"""A delegation token created at Apache Kafka itself, never through the proxy, and a Java client
logging in with it through the proxy's SASL passthrough (SCRAM, tokenauth=true): the proxy
identifies it as Kafka does, as the token's owner, and the owner's producer_byte_rate holds it,
with Kafka enforcing no quota. The proxy learns the owner by asking Kafka itself, logged in as its
own user (upstream_sasl), since Kafka answers no token request on a token's own connection.
Kafka only: tokens need a broker with SCRAM users and delegation.token.secret.key."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.kafka import KafkaBroker
from devkit.kafka_jvm import DelegationToken, run_tool
from devkit.processes import ProxyProcess, free_port

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

QUOTA = 262_144  # bytes/s, alice's producer_byte_rate at the proxy
RECORD = 1000
SECONDS = 24  # the run, at the quota: RECORDS records of RECORD bytes
RECORDS = QUOTA * SECONDS // RECORD
PASSWORDS = {"alice": "alice-Secret-1", "kqp-refresh": "refresh-Secret-3"}


@pytest.fixture(scope="module")
def token_kafka() -> Iterator[KafkaBroker]:
    broker = KafkaBroker(sasl_port=free_port(), scram_users=PASSWORDS, delegation_tokens=True).start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="module")
def passthrough(token_kafka: KafkaBroker) -> Iterator[ProxyProcess]:
    proxy = ProxyProcess(token_kafka.sasl_address, token_kafka.node_id, extra_config={
        "sasl": {"mode": "passthrough"},
        # The proxy's own login: its metadata refresh, and its DescribeDelegationToken.
        "upstream_sasl": {"mechanism": "SCRAM-SHA-512", "username": "kqp-refresh",
                          "password": PASSWORDS["kqp-refresh"]},
        "quotas": [{"user": "alice", "producer_byte_rate": QUOTA}]}).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def token(token_kafka: KafkaBroker) -> DelegationToken:
    """alice's token, made at Kafka directly: the proxy never sees it created."""
    return token_kafka.create_delegation_token("alice", PASSWORDS["alice"])


def client_config(token: DelegationToken, mechanism: str, directory: Path) -> Path:
    path = directory / f"token-{mechanism}.properties"
    path.write_text(token.client_properties(mechanism))
    return path


def throttled_ms(proxy: ProxyProcess) -> dict[str, float]:
    """The proxy's produce throttle time by user."""
    found: dict[str, float] = {}
    for line in proxy.metrics().splitlines():
        if line.startswith("kafka_quota_proxy_throttle_time_ms_total{") and 'quota_type="produce"' in line:
            user = re.search(r'user="([^"]*)"', line)
            if user:
                found[user[1]] = found.get(user[1], 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def test_a_token_client_is_held_by_its_owners_quota(token_kafka: KafkaBroker, passthrough: ProxyProcess,
                                                    token: DelegationToken, topic_name: str) -> None:
    alice = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
             "sasl.username": "alice", "sasl.password": PASSWORDS["alice"]}
    admin = AdminClient({"bootstrap.servers": passthrough.bootstrap, **alice})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(60)
    with tempfile.TemporaryDirectory(prefix="kqp-token-") as scratch:
        config = client_config(token, "SCRAM-SHA-512", Path(scratch))
        produced = run_tool("ProducerPerformance", "--topic", topic_name, "--num-records", str(RECORDS),
                            "--record-size", str(RECORD), "--throughput", "-1",
                            "--command-property", f"bootstrap.servers={passthrough.bootstrap}",
                            "client.id=token-loader", "--command-config", str(config), timeout=180)
    assert produced.returncode == 0, produced.stderr[-2000:]
    summary = re.search(rf"^{RECORDS} records sent, ([\d.]+) records/sec", produced.stdout, re.M)
    assert summary, produced.stdout[-2000:]
    rate = float(summary[1]) * RECORD / QUOTA
    print(f"token client: {rate:.2f} of alice's quota over the whole run")
    # Unheld it runs at many times the quota (megabytes a second); held, the first window's
    # burst is all it gets above it. Measured 0.96, 0.96 and 0.98 of the quota over the whole run
    # (2026-11-28, 2 cores beside other jobs); bytes charged 1.5 times (Rate.record) read 0.66,
    # which the old bound (over 0.6) let pass.
    assert 0.85 < rate < 1.1, produced.stdout[-2000:]
    log = passthrough.log_text()
    assert f"authenticated as alice (the owner of delegation token {token.token_id})" in log
    assert "owner unknown" not in log
    throttles = throttled_ms(passthrough)
    assert throttles.get("alice", 0) > 0 and token.token_id not in throttles, throttles
    assert token.hmac not in log  # the token's password
    # Kafka enforced nothing: it has no quota configured (asked directly, not through the proxy).
    direct = run_tool("ConfigCommand", "--bootstrap-server", token_kafka.address, "--describe",
                      "--entity-type", "users")
    assert direct.returncode == 0 and "SCRAM-SHA-256" in direct.stdout, direct.stdout + direct.stderr
    assert "byte_rate" not in direct.stdout


def test_a_token_connection_may_not_ask_for_tokens_through_the_proxy_either(
        passthrough: ProxyProcess, token: DelegationToken) -> None:
    """Kafka refuses token requests on a token's own connection (KafkaApis.allowTokenRequests),
    which is why the proxy asks on its own; through the proxy a client gets Kafka's answer."""
    with tempfile.TemporaryDirectory(prefix="kqp-token-") as scratch:
        config = client_config(token, "SCRAM-SHA-256", Path(scratch))
        described = run_tool("DelegationTokenCommand", "--bootstrap-server", passthrough.bootstrap,
                             "--describe", "--command-config", str(config))
    assert described.returncode != 0
    assert "Delegation Token requests are not allowed" in described.stdout + described.stderr
    owner_line = f"authenticated as alice (the owner of delegation token {token.token_id})"
    assert owner_line in passthrough.log_text()
