"""Properties of the delegation-token decoder (protocol/delegation_tokens.py): from any valid
CreateDelegationToken or DescribeDelegationToken response, exactly each token's (id, owner name),
an entry naming nobody left out; the proxy's own DescribeDelegationToken asks for every token;
the broker's bytes, damaged or arbitrary, raise only ProtocolError."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.api_keys import CREATE_DELEGATION_TOKEN, DESCRIBE_DELEGATION_TOKEN
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.delegation_tokens import (
    describe_tokens_request,
    describe_tokens_response,
    token_owners,
)
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import frame_response, parse_request_header
from tests.support.messages import message
from tests.support.mutations import mutated

CORR = 11
CREATE = codec()[CREATE_DELEGATION_TOKEN]
DESCRIBE = codec()[DESCRIBE_DELEGATION_TOKEN]
KEYS = st.sampled_from([CREATE_DELEGATION_TOKEN, DESCRIBE_DELEGATION_TOKEN])


def versions(spec: Any) -> st.SearchStrategy[int]:
    low, high = spec.response._valid_versions
    return st.integers(low, high)


def answers(spec: Any) -> st.SearchStrategy[tuple[int, Any]]:
    return versions(spec).flatmap(lambda v: st.tuples(st.just(v), message(spec.response, v)))


def named(token_id: Any, owner: Any) -> bool:
    return bool(token_id) and bool(owner)


@given(answers(CREATE))
def test_a_created_token_names_its_id_and_owner(case: tuple[int, Any]) -> None:
    version, msg = case
    got = token_owners(CREATE_DELEGATION_TOKEN, version, bytes(msg.encode(version=version)))
    assert got.error_code == msg.error_code
    assert got.owners == (((msg.token_id, msg.principal_name),) if named(msg.token_id, msg.principal_name)
                          else ())


@given(answers(DESCRIBE))
def test_described_tokens_name_each_id_and_owner(case: tuple[int, Any]) -> None:
    version, msg = case
    body = bytes(msg.encode(version=version))
    frame = frame_response(CORR, DESCRIBE.response_header_version(version), body)
    got = describe_tokens_response(frame, CORR, version)
    assert got.error_code == msg.error_code
    assert got.owners == tuple((t.token_id, t.principal_name) for t in msg.tokens
                               if named(t.token_id, t.principal_name))


def test_the_hmac_is_not_kept() -> None:
    token = DESCRIBE.response.DescribedDelegationToken(
        principal_type="User", principal_name="alice", token_requester_principal_type="User",
        token_requester_principal_name="alice", issue_timestamp=1, expiry_timestamp=2, max_timestamp=3,
        token_id="tok-1", hmac=b"the-secret-hmac", renewers=[])
    msg = DESCRIBE.response(version=3, error_code=0, tokens=[token], throttle_time_ms=0)
    body = bytes(msg.encode(version=3))
    got = token_owners(DESCRIBE_DELEGATION_TOKEN, 3, body)
    assert got.owners == (("tok-1", "alice"),)
    assert "secret" not in repr(got)


@given(versions(DESCRIBE))
def test_the_proxys_own_request_asks_for_every_token(version: int) -> None:
    frame = describe_tokens_request(CORR, version)
    header = parse_request_header(memoryview(frame))
    assert (header.api_key, header.api_version) == (DESCRIBE_DELEGATION_TOKEN, version)
    assert header.correlation_id == CORR
    request = DESCRIBE.request.decode(frame[header.body_offset:], version=version)
    assert request.owners is None  # null: every token the caller may describe


def test_only_the_token_apis_name_owners() -> None:
    with pytest.raises(ValueError):
        token_owners(0, 9, b"")


NULL_TOKENS = b"\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00"  # v1: error 0, tokens null, throttle 0


@given(KEYS.flatmap(lambda key: st.tuples(st.just(key), answers(codec()[key]))).flatmap(
    lambda case: st.tuples(st.just(case[0]), st.just(case[1][0]),
                           mutated(bytes(case[1][1].encode(version=case[1][0]))))))
def test_damaged_responses_raise_only_protocol_errors(case: tuple[int, int, bytes]) -> None:
    key, version, body = case
    try:
        got = token_owners(key, version, body)
    except ProtocolError:
        return
    assert all(isinstance(t, str) and t and isinstance(o, str) and o for t, o in got.owners)


@given(KEYS, st.integers(1, 3), st.binary(max_size=80))
@example(DESCRIBE_DELEGATION_TOKEN, 1, NULL_TOKENS)
def test_arbitrary_bytes_raise_only_protocol_errors(key: int, version: int, body: bytes) -> None:
    for call in (lambda: token_owners(key, version, body),
                 lambda: describe_tokens_response(body, CORR, version)):
        try:
            call()
        except ProtocolError:
            pass
