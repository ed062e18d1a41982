"""SaslServer against real client algorithms (scramp's ScramClient, hand-built PLAIN tokens),
and SaslClient against SaslServer end to end."""

from __future__ import annotations

import base64

import pytest
from scramp import ScramClient, ScramMechanism

from kafka_quota_proxy.identity.credentials import CredentialStore
from kafka_quota_proxy.identity.sasl_client import SaslClient, SaslClientError
from kafka_quota_proxy.identity.sasl_server import (
    SUPPORTED_MECHANISMS,
    IllegalSaslState,
    SaslAuthenticationError,
    SaslServer,
    SaslStep,
    UnsupportedSaslMechanism,
)

SCRAM = ["SCRAM-SHA-256", "SCRAM-SHA-512"]
PASSWORD = "s3cret-Pa55word"
PLAIN_FAILED = "Authentication failed: Invalid username or password"


def scram_failed(mechanism: str) -> str:
    return ("Authentication failed during authentication due to invalid credentials "
            f"with SASL mechanism {mechanism}")


@pytest.fixture(scope="module")
def store() -> CredentialStore:
    s = CredentialStore()
    for user in ("alice", "a,b=c", "ünïcødé"):
        s.add(user, PASSWORD, plain_iterations=100_000)
    s.add("scram-only", PASSWORD, ["SCRAM-SHA-512"])
    s.add("plain-only", PASSWORD, ["PLAIN"], plain_iterations=100_000)
    return s


def scram_login(store: CredentialStore, mechanism: str, user: str,
                password: str) -> tuple[SaslStep, ScramClient]:
    client = ScramClient([mechanism], user, password)
    server = SaslServer(mechanism, store)
    first = server.step(client.get_client_first().encode())
    assert first.done is False and first.principal is None
    client.set_server_first(first.server_bytes.decode())
    final = server.step(client.get_client_final().encode())
    return final, client


def plain(authzid: str, user: str, password: str) -> bytes:
    return f"{authzid}\x00{user}\x00{password}".encode()


def test_supported_mechanisms() -> None:
    assert SUPPORTED_MECHANISMS == ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")


def test_unsupported_mechanism(store: CredentialStore) -> None:
    for mechanism in ("GSSAPI", "OAUTHBEARER", "SCRAM-SHA-1", "plain"):
        with pytest.raises(UnsupportedSaslMechanism) as info:
            SaslServer(mechanism, store)
        assert str(info.value) == f"Unsupported SASL mechanism {mechanism}"
        assert isinstance(info.value, SaslAuthenticationError)


# ---- SCRAM ----


@pytest.mark.parametrize("mechanism", SCRAM)
@pytest.mark.parametrize("user", ["alice", "a,b=c", "ünïcødé"])
def test_scram_success(store: CredentialStore, mechanism: str, user: str) -> None:
    final, client = scram_login(store, mechanism, user, PASSWORD)
    assert final.done is True and final.principal == user
    assert final.server_bytes.startswith(b"v=")
    client.set_server_final(final.server_bytes.decode())  # the client accepts the server's signature


def test_scram_server_first_carries_the_stored_salt_and_iterations(store: CredentialStore) -> None:
    client = ScramClient(["SCRAM-SHA-256"], "alice", PASSWORD, c_nonce="clientnonce")
    first = SaslServer("SCRAM-SHA-256", store).step(client.get_client_first().encode())
    fields = dict(part.split("=", 1) for part in first.server_bytes.decode().split(","))
    info = store.scram_auth_info("alice", "SCRAM-SHA-256")
    assert info is not None
    assert fields["r"].startswith("clientnonce") and len(fields["r"]) > len("clientnonce")
    assert base64.b64decode(fields["s"]) == info[0]
    assert fields["i"] == "8192"


@pytest.mark.parametrize("mechanism", SCRAM)
def test_scram_wrong_password(store: CredentialStore, mechanism: str) -> None:
    with pytest.raises(SaslAuthenticationError) as info:
        scram_login(store, mechanism, "alice", PASSWORD + "x")
    assert str(info.value) == scram_failed(mechanism)
    assert info.value.reason == "bad_credentials"
    assert PASSWORD not in str(info.value)


@pytest.mark.parametrize("mechanism", SCRAM)
@pytest.mark.parametrize("user", ["nobody", "plain-only"])
def test_scram_unknown_user_fails_only_at_the_proof(store: CredentialStore, mechanism: str,
                                                    user: str) -> None:
    # The first step answers as for a real user: nothing tells the client the name is unknown.
    with pytest.raises(SaslAuthenticationError) as info:
        scram_login(store, mechanism, user, PASSWORD)
    assert str(info.value) == scram_failed(mechanism)
    assert info.value.reason == "unknown_user"


def test_scram_unknown_user_sees_a_stable_salt(store: CredentialStore) -> None:
    def salt_for(user: str) -> str:
        client = ScramClient(["SCRAM-SHA-256"], user, PASSWORD)
        first = SaslServer("SCRAM-SHA-256", store).step(client.get_client_first().encode())
        return dict(p.split("=", 1) for p in first.server_bytes.decode().split(","))["s"]

    assert salt_for("nobody") == salt_for("nobody")
    assert salt_for("nobody") != salt_for("somebody")
    assert len(base64.b64decode(salt_for("nobody"))) == 32  # the length of a real scramp salt


def test_scram_mechanism_mismatch_fails(store: CredentialStore) -> None:
    # "scram-only" has SCRAM-SHA-512 only.
    with pytest.raises(SaslAuthenticationError) as info:
        scram_login(store, "SCRAM-SHA-256", "scram-only", PASSWORD)
    assert info.value.reason == "unknown_user"
    final, _ = scram_login(store, "SCRAM-SHA-512", "scram-only", PASSWORD)
    assert final.principal == "scram-only"


@pytest.mark.parametrize("message", [
    b"",
    b"garbage",
    b"n,,r=abc",  # no name
    b"n,,n=,r=abc",  # empty name
    b"n,,n=a=2Xb,r=abc",  # bad escape
    b"x,,n=alice,r=abc",  # bad gs2 flag
    b"n,a=alice,n=alice,r=abc",  # authzid: scramp refuses it
    b"p=tls-unique,,n=alice,r=abc",  # channel binding the proxy does not offer
    b"n,,n=alice",  # no nonce
    b"n,,n=\xff,r=abc",  # not UTF-8
    b"n,,n=alice,r=abc,tokenauth=true",  # a Kafka delegation token
])
def test_scram_malformed_client_first(store: CredentialStore, message: bytes) -> None:
    with pytest.raises(SaslAuthenticationError) as info:
        SaslServer("SCRAM-SHA-256", store).step(message)
    assert str(info.value) == scram_failed("SCRAM-SHA-256")
    assert info.value.reason in ("malformed", "unsupported_token_auth")


def test_scram_tampered_client_final(store: CredentialStore) -> None:
    client = ScramClient(["SCRAM-SHA-256"], "alice", PASSWORD)
    server = SaslServer("SCRAM-SHA-256", store)
    first = server.step(client.get_client_first().encode())
    client.set_server_first(first.server_bytes.decode())
    final = client.get_client_final()
    nonce = final.split(",")[1]
    with pytest.raises(SaslAuthenticationError):
        server.step(final.replace(nonce, nonce + "x").encode())


def test_scram_step_after_done_or_failure_is_illegal(store: CredentialStore) -> None:
    client = ScramClient(["SCRAM-SHA-256"], "alice", PASSWORD)
    server = SaslServer("SCRAM-SHA-256", store)
    first = server.step(client.get_client_first().encode())
    client.set_server_first(first.server_bytes.decode())
    assert server.step(client.get_client_final().encode()).done and server.done
    with pytest.raises(IllegalSaslState):
        server.step(b"again")

    failed = SaslServer("SCRAM-SHA-256", store)
    with pytest.raises(SaslAuthenticationError):
        failed.step(b"garbage")
    with pytest.raises(IllegalSaslState):
        failed.step(b"n,,n=alice,r=abc")
    assert not failed.done


def test_scram_server_reads_credentials_made_by_scramp_directly() -> None:
    # A store entry made exactly as scramp makes auth info, loaded from the file format.
    store = CredentialStore()
    store.add("svc", PASSWORD, ["SCRAM-SHA-256"], scram_iterations=4096)
    info = store.scram_auth_info("svc", "SCRAM-SHA-256")
    assert info is not None
    made = ScramMechanism("SCRAM-SHA-256").make_auth_info(PASSWORD, iteration_count=4096, salt=info[0])
    assert made == info
    final, _ = scram_login(store, "SCRAM-SHA-256", "svc", PASSWORD)
    assert final.principal == "svc"


# ---- PLAIN ----


def test_plain_success(store: CredentialStore) -> None:
    assert SaslServer("PLAIN", store).step(plain("", "alice", PASSWORD)) == SaslStep(b"", True, "alice")
    assert SaslServer("PLAIN", store).step(plain("alice", "alice", PASSWORD)).principal == "alice"
    assert SaslServer("PLAIN", store).step(plain("", "ünïcødé", PASSWORD)).principal == "ünïcødé"
    assert SaslServer("PLAIN", store).step(plain("", "plain-only", PASSWORD)).principal == "plain-only"


@pytest.mark.parametrize("user, password, reason", [
    ("alice", PASSWORD + "x", "bad_credentials"),
    ("alice", PASSWORD.upper(), "bad_credentials"),
    ("nobody", PASSWORD, "unknown_user"),
    ("scram-only", PASSWORD, "unknown_user"),  # PLAIN is not enabled for it
])
def test_plain_failures(store: CredentialStore, user: str, password: str, reason: str) -> None:
    with pytest.raises(SaslAuthenticationError) as info:
        SaslServer("PLAIN", store).step(plain("", user, password))
    assert str(info.value) == PLAIN_FAILED
    assert info.value.reason == reason
    assert password not in str(info.value)


def test_plain_authzid_must_match_the_user(store: CredentialStore) -> None:
    with pytest.raises(SaslAuthenticationError) as info:
        SaslServer("PLAIN", store).step(plain("admin", "alice", PASSWORD))
    assert str(info.value) == ("Authentication failed: "
                               "Client requested an authorization id that is different from username")
    assert info.value.reason == "authzid_mismatch"
    # With a wrong password the authzid is never looked at.
    with pytest.raises(SaslAuthenticationError, match="Invalid username or password"):
        SaslServer("PLAIN", store).step(plain("admin", "alice", "wrong"))


@pytest.mark.parametrize("token, message", [
    (b"", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
    (b"alice\x00" + PASSWORD.encode(), "Invalid SASL/PLAIN response: expected 3 tokens, got 2"),
    (b"\x00alice\x00pw\x00", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
    # Kafka's extractTokens stops counting at four.
    (b"\x00alice\x00pw\x00x\x00y", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
    (b"\x00\x00" + PASSWORD.encode(), "Authentication failed: username not specified"),
    (b"\x00alice\x00", "Authentication failed: password not specified"),
    (b"\x00alice\x00\xff\xfe", PLAIN_FAILED),  # not UTF-8
])
def test_plain_malformed_tokens(store: CredentialStore, token: bytes, message: str) -> None:
    with pytest.raises(SaslAuthenticationError) as info:
        SaslServer("PLAIN", store).step(token)
    assert str(info.value) == message
    assert PASSWORD not in str(info.value)


def test_plain_is_one_step(store: CredentialStore) -> None:
    server = SaslServer("PLAIN", store)
    server.step(plain("", "alice", PASSWORD))
    with pytest.raises(IllegalSaslState):
        server.step(plain("", "alice", PASSWORD))


# ---- SaslClient ----


def run(client: SaslClient, server: SaslServer) -> str | None:
    token: bytes | None = client.first()
    principal = None
    while token is not None:
        result = server.step(token)
        if result.done:
            principal = result.principal
        token = client.step(result.server_bytes)
    assert client.done
    return principal


@pytest.mark.parametrize("mechanism", ["PLAIN", *SCRAM])
def test_client_against_server(store: CredentialStore, mechanism: str) -> None:
    assert run(SaslClient(mechanism, "alice", PASSWORD), SaslServer(mechanism, store)) == "alice"
    assert run(SaslClient(mechanism, "a,b=c", PASSWORD), SaslServer(mechanism, store)) == "a,b=c"


def test_client_plain_token() -> None:
    client = SaslClient("PLAIN", "alice", PASSWORD)
    assert client.first() == plain("", "alice", PASSWORD)
    assert client.step(b"") is None and client.done


@pytest.mark.parametrize("mechanism", ["PLAIN", *SCRAM])
def test_client_wrong_password_is_refused_by_the_server(store: CredentialStore, mechanism: str) -> None:
    with pytest.raises(SaslAuthenticationError):
        run(SaslClient(mechanism, "alice", "wrong"), SaslServer(mechanism, store))


@pytest.mark.parametrize("mechanism", SCRAM)
def test_client_checks_the_server_signature(store: CredentialStore, mechanism: str) -> None:
    client = SaslClient(mechanism, "alice", PASSWORD)
    server = SaslServer(mechanism, store)
    final = client.step(server.step(client.first()).server_bytes)
    assert final is not None
    signature = server.step(final).server_bytes
    forged = b"v=" + base64.b64encode(bytes(len(base64.b64decode(signature[2:]))))
    with pytest.raises(SaslClientError, match="final message"):
        client.step(forged)
    assert not client.done


def test_client_reports_a_server_error() -> None:
    client = SaslClient("SCRAM-SHA-256", "alice", PASSWORD)
    client.first()
    with pytest.raises(SaslClientError, match="server-first"):
        client.step(b"e=unknown-user")


def test_client_refuses_a_bad_nonce() -> None:
    client = SaslClient("SCRAM-SHA-256", "alice", PASSWORD)
    client.first()
    salt = base64.b64encode(bytes(16)).decode()
    with pytest.raises(SaslClientError):
        client.step(f"r=notmynonce,s={salt},i=4096".encode())


def test_client_refuses_too_many_iterations(store: CredentialStore) -> None:
    client = SaslClient("SCRAM-SHA-256", "alice", PASSWORD, max_iterations=4096)
    server = SaslServer("SCRAM-SHA-256", store)  # asks for 8192
    with pytest.raises(SaslClientError, match="8192 iterations"):
        client.step(server.step(client.first()).server_bytes)
    with pytest.raises(RuntimeError):
        client.step(b"anything")  # a failed exchange is over


def test_client_misuse_and_bad_settings() -> None:
    client = SaslClient("PLAIN", "alice", PASSWORD)
    with pytest.raises(RuntimeError):
        client.step(b"")
    client.first()
    with pytest.raises(RuntimeError):
        client.first()
    for mechanism, user, password in [
        ("GSSAPI", "alice", PASSWORD),
        ("PLAIN", "", PASSWORD),
        ("PLAIN", "alice", ""),
        ("PLAIN", "al\x00ice", PASSWORD),
        ("SCRAM-SHA-256", "alice", "non\u00a0breaking"),  # SASLprep would change it
        ("SCRAM-SHA-256", "\u2163", PASSWORD),
    ]:
        with pytest.raises(ValueError) as info:
            SaslClient(mechanism, user, password)
        if password:
            assert password not in str(info.value)
