"""Quota management secure by default, end to end: a proxy process with SASL termination and
real users, a client library and raw protocol requests (docs/quotas.md, "Who may change quotas").
alice, under producer_byte_rate 1000, cannot lift her own quota; admin can; both attempts are
in the audit log, which holds no credentials."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from devkit.processes import ProxyProcess
from devkit.tansu import Broker
from kafka_quota_proxy.config.credentials_file import save_credentials
from kafka_quota_proxy.identity.credentials import CredentialStore

pytestmark = pytest.mark.integration

SECRETS = {"alice": "alice-Secret-1", "admin": "admin-Secret-9"}
NOT_IN_ALTER = "Principal alice may not alter client quotas: it is not in quota.alter_principals"
NOT_IN_DESCRIBE = ("Principal alice may not describe client quotas: it is not in quota.describe_principals "
                   "or quota.alter_principals")


@pytest.fixture(scope="module")
def managed(broker: Broker, broker_node_id: int, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[ProxyProcess]:
    users = tmp_path_factory.mktemp("users") / "users.yaml"
    store = CredentialStore()
    for name, secret in SECRETS.items():
        store.add(name, secret)
    save_credentials(store, users)
    p = ProxyProcess(broker.address, broker_node_id, extra_config={
        "sasl": {"mode": "terminate", "credentials_file": str(users)},
        "quota": {"alter_principals": ["admin"]},
        "quotas": [{"user": "alice", "producer_byte_rate": 1000}]}).start()
    try:
        yield p
    finally:
        p.stop()


def alter_request(value: float) -> Any:
    cls: Any = AlterClientQuotasRequest
    entity = [cls.EntryData.EntityData(entity_type="user", entity_name="alice")]
    ops = [cls.EntryData.OpData(key="producer_byte_rate", value=value, remove=False)]
    return cls(entries=[cls.EntryData(entity=entity, ops=ops)], validate_only=False)


def describe_request() -> Any:
    cls: Any = DescribeClientQuotasRequest
    return cls(components=[cls.ComponentData(entity_type="user", match_type=0, match="alice")], strict=True)


def admin_client(proxy: ProxyProcess, user: str) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=proxy.bootstrap, security_protocol="SASL_PLAINTEXT",
                            sasl_mechanism="SCRAM-SHA-512", sasl_plain_username=user,
                            sasl_plain_password=SECRETS[user], request_timeout_ms=10_000)


def send(client: KafkaAdminClient, request: Any) -> Any:
    """kafka-python's admin client has no client-quota methods; its connection manager (after
    the SCRAM login, with the versions it negotiated) sends ours."""
    manager = client._manager

    async def call() -> Any:
        return await manager.send(request)
    return manager.run(call)


def alice_quota(client: KafkaAdminClient) -> list[tuple[str, float]]:
    response = send(client, describe_request())
    assert response.error_code == 0
    (entry,) = response.entries
    return [(v.key, v.value) for v in entry.values]


def test_with_a_client_library(managed: ProxyProcess) -> None:
    alice = admin_client(managed, "alice")
    try:
        refused = send(alice, alter_request(1e12))
        assert [(e.error_code, e.error_message) for e in refused.entries] == [(31, NOT_IN_ALTER)]
        described = send(alice, describe_request())
        assert (described.error_code, described.error_message) == (31, NOT_IN_DESCRIBE)
        assert described.entries is None
    finally:
        alice.close()
    admin = admin_client(managed, "admin")
    try:
        assert alice_quota(admin) == [("producer_byte_rate", 1000.0)]  # alice's quota held
        accepted = send(admin, alter_request(2000.0))
        assert [(e.error_code, e.error_message) for e in accepted.entries] == [(0, None)]
        assert alice_quota(admin) == [("producer_byte_rate", 2000.0)]
        assert send(admin, alter_request(1000.0)).entries[0].error_code == 0  # back, for the next test
    finally:
        admin.close()
    log = managed.log_text()
    assert ("quota change refused: source=api principal=alice address=127.0.0.1:" in log
            and "entity=[user=alice] key=producer_byte_rate old=1000 new=1000000000000 reason=" in log)
    assert ("quota change accepted: source=api principal=admin address=127.0.0.1:" in log
            and "entity=[user=alice] key=producer_byte_rate old=1000 new=2000" in log)
    assert not any(secret in log for secret in SECRETS.values())
    assert managed.metric("kafka_quota_proxy_quota_changes_total", source="api", outcome="refused") >= 1


def _frame(request: Any, version: int, correlation_id: int) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="raw")
    return bytes(request.encode(version=version, header=True, framed=True))


def _read(s: socket.socket) -> bytes:
    head = s.recv(4, socket.MSG_WAITALL)
    return s.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)


def _login(proxy: ProxyProcess, user: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    s.sendall(_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1, 1))
    assert struct.unpack_from(">ih", _read(s)) == (1, 0)
    s.sendall(_frame(SaslAuthenticateRequest(auth_bytes=f"\x00{user}\x00{SECRETS[user]}".encode()), 1, 2))
    assert struct.unpack_from(">ih", _read(s)) == (2, 0)
    return s


def test_with_raw_protocol_requests(managed: ProxyProcess, tmp_path: Path) -> None:
    """The scenario of the issue, byte for byte: PLAIN over a plain connection, then
    AlterClientQuotas v1 for user=alice, producer_byte_rate = 1e12."""
    with _login(managed, "alice") as s:
        s.sendall(_frame(alter_request(1e12), 1, 3))
        response = AlterClientQuotasResponse.decode(_read(s)[5:], version=1)
        assert [(e.error_code, e.error_message) for e in response.entries] == [(31, NOT_IN_ALTER)]
        s.sendall(_frame(describe_request(), 1, 4))
        described = DescribeClientQuotasResponse.decode(_read(s)[5:], version=1)
        assert (described.error_code, described.entries) == (31, None)
    with _login(managed, "admin") as s:
        s.sendall(_frame(describe_request(), 1, 5))
        described = DescribeClientQuotasResponse.decode(_read(s)[5:], version=1)
        assert [(v.key, v.value) for v in described.entries[0].values] == [("producer_byte_rate", 1000.0)]
