"""Properties of the SASL server (terminating mode) and client (towards brokers): any user the
client and store agree on authenticates as exactly that user; any other bytes from a client end
in SaslAuthenticationError, any other bytes from a broker in SaslClientError, never anything else.

The store is built from real credentials at low iteration counts (PBKDF2 is what a login costs,
and a property test makes hundreds): the code paths are those of a store from `users add`."""

from __future__ import annotations

import hashlib

from hypothesis import example, given
from hypothesis import strategies as st
from scramp import ScramMechanism

from kafka_quota_proxy.identity.credentials import (
    PLAIN,
    CredentialStore,
    PlainVerifier,
    ScramCredential,
    UserCredentials,
)
from kafka_quota_proxy.identity.sasl_client import SaslClient, SaslClientError
from kafka_quota_proxy.identity.sasl_server import SaslAuthenticationError, SaslServer
from tests.support.mutations import mutated

SCRAM = ["SCRAM-SHA-256", "SCRAM-SHA-512"]
MECHANISMS = [PLAIN, *SCRAM]
SALT = b"0123456789abcdef"
USER, PASSWORD = "alice", "pw-of-alice"


def credentials(password: str) -> UserCredentials:
    scram = {}
    for m in SCRAM:
        scram[m] = ScramCredential(*ScramMechanism(m).make_auth_info(password, iteration_count=4096))
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), SALT, 1)
    return UserCredentials(scram, PlainVerifier(SALT, 1, digest))


STORE = CredentialStore({USER: credentials(PASSWORD)})

# What both sides accept unchanged: SASLprep leaves these alone, and NUL is not among them.
safe_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E) | st.sampled_from("éßΩ"),
                    min_size=1, max_size=16)


def exchange(client: SaslClient, server: SaslServer) -> str | None:
    step = server.step(client.first())
    while not step.done:
        token = client.step(step.server_bytes)
        assert token is not None
        step = server.step(token)
    assert client.step(step.server_bytes) is None and client.done  # SCRAM: the server's signature
    return step.principal


@given(st.sampled_from(MECHANISMS), safe_text, safe_text)
def test_agreed_credentials_authenticate_as_that_user(mechanism: str, user: str, password: str) -> None:
    store = CredentialStore({user: credentials(password)})
    assert exchange(SaslClient(mechanism, user, password), SaslServer(mechanism, store)) == user


@given(st.sampled_from(MECHANISMS), safe_text.filter(lambda p: p != PASSWORD))
def test_a_wrong_password_fails_as_bad_credentials(mechanism: str, password: str) -> None:
    try:
        exchange(SaslClient(mechanism, USER, password), SaslServer(mechanism, STORE))
    except SaslAuthenticationError as exc:
        assert exc.reason == "bad_credentials"
    else:
        raise AssertionError("a wrong password authenticated")


def client_tokens(mechanism: str) -> st.SearchStrategy[bytes]:
    first = SaslClient(mechanism, USER, PASSWORD).first()
    return st.binary(max_size=80) | mutated(first)


@given(st.sampled_from(MECHANISMS).flatmap(lambda m: st.tuples(st.just(m), client_tokens(m))))
@example(("SCRAM-SHA-256", b"n,,n=alice,r=abc,tokenauth=true"))
@example(("SCRAM-SHA-256", b"n,,n=\xc3\xa9\xcc\x81,r=abc"))  # a name SASLprep changes
def test_any_first_token_fails_only_with_sasl_authentication_errors(case: tuple[str, bytes]) -> None:
    mechanism, token = case
    try:
        SaslServer(mechanism, STORE).step(token)
    except SaslAuthenticationError:
        pass


@st.composite
def scram_finals(draw: st.DrawFn) -> tuple[str, SaslServer, bytes]:
    mechanism = draw(st.sampled_from(SCRAM))
    client, server = SaslClient(mechanism, USER, PASSWORD), SaslServer(mechanism, STORE)
    server_first = server.step(client.first()).server_bytes
    final = client.step(server_first)
    assert final is not None
    return mechanism, server, draw(st.binary(max_size=80) | mutated(final))


@given(scram_finals())
def test_any_final_token_fails_only_with_sasl_authentication_errors(
        case: tuple[str, SaslServer, bytes]) -> None:
    _, server, token = case
    try:
        step = server.step(token)
    except SaslAuthenticationError:
        return
    assert step.done and step.principal == USER  # a damage that changed nothing that counts


@st.composite
def broker_replies(draw: st.DrawFn) -> tuple[SaslClient, bytes]:
    """A client that sent its first token, and what a broker (or an attacker) answers to it."""
    mechanism = draw(st.sampled_from(SCRAM))
    client, server = SaslClient(mechanism, USER, PASSWORD), SaslServer(mechanism, STORE)
    server_first = server.step(client.first()).server_bytes
    return client, draw(st.binary(max_size=80) | mutated(server_first))


@given(broker_replies())
@example((SaslClient("SCRAM-SHA-256", USER, PASSWORD), b"r=,s=QQ==,i=4096"))
@example((SaslClient("SCRAM-SHA-256", USER, PASSWORD), b"r=x,s=QQ==,i=-1"))
def test_any_broker_reply_fails_only_with_sasl_client_errors(case: tuple[SaslClient, bytes]) -> None:
    client, reply = case
    if client._state == "start":  # the explicit examples come without a first token sent
        client.first()
    try:
        final = client.step(reply)
    except SaslClientError:
        return
    # The damage left a usable server-first message: the broker's final answer is next.
    assert final is not None
    try:
        client.step(reply)
    except SaslClientError:
        pass
