"""Who may manage quotas through the proxy, and the audit trail of every change asked for
(proxy/quota_runtime/access.py, proxy/quota_runtime/audit.py), over the wire with real SASL logins."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from kafka_quota_proxy.config import ConfigError, Settings, merge
from kafka_quota_proxy.config.credentials_file import save_credentials
from kafka_quota_proxy.config.identity_settings import TlsSettings
from kafka_quota_proxy.config.settings import parse_values
from kafka_quota_proxy.identity.credentials import CredentialStore
from kafka_quota_proxy.proxy.quota_runtime.access import (
    QuotaAccess,
    authenticates_clients,
    is_loopback,
    management_policy,
)
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from tests.proxy.conftest import Harness, is_closed, running
from tests.proxy.quota_support import Client, alter, alter_results, connect, describe, entries, metric, run

ALICE_SECRET = "alice-Secret-1"
ADMIN_SECRET = "admin-Secret-9"
ALICE = QuotaEntity(user="alice")
ALICE_QUOTA = [{"user": "alice", "producer_byte_rate": 1000}]
RAISE_ALICE = alter([([("user", "alice")], [("producer_byte_rate", 1e12, False)])])
NOT_IN_ALTER = ("Principal alice may not alter client quotas: it is not in quota.alter_principals")


def users_file(tmp_path: Path) -> str:
    path = tmp_path / "users.yaml"
    store = CredentialStore()
    store.add("alice", ALICE_SECRET, ["PLAIN"])
    store.add("admin", ADMIN_SECRET, ["PLAIN"])
    store.add("reader", "reader-Secret-3", ["PLAIN"])
    save_credentials(store, path)
    return str(path)


async def login(h: Harness, user: str, password: str) -> Client:
    c = await connect(h)
    assert (await c.call(SaslHandshakeRequest[1](mechanism="PLAIN"))).error_code == 0
    token = f"\x00{user}\x00{password}".encode()
    assert (await c.call(SaslAuthenticateRequest[1](auth_bytes=token))).error_code == 0
    return c


def sasl(tmp_path: Path, **quota: Any) -> dict[str, Any]:
    return {"sasl": {"mode": "terminate", "credentials_file": users_file(tmp_path)},
            "quota": quota, "quotas": ALICE_QUOTA}


def changes(h: Harness, source: str, outcome: str) -> float:
    return metric(h, "kafka_quota_proxy_quota_changes_total", source=source, outcome=outcome) or 0.0


def audit_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kafka_quota_proxy.audit"]


def test_a_tenant_cannot_lift_its_own_quota_and_an_admin_can(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """The scenario of the issue: alice, under producer_byte_rate 1000, asks for 1e12."""
    async def scenario() -> tuple[int, int]:
        async with running(**sasl(tmp_path, alter_principals=["admin"])) as h:
            alice = await login(h, "alice", ALICE_SECRET)
            result = await alice.call(RAISE_ALICE)
            assert alter_results(result) == [(31, NOT_IN_ALTER)]
            assert [[(e.entity_type, e.entity_name) for e in entry.entity] for entry in result.entries] == [
                [("user", "alice")]]
            assert h.proxy.quotas.entries() == {ALICE: {QuotaKey.PRODUCER_BYTE_RATE: 1000.0}}
            # Every entry of a refused request gets the error, in Kafka's shape.
            two = await alice.call(alter([([("client-id", "c")], [("producer_byte_rate", 9e9, False)]),
                                          ([("user", None)], [("consumer_byte_rate", 1.0, True)])]))
            assert [code for code, _ in alter_results(two)] == [31, 31]

            admin = await login(h, "admin", ADMIN_SECRET)
            assert alter_results(await admin.call(RAISE_ALICE)) == [(0, None)]
            assert h.proxy.quotas.entries() == {ALICE: {QuotaKey.PRODUCER_BYTE_RATE: 1e12}}
            assert (changes(h, "api", "refused"), changes(h, "api", "accepted")) == (3, 1)
            ports = alice.writer.get_extra_info("sockname")[1], admin.writer.get_extra_info("sockname")[1]
            alice.close()
            admin.close()
            return ports

    with caplog.at_level(logging.INFO, logger="kafka_quota_proxy"):
        alice_port, admin_port = asyncio.run(scenario())
    lines = audit_lines(caplog)
    assert lines == [
        f"quota change refused: source=api principal=alice address=127.0.0.1:{alice_port} "
        f"entity=[user=alice] key=producer_byte_rate old=1000 new=1000000000000 reason={NOT_IN_ALTER!r}",
        f"quota change refused: source=api principal=alice address=127.0.0.1:{alice_port} "
        f"entity=[client-id=c] key=producer_byte_rate old=none new=9000000000 reason={NOT_IN_ALTER!r}",
        f"quota change refused: source=api principal=alice address=127.0.0.1:{alice_port} "
        f"entity=[user=<default>] key=consumer_byte_rate old=none new=none reason={NOT_IN_ALTER!r}",
        f"quota change accepted: source=api principal=admin address=127.0.0.1:{admin_port} "
        f"entity=[user=alice] key=producer_byte_rate old=1000 new=1000000000000",
    ]
    everything = "\n".join(r.getMessage() for r in caplog.records)
    assert ALICE_SECRET not in everything and ADMIN_SECRET not in everything


def test_describe_is_limited_the_same_way(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(**sasl(tmp_path, alter_principals=["admin"], describe_principals=["reader"])) as h:
            everything = describe([("user", 2, None)])  # match_type 2: every user entity
            alice = await login(h, "alice", ALICE_SECRET)
            refused = await alice.call(everything)
            assert (refused.error_code, refused.entries) == (31, None)
            assert refused.error_message == ("Principal alice may not describe client quotas: it is not "
                                             "in quota.describe_principals or quota.alter_principals")
            for user, secret in (("reader", "reader-Secret-3"), ("admin", ADMIN_SECRET)):
                c = await login(h, user, secret)
                answer = await c.call(everything)
                assert answer.error_code == 0
                assert entries(answer) == {(("user", "alice"),): {"producer_byte_rate": 1000.0}}
                c.close()
            reader = await login(h, "reader", "reader-Secret-3")  # may read, may not write
            assert alter_results(await reader.call(RAISE_ALICE))[0][0] == 31
            alice.close()
            reader.close()
    run(scenario())


def test_with_nothing_set_nobody_may_and_the_first_refusal_says_what_to_set(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with running(**sasl(tmp_path)) as h:
            for user, secret in (("alice", ALICE_SECRET), ("admin", ADMIN_SECRET)):
                c = await login(h, user, secret)
                assert alter_results(await c.call(RAISE_ALICE))[0][0] == 31
                assert (await c.call(describe([("user", 2, None)]))).error_code == 31
                c.close()
            assert h.proxy.quotas.entries() == {ALICE: {QuotaKey.PRODUCER_BYTE_RATE: 1000.0}}
    with caplog.at_level(logging.INFO, logger="kafka_quota_proxy"):
        run(scenario())
    notes = [m for m in (r.getMessage() for r in caplog.records) if "quota.alter_principals to your" in m]
    assert len(notes) == 1  # once, however many refusals
    assert notes[0].startswith("a quota request was refused: quota management through the proxy is closed")
    assert 'or to ["*"] for the old open behaviour' in notes[0]


def test_anonymous_from_loopback_may_only_while_no_client_authenticates() -> None:
    """No SASL, no client certificates, nobody named: ANONYMOUS from 127.0.0.1 may (make demo,
    a laptop trial); from any other address (here, as a PROXY protocol header tells) it may not."""
    async def scenario() -> None:
        async with running(quotas=ALICE_QUOTA, proxy_protocol=True) as h:
            for source, code in (("127.0.0.1", 0), ("10.1.2.3", 31)):
                reader, writer = await h.connect()
                writer.write(f"PROXY TCP4 {source} 127.0.0.1 5555 9092\r\n".encode())
                c = Client(reader, writer, "c")
                answer = await c.call(alter([([("user", "bob")], [("producer_byte_rate", 5.0, False)])]))
                assert alter_results(answer)[0][0] == code, source
                c.close()
        async with running(quotas=ALICE_QUOTA, quota={"anonymous_loopback": False}) as h:
            c = await connect(h)
            answer = await c.call(alter([([("user", "bob")], [("producer_byte_rate", 5.0, False)])]))
            assert alter_results(answer) == [(31, "Principal ANONYMOUS may not alter client quotas: it is "
                                                  "not in quota.alter_principals")]
            c.close()
    run(scenario())


def settings(**values: Any) -> Settings:
    return merge(parse_values({"upstream": "127.0.0.1:9092", **values}))


@pytest.mark.parametrize(("values", "principal", "ip", "alter_ok", "describe_ok"), [
    ({}, "ANONYMOUS", "127.0.0.1", True, True),
    ({}, "ANONYMOUS", "::1", True, True),
    ({}, "ANONYMOUS", "::ffff:127.0.0.5", True, True),
    ({}, "ANONYMOUS", "10.0.0.1", False, False),
    ({}, "alice", "127.0.0.1", False, False),  # a named principal (principals_by_cidr) is not ANONYMOUS
    ({"quota": {"anonymous_loopback": False}}, "ANONYMOUS", "127.0.0.1", False, False),
    ({"quota": {"alter_principals": ["admin"]}}, "ANONYMOUS", "127.0.0.1", False, False),  # named: just those
    ({"sasl": {"mode": "passthrough"}}, "ANONYMOUS", "127.0.0.1", False, False),
    ({"quota": {"alter_principals": ["*"]}}, "alice", "10.0.0.1", True, True),
    ({"quota": {"describe_principals": ["*"]}}, "alice", "10.0.0.1", False, True),
    ({"quota": {"alter_principals": ["admin"], "describe_principals": ["ops"]}}, "ops", "10.0.0.1",
     False, True),
    ({"quota": {"alter_principals": ["admin"]}}, "admin", "10.0.0.1", True, True),
])
def test_who_may(values: dict[str, Any], principal: str, ip: str, alter_ok: bool, describe_ok: bool) -> None:
    s = settings(**values)
    access = QuotaAccess(s.sasl.mode != "none")
    assert access.may_alter(s.quota, principal, ip).allowed is alter_ok
    assert access.may_describe(s.quota, principal, ip).allowed is describe_ok


def test_client_certificates_count_as_authentication() -> None:
    for client_auth, expected in (("none", False), ("requested", True), ("required", True)):
        s = Settings(upstream=settings().upstream, tls=TlsSettings("c.pem", "k.pem", "ca.pem", client_auth))
        assert authenticates_clients(s) is expected, client_auth


def test_is_loopback() -> None:
    assert [is_loopback(a) for a in ("127.0.0.1", "127.255.0.9", "::1", "::ffff:127.0.0.1", "10.0.0.1",
                                     "::ffff:10.0.0.1", "not an address", "")] == [
        True, True, True, True, False, False, False, False]


def test_the_policy_line_and_the_open_to_everyone_warning() -> None:
    line, warnings = management_policy(settings())
    assert line == ("quota management: alter by nobody; describe by nobody; and ANONYMOUS from loopback "
                    "(no client authentication configured)")
    assert warnings == []
    open_quota = {"alter_principals": ["*"], "describe_principals": ["ops"]}
    line, warnings = management_policy(settings(sasl={"mode": "passthrough"}, quota=open_quota))
    assert line == "quota management: alter by everyone; describe by everyone"
    assert warnings == ['quota.alter_principals is ["*"] while clients authenticate: every client, tenants '
                        'included, may change every quota; name the admin principals instead']
    # Without authentication "*" is what an operator asked for: no warning.
    assert management_policy(settings(quota={"alter_principals": ["*"]}))[1] == []


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="quota.anonymous_loopback"):
        settings(quota={"anonymous_loopback": "yes"})
    with pytest.raises(ConfigError, match="quota.describe_principals"):
        settings(quota={"describe_principals": "admin"})


def test_check_config_says_who_may_and_warns_when_open_to_everyone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kafka_quota_proxy.cli.main import main

    path = tmp_path / "proxy.yaml"
    path.write_text("upstream: kafka:9092\nsasl: {mode: passthrough}\nquota: {alter_principals: ['*']}\n")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == [
        "  quota management: alter by everyone; describe by everyone",
        '  warning: quota.alter_principals is ["*"] while clients authenticate: every client, tenants '
        "included, may change every quota; name the admin principals instead",
        "  quota state: this process's own (no store:)"]


def test_start_says_who_may_and_warns_when_open_to_everyone(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with running(**sasl(tmp_path, alter_principals=["*"])):
            pass
    with caplog.at_level(logging.INFO, logger="kafka_quota_proxy"):
        run(scenario())
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "quota" in r.getMessage()
            and r.name == "kafka_quota_proxy"]
    assert said == [
        ("INFO", "quota management: alter by everyone; describe by everyone"),
        ("WARNING", 'quota.alter_principals is ["*"] while clients authenticate: every client, tenants '
                    "included, may change every quota; name the admin principals instead")]


def test_a_user_the_kerberos_rules_cannot_map_fails_authentication(tmp_path: Path) -> None:
    """sasl.kerberos.principal.to.local.rules with no rule for the name: Kafka fails the
    authentication. Before, the exception escaped the stage and the login never got an answer."""
    async def scenario() -> None:
        users = tmp_path / "realm-users.yaml"
        store = CredentialStore()
        store.add("bob@OTHER.ORG", "bob-Secret-4", ["PLAIN"])
        save_credentials(store, users)
        async with running(sasl={"mode": "terminate", "credentials_file": str(users),
                                 "kerberos_rules": ["RULE:[1:$1@$0](.*@EXAMPLE.COM)s/@.*//"]}) as h:
            c = await connect(h)
            assert (await c.call(SaslHandshakeRequest[1](mechanism="PLAIN"))).error_code == 0
            token = b"\x00bob@OTHER.ORG\x00bob-Secret-4"
            answer = await asyncio.wait_for(c.call(SaslAuthenticateRequest[1](auth_bytes=token)), 10)
            assert (answer.error_code, answer.error_message) == (58, "Authentication failed: no principal "
                                                                     "for this user")
            assert await is_closed(c.reader)
            c.close()
    run(scenario())
