"""identity.sasl_tokens: the user name in PLAIN, SCRAM and OAUTHBEARER bytes.

The CAPTURED constants are the SaslAuthenticate auth_bytes real clients sent to a throwaway
loopback listener that answered ApiVersions and SaslHandshake and recorded the next message.
Clients: confluent-kafka 2.16.1 (librdkafka 2.16.0), kafka-python 3.0.12, aiokafka 0.14.0, on
CPython 3.11. PLAIN and SCRAM used user "a,b=c" (escaped in SCRAM as a=2Cb=3Dc) and the dummy
password "capture-secret"; librdkafka's OAUTHBEARER token is its own unsecured JWT
(sasl.oauthbearer.config "principal=alice@example.com scope=produce"); kafka-python and
aiokafka sent a dummy HS256-shaped JWT for "svc-orders" from a test token provider.
"""

from __future__ import annotations

import base64
import json

import pytest

from kafka_quota_proxy.identity.sasl_tokens import (
    SaslTokenError,
    oauthbearer_claim,
    parse_oauthbearer_initial_response,
    parse_scram_client_first,
    plain_authcid,
    scram_is_client_first,
    scram_username,
)

# --- CAPTURED from real clients ---------------------------------------------------------------

LIBRDKAFKA_PLAIN = bytes.fromhex(
    "00612c623d6300636170747572652d736563726574"
)
LIBRDKAFKA_SCRAM_SHA_256 = bytes.fromhex(
    "6e2c2c6e3d613d3243623d3344632c723d4e6757334b477d4f745966435a64765846503b7636615c7e605a3a6766413c"
    "2e"
)
LIBRDKAFKA_SCRAM_SHA_512 = bytes.fromhex(
    "6e2c2c6e3d613d3243623d3344632c723d702f5462423c6b4754653576663d75795b6f65473e2f7153776945325a557c"
    "3c"
)
LIBRDKAFKA_OAUTHBEARER = bytes.fromhex(
    "6e2c2c01617574683d4265617265722065794a68624763694f694a756232356c496e302e65794a7a645749694f694a68"
    "62476c6a5a55426c654746746347786c4c6d4e7662534973496d6c68644349364d5463354e5449314d546b334e693434"
    "4f545173496d5634634349364d5463354e5449314e5455334e6934344f545173496e4e6a6233426c496a7062496e4279"
    "62325231593255695858302e0101"
)
KAFKA_PYTHON_PLAIN = bytes.fromhex(
    "612c623d6300612c623d6300636170747572652d736563726574"
)
KAFKA_PYTHON_SCRAM_SHA_256 = bytes.fromhex(
    "6e2c2c6e3d612c623d632c723d3830393530653035613962623436623139303430376665303366633438626362"
)
KAFKA_PYTHON_SCRAM_SHA_512 = bytes.fromhex(
    "6e2c2c6e3d612c623d632c723d3666316466666637663566383461363839396130346630356438356132326535"
)
KAFKA_PYTHON_OAUTHBEARER = bytes.fromhex(
    "6e2c2c01617574683d4265617265722065794a68624763694f694a49557a49314e694973496e523563434936496b7058"
    "56434a392e65794a7a645749694f694a7a646d4d7462334a6b5a584a7a496977695a586877496a6f304d5441794e4451"
    "304f44417766512e63326c6e626d463064584a6c01747261636549643d6162633132330101"
)
AIOKAFKA_PLAIN = bytes.fromhex(
    "612c623d6300612c623d6300636170747572652d736563726574"
)
AIOKAFKA_SCRAM_SHA_256 = bytes.fromhex(
    "6e2c2c6e3d613d3243623d3344632c723d63343737346637353730313534393938623835336466346164613266643938"
    "32"
)
AIOKAFKA_SCRAM_SHA_512 = bytes.fromhex(
    "6e2c2c6e3d613d3243623d3344632c723d35666132653163343839303334386134613938633566616365383366316635"
    "66"
)
AIOKAFKA_OAUTHBEARER = bytes.fromhex(
    "6e2c2c01617574683d4265617265722065794a68624763694f694a49557a49314e694973496e523563434936496b7058"
    "56434a392e65794a7a645749694f694a7a646d4d7462334a6b5a584a7a496977695a586877496a6f304d5441794e4451"
    "304f44417766512e63326c6e626d463064584a6c0101"
)
KAFKA_PYTHON_ALICE_SCRAM_SHA_256 = bytes.fromhex(
    "6e2c2c6e3d616c6963652c723d6164396263656462636431383434363338653530323739323434653033613734"
)
LIBRDKAFKA_UTF8_PLAIN = bytes.fromhex(
    "006ac3bc7267656e00636170747572652d736563726574"
)

# The password and tokens above are dummies; they must still never appear in an error message.
SECRETS = ["capture-secret", "c2lnbmF0dXJl", "eyJ"]


@pytest.mark.parametrize("token", [LIBRDKAFKA_PLAIN, KAFKA_PYTHON_PLAIN, AIOKAFKA_PLAIN],
                         ids=["librdkafka", "kafka-python", "aiokafka"])
def test_captured_plain(token: bytes) -> None:
    assert plain_authcid(token) == "a,b=c"


def test_captured_plain_utf8_name() -> None:
    assert plain_authcid(LIBRDKAFKA_UTF8_PLAIN) == "j\u00fcrgen"


@pytest.mark.parametrize("token", [
    LIBRDKAFKA_SCRAM_SHA_256, LIBRDKAFKA_SCRAM_SHA_512, AIOKAFKA_SCRAM_SHA_256, AIOKAFKA_SCRAM_SHA_512,
], ids=["librdkafka-256", "librdkafka-512", "aiokafka-256", "aiokafka-512"])
def test_captured_scram(token: bytes) -> None:
    assert scram_is_client_first(token)
    assert scram_username(token) == "a,b=c"
    first = parse_scram_client_first(token)
    assert (first.gs2_cbind_flag, first.authzid, first.extensions) == ("n", "", {})
    assert not first.delegation_token
    assert first.nonce


def test_captured_scram_plain_name() -> None:
    assert scram_username(KAFKA_PYTHON_ALICE_SCRAM_SHA_256) == "alice"


@pytest.mark.parametrize("token", [KAFKA_PYTHON_SCRAM_SHA_256, KAFKA_PYTHON_SCRAM_SHA_512],
                         ids=["256", "512"])
def test_captured_kafka_python_scram_does_not_escape_the_name(token: bytes) -> None:
    # kafka-python 3.0.12 sends n=a,b=c,r=... unescaped; Kafka's ScramSaslServer refuses that
    # message as malformed, and so do we, rather than guessing a user name.
    assert token.startswith(b"n,,n=a,b=c,r=")
    with pytest.raises(SaslTokenError, match="r= \\(nonce\\) missing"):
        scram_username(token)


def test_captured_librdkafka_unsecured_jwt() -> None:
    assert oauthbearer_claim(LIBRDKAFKA_OAUTHBEARER) == "alice@example.com"
    response = parse_oauthbearer_initial_response(LIBRDKAFKA_OAUTHBEARER)
    assert (response.gs2_cbind_flag, response.authzid, response.extensions) == ("n", "", {})
    assert response.token.startswith("eyJhbGciOiJub25lIn0.") and response.token.endswith(".")


@pytest.mark.parametrize("token", [KAFKA_PYTHON_OAUTHBEARER, AIOKAFKA_OAUTHBEARER],
                         ids=["kafka-python", "aiokafka"])
def test_captured_python_clients_oauthbearer(token: bytes) -> None:
    assert oauthbearer_claim(token) == "svc-orders"


def test_captured_oauthbearer_extensions() -> None:
    assert parse_oauthbearer_initial_response(KAFKA_PYTHON_OAUTHBEARER).extensions == {"traceId": "abc123"}


def test_token_never_in_repr() -> None:
    assert "eyJ" not in repr(parse_oauthbearer_initial_response(AIOKAFKA_OAUTHBEARER))


# --- PLAIN, hand-built (RFC 4616 and Kafka's PlainSaslServer) ---------------------------------


@pytest.mark.parametrize(("token", "user"), [
    (b"\0alice\0pw", "alice"),
    (b"alice\0alice\0pw", "alice"),
    (b"\0a\0p\xc3\xa4ss w\xc3\xb6rd", "a"),
    ("\0\u00e9\u00e8\0x".encode(), "\u00e9\u00e8"),
])
def test_plain(token: bytes, user: str) -> None:
    assert plain_authcid(token) == user


@pytest.mark.parametrize(("token", "message"), [
    (b"alice", "expected 3 tokens, got 1"),
    (b"\0alice", "expected 3 tokens, got 2"),
    (b"\0alice\0capture-secret\0", "expected 3 tokens, got 4"),
    (b"\0\0\0\0capture-secret", "expected 3 tokens, got 4"),
    (b"\0\0capture-secret", "username not specified"),
    (b"\0alice\0", "password not specified"),
    (b"bob\0alice\0capture-secret", "authorization id that is different from username"),
    (b"\0al\xffice\0capture-secret", "not UTF-8"),
    (b"", "expected 3 tokens, got 1"),
])
def test_plain_refused(token: bytes, message: str) -> None:
    with pytest.raises(SaslTokenError, match=message) as e:
        plain_authcid(token)
    assert not any(s in str(e.value) for s in SECRETS)


def test_slices_of_a_frame_buffer() -> None:
    frame = memoryview(b"\x00\x00\x00\x0b" + LIBRDKAFKA_SCRAM_SHA_256)
    assert scram_is_client_first(frame[4:])
    assert scram_username(frame[4:]) == "a,b=c"
    assert plain_authcid(bytearray(b"\0alice\0pw")) == "alice"
    assert oauthbearer_claim(memoryview(LIBRDKAFKA_OAUTHBEARER)) == "alice@example.com"


# --- SCRAM, hand-built (RFC 5802) -------------------------------------------------------------


@pytest.mark.parametrize(("token", "user"), [
    (b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL", "user"),  # RFC 5802's own example
    (b"n,,n=a=2Cb=3Dc,r=x", "a,b=c"),
    (b"n,,n==3D=2C,r=x", "=,"),
    (b"y,,n=user,r=x", "user"),  # client supports channel binding, thinks the server does not
    (b"n,a=user,n=user,r=x", "user"),
    (b"n,a=a=2Cb,n=a=2Cb,r=x", "a,b"),  # compared decoded (Kafka compares a= undecoded)
    (b"n,,m=ext,n=user,r=x", "user"),  # reserved-mext: Kafka's parser accepts and ignores it
    (b"n,,n=user,r=a=b~!", "user"),  # a nonce may hold '='
    ("n,,n=j\u00fcrgen,r=x".encode(), "j\u00fcrgen"),
])
def test_scram(token: bytes, user: str) -> None:
    assert scram_username(token) == user


def test_scram_extensions_and_delegation_tokens() -> None:
    first = parse_scram_client_first(b"n,,n=8ZcjcBSAQ3S6,r=nonce,tokenauth=TRUE,traceId=x=y")
    assert first.extensions == {"tokenauth": "TRUE", "traceId": "x=y"}
    assert first.delegation_token
    assert first.username == "8ZcjcBSAQ3S6"  # the token id: only the broker knows its owner
    assert not parse_scram_client_first(b"n,,n=u,r=x,tokenauth=false").delegation_token


@pytest.mark.parametrize(("token", "message"), [
    (b"p=tls-unique,,n=user,r=x", "channel binding \\(p=\\) is not supported by Kafka"),
    (b"x,,n=user,r=x", "bad GS2 channel binding flag"),
    (b"n,b=user,n=user,r=x", "bad GS2 authzid"),
    (b"n,a=other,n=user,r=x", "authorization id that is different from username"),
    (b"n,a=,n=user,r=x", "authzid is empty"),
    (b"n,,r=x,n=user", "n= \\(username\\) missing"),
    (b"n,,m=,n=user,r=x", "empty m="),
    (b"n,,n=,r=x", "username is empty"),
    (b"n,,n=a=2cb,r=x", "neither =2C nor =3D"),
    (b"n,,n=a=,r=x", "neither =2C nor =3D"),
    (b"n,,n=a=3,r=x", "neither =2C nor =3D"),
    (b"n,,n=user,r=", "r= \\(nonce\\) missing"),
    (b"n,,n=user,x=y", "r= \\(nonce\\) missing"),
    (b"n,,n=user,r=a b", "not printable"),
    (b"n,,n=user,r=x,", "bad extension"),
    (b"n,,n=user,r=x,1=y", "bad extension"),
    (b"n,,n=user,r=x,k=", "bad extension"),
    (b"n,,n=user,r=x,k", "bad extension"),
    (b"n,,n=us\0er,r=x", "contains NUL"),
    (b"n,,n=\xff,r=x", "not UTF-8"),
    (b"n,,n=user", "too few attributes"),
    (b"c=biws,r=xyz,p=proof", "too few attributes"),  # a client-final message
    (b"c=biws,r=xyz,e=1,p=proof", "channel binding flag"),
    (b"", "too few attributes"),
])
def test_scram_refused(token: bytes, message: str) -> None:
    with pytest.raises(SaslTokenError, match=message):
        parse_scram_client_first(token)


@pytest.mark.parametrize(("token", "first"), [
    (b"n,,n=u,r=x", True),
    (b"y,,n=u,r=x", True),
    (b"p=tls-unique,,n=u,r=x", True),
    (b"c=biws,r=xyz,p=cHJvb2Y=", False),
    (b"", False),
])
def test_scram_is_client_first(token: bytes, first: bool) -> None:
    assert scram_is_client_first(token) is first


# --- OAUTHBEARER, hand-built (RFC 7628) -------------------------------------------------------


def _b64(obj: object, *, pad: bool = False, standard: bool = False) -> str:
    raw = json.dumps(obj).encode()
    text = (base64.b64encode(raw) if standard else base64.urlsafe_b64encode(raw)).decode()
    return text if pad else text.rstrip("=")


def jws(claims: object, alg: str = "RS256", signature: str = "c2ln", **kw: bool) -> str:
    return f"{_b64({'alg': alg, 'typ': 'JWT'}, **kw)}.{_b64(claims, **kw)}.{signature}"


def response(token: str, gs2: str = "n,,", ext: str = "", scheme: str = "Bearer ") -> bytes:
    return f"{gs2}\x01auth={scheme}{token}\x01{ext}\x01".encode()


@pytest.mark.parametrize(("message", "claim", "principal"), [
    (response(jws({"sub": "alice"})), "sub", "alice"),
    (response(jws({"sub": "alice", "client_id": "orders"})), "client_id", "orders"),
    (response(jws({"sub": " alice "})), "sub", "alice"),  # Kafka's signed-token validator trims
    # ... the unsecured one does not
    (response(jws({"sub": " alice "}, alg="none", signature="")), "sub", " alice "),
    (response(jws({"sub": "alice"}), gs2="n,a=alice,"), "sub", "alice"),
    (response(jws({"sub": "a,b"}), gs2="n,a=a=2Cb,"), "sub", "a,b"),
    (response(jws({"sub": "alice"}), gs2="y,,"), "sub", "alice"),
    (response(jws({"sub": "alice"}), scheme="bearer   "), "sub", "alice"),
    (response(jws({"sub": "alice"}), ext="traceId=1\x01logicalCluster=lkc-1 x\x01"), "sub", "alice"),
    (response(jws({"sub": "al>?ice~"}, signature="c2lnbg==")), "sub", "al>?ice~"),
    (response(jws({"sub": "al>?ice~"}, standard=True)), "sub", "al>?ice~"),
    (response(jws({"sub": "\u00fcser"})), "sub", "\u00fcser"),
])
def test_oauthbearer(message: bytes, claim: str, principal: str) -> None:
    assert oauthbearer_claim(message, claim) == principal


@pytest.mark.parametrize(("message", "error"), [
    (b"\x01", "acknowledged a server error"),
    (b"n,,auth=Bearer x\x01\x01", "bad GS2 header"),
    (b"n,\x01auth=Bearer x\x01\x01", "bad GS2 header"),
    (b"p=tls-unique,,\x01auth=Bearer x\x01\x01", "channel binding"),
    (response(jws({"sub": "alice"}), gs2="n,a=bob,"), "different from the token's principal name"),
    (response(jws({"sub": "alice"}))[:-1], "unterminated key/value pair"),
    (response(jws({"sub": "alice"}, pad=True)), "invalid 'auth' format"),  # '=' only ends a b64token
    (b"n,,\x01auth=Bearer x\x01kv\x01\x01", "bad key/value pair"),
    (b"n,,\x01auth=Bearer x\x01k1=v\x01\x01", "bad key/value pair"),
    (b"n,,\x01auth=Bearer x\x01k=\x01\x01", "bad key/value pair"),
    (b"n,,\x01auth=Bearer x\x01k=\x7f\x01\x01", "bad key/value pair"),
    (b"n,,\x01auth=Bearer x", "not terminated"),
    (b"n,,\x01\x01", "'auth' not specified"),
    (b"n,,\x01k=v\x01\x01", "'auth' not specified"),
    (response(jws({"sub": "alice"}), scheme="Basic "), "Invalid scheme"),
    (response(jws({"sub": "alice"}), scheme="Bearer"), "invalid 'auth' format"),
    (response("abc def"), "invalid 'auth' format"),
    (response("a.b.c.d.e"), "encrypted JWT"),
    (response("abc"), "not a JWS"),
    (response(".e30.c2ln"), "not a JWS"),
    (response("e30..c2ln"), "not a JWS"),
    (response(jws({"sub": "alice"}, alg="none")), "must not carry a signature"),
    (response(jws({"sub": "alice"}, signature="")), "has no signature"),
    (response(_b64({"typ": "JWT"}) + "." + _b64({"sub": "a"}) + ".c2ln"), "has no 'alg'"),
    (response(jws(["sub", "alice"])), "payload is not a JSON object"),
    (response(jws({"sub": 42})), "no principal name in JWT claim: sub"),
    (response(jws({"sub": "  "})), "no principal name in JWT claim: sub"),
    (response(jws({"name": "alice"})), "no principal name in JWT claim: sub"),
    (response("e~30.e30.c2ln"), "header is not base64url"),
    (response("bm90IGpzb24.e30.c2ln"), "header is not base64url JSON"),
    (response("e.e30.c2ln"), "header is not base64url JSON"),
    (b"n,,\x01auth=Bearer \xff\x01\x01", "not UTF-8"),
])
def test_oauthbearer_refused(message: bytes, error: str) -> None:
    with pytest.raises(SaslTokenError, match=error) as e:
        oauthbearer_claim(message)
    assert not any(s in str(e.value) for s in SECRETS)


def test_oauthbearer_blank_claim_name_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="claim name"):
        oauthbearer_claim(response(jws({"sub": "alice"})), " ")


def test_errors_are_value_errors() -> None:
    assert issubclass(SaslTokenError, ValueError)
