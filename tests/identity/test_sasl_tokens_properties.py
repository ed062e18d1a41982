"""Properties of the SASL token readers (PLAIN, SCRAM client-first, OAUTHBEARER): the name a
client puts in a valid token is the name read back; arbitrary or damaged tokens raise only
SaslTokenError, the module's own error."""

from __future__ import annotations

import base64
import json

from hypothesis import assume, example, given
from hypothesis import strategies as st
from scramp import ScramClient

from kafka_quota_proxy.identity.sasl_tokens import (
    SaslTokenError,
    oauthbearer_claim,
    parse_oauthbearer_initial_response,
    parse_scram_client_first,
    plain_authcid,
    scram_is_client_first,
    scram_username,
)
from tests.support.mutations import mutated

# Names a client may type: any text without NUL (SCRAM escapes ',' and '=' itself).
names = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), min_size=1,
                max_size=20)
ascii_names = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20)


def readers(token: bytes) -> None:
    """Every reader on the same bytes, each allowed to refuse them only with SaslTokenError."""
    scram_is_client_first(token)
    for read in (plain_authcid, scram_username, parse_oauthbearer_initial_response, oauthbearer_claim):
        try:
            read(token)
        except SaslTokenError:
            pass


# --- PLAIN -----------------------------------------------------------------------------------


@given(names, names, st.booleans())
def test_plain_round_trip(user: str, password: str, with_authzid: bool) -> None:
    token = f"{user if with_authzid else ''}\0{user}\0{password}".encode()
    assert plain_authcid(token) == user


# --- SCRAM -----------------------------------------------------------------------------------


def saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


extension_keys = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzXYZ"), min_size=1, max_size=8)
extension_values = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0,"),
                           min_size=1, max_size=10)


@given(names, ascii_names.filter(lambda n: "," not in n), st.sampled_from(["n", "y"]), st.booleans(),
       st.dictionaries(extension_keys, extension_values, max_size=3))
def test_scram_client_first_round_trip(user: str, nonce: str, flag: str, with_authzid: bool,
                                       extensions: dict[str, str]) -> None:
    authzid = f"a={saslname(user)}" if with_authzid else ""
    ext = "".join(f",{k}={v}" for k, v in extensions.items())
    token = f"{flag},{authzid},n={saslname(user)},r={nonce}{ext}".encode()
    assert scram_is_client_first(token)
    first = parse_scram_client_first(token)
    assert (first.gs2_cbind_flag, first.username, first.nonce, dict(first.extensions)) == (
        flag, user, nonce, extensions)
    assert first.authzid == (user if with_authzid else "")
    assert first.delegation_token == (extensions.get("tokenauth", "").lower() == "true")


@given(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20),
       st.sampled_from(["SCRAM-SHA-256", "SCRAM-SHA-512"]))
def test_scram_username_of_a_real_clients_first_message(user: str, mechanism: str) -> None:
    first = ScramClient([mechanism], user, "pw").get_client_first()
    assert scram_username(first.encode()) == user


# --- OAUTHBEARER -----------------------------------------------------------------------------


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)
kv_values = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E) | st.sampled_from(" \t\r\n"),
                    min_size=1, max_size=12)


@given(st.text(st.characters(blacklist_categories=["Cs"]), max_size=20).filter(str.strip),
       st.booleans(), st.dictionaries(st.text(max_size=5).filter(lambda k: k != "sub"), json_values,
                                      max_size=3),
       st.dictionaries(extension_keys.filter(lambda k: k != "auth"), kv_values, max_size=3),
       st.sampled_from(["Bearer", "bearer", "BEARER"]), st.booleans())
def test_oauthbearer_round_trip(principal: str, signed: bool, claims: dict[str, object],
                                extensions: dict[str, str], scheme: str, with_authzid: bool) -> None:
    header = {"alg": "RS256" if signed else "none"}
    payload = {**claims, "sub": principal}
    token = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(payload).encode())}."
    token += b64url(b"signature") if signed else ""
    expected = principal.strip() if signed else principal
    # A GS2 authzid cannot hold NUL, nor ^A, which ends the header: such a name has no authzid form.
    assume(not with_authzid or not {"\0", "\x01"} & set(expected))
    authzid = f"a={saslname(expected)}" if with_authzid else ""
    kvs = "".join(f"{k}={v}\x01" for k, v in extensions.items())
    message = f"n,{authzid},\x01auth={scheme} {token}\x01{kvs}\x01".encode()
    parsed = parse_oauthbearer_initial_response(message)
    assert (parsed.token, dict(parsed.extensions)) == (token, extensions)
    assert oauthbearer_claim(message) == expected


DEEP_JSON = (  # an unsecured JWT whose payload nests 100,000 arrays: leaked RecursionError
    b"n,,\x01auth=Bearer " + b64url(b'{"alg":"none"}').encode() + b"."
    + b64url(b"[" * 100_000).encode() + b".\x01\x01")


# --- any reader, any bytes ---------------------------------------------------------------------

def unsecured_jwt_message(subject: str) -> bytes:
    header, payload = b64url(b'{"alg":"none"}'), b64url(json.dumps({"sub": subject}).encode())
    return f"n,,\x01auth=Bearer {header}.{payload}.\x01\x01".encode()


valid_tokens = st.one_of(
    st.builds(lambda u, p: f"\0{u}\0{p}".encode(), names, names),
    st.builds(lambda u, n: f"n,,n={saslname(u)},r={n}".encode(), names, ascii_names),
    st.builds(unsecured_jwt_message, names),
)


@given(st.binary(max_size=80) | valid_tokens.flatmap(mutated))
@example(DEEP_JSON)
@example(b"n,,\x01auth=Bearer e30.e30.\x01\x01")  # header {} (no alg)
@example(b"n,a=,n=u,r=x")  # empty authzid saslname
@example(b"n,,n=a=2,r=x")  # an '=' escape cut short
def test_arbitrary_and_damaged_tokens_raise_only_sasl_token_errors(token: bytes) -> None:
    readers(token)
