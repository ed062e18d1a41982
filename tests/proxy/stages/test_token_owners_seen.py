"""TokenOwnersSeen (proxy/stages/token_owners_seen.py), called directly: a CreateDelegationToken
response teaches the TokenOwnerLookup the new token's owner, a DescribeDelegationToken response
each listed token's (entries naming nobody left out), read in the version the broker answered
in; an error response or a body that does not decode teaches nothing; the response itself is
never changed (None)."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import pytest

from kafka_quota_proxy.identity.delegation_tokens import TokenOwners
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.stages.base import ResponseStage
from kafka_quota_proxy.proxy.stages.token_owners_seen import TokenOwnersSeen
from kafka_quota_proxy.proxy.token_owners import TokenOwnerLookup
from tests.proxy.conftest import request_frame

CREATE_DELEGATION_TOKEN, DESCRIBE_DELEGATION_TOKEN = 38, 41
CREATE, DESCRIBE = codec()[CREATE_DELEGATION_TOKEN], codec()[DESCRIBE_DELEGATION_TOKEN]
DELEGATION_TOKEN_AUTHORIZATION_FAILED = 65
HMAC = b"SECRET-HMAC"


def seen(tokens: TokenOwnerLookup) -> ResponseStage:
    """The stage as the chain holds it: a response stage whose answer leaves the body as is."""
    return TokenOwnersSeen(tokens)


def lookup() -> TokenOwnerLookup:
    def spawn(coro: Coroutine[Any, Any, None]) -> bool:
        raise AssertionError("the stage asks the broker nothing")
    return TokenOwnerLookup(TokenOwners(), None, spawn, lambda: 0.0, 5.0)


def context(api_key: int, version: int) -> RequestContext:
    frame = memoryview(request_frame(api_key, version, 7, flexible=version >= 2))
    return RequestContext(parse_request_header(frame), frame, ConnectionInfo("127.0.0.1:5000", "bootstrap"))


def created(version: int, token_id: str, owner: str, error_code: int = 0) -> bytes:
    return bytes(CREATE.response(version=version, error_code=error_code, principal_type="User",
                                 principal_name=owner, token_requester_principal_type="User",
                                 token_requester_principal_name=owner, issue_timestamp_ms=1,
                                 expiry_timestamp_ms=2, max_timestamp_ms=3, token_id=token_id, hmac=HMAC,
                                 throttle_time_ms=0).encode(version=version))


def described(version: int, tokens: list[tuple[str, str]], error_code: int = 0) -> bytes:
    entry = DESCRIBE.response.DescribedDelegationToken
    return bytes(DESCRIBE.response(version=version, error_code=error_code, throttle_time_ms=0, tokens=[
        entry(principal_type="User", principal_name=owner, token_requester_principal_type="User",
              token_requester_principal_name=owner, issue_timestamp=1, expiry_timestamp=2, max_timestamp=3,
              token_id=token_id, hmac=HMAC, renewers=[])
        for token_id, owner in tokens]).encode(version=version))


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_created_token_teaches_its_owner(version: int) -> None:
    tokens = lookup()
    stage = seen(tokens)
    assert stage.api_keys == frozenset({CREATE_DELEGATION_TOKEN, DESCRIBE_DELEGATION_TOKEN})
    body = created(version, "tok-1", "alice")
    assert stage.on_response(context(CREATE_DELEGATION_TOKEN, version), memoryview(body)) is None
    assert tokens.known("tok-1") == "alice"
    assert len(tokens.owners) == 1


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_description_teaches_every_listed_owner_but_those_naming_nobody(version: int) -> None:
    tokens = lookup()
    body = described(version, [("tok-a", "alice"), ("tok-b", "bob"), ("tok-c", ""), ("", "carol")])
    assert seen(tokens).on_response(context(DESCRIBE_DELEGATION_TOKEN, version), memoryview(body)) is None
    assert (tokens.known("tok-a"), tokens.known("tok-b"), tokens.known("tok-c")) == ("alice", "bob", None)
    assert len(tokens.owners) == 2


def test_an_error_response_teaches_nothing() -> None:
    tokens = lookup()
    stage = TokenOwnersSeen(tokens)
    error = DELEGATION_TOKEN_AUTHORIZATION_FAILED
    stage.on_response(context(CREATE_DELEGATION_TOKEN, 2), memoryview(created(2, "tok-1", "alice", error)))
    stage.on_response(context(DESCRIBE_DELEGATION_TOKEN, 2),
                      memoryview(described(2, [("tok-a", "alice")], error)))
    assert tokens.known("tok-1") is None and tokens.known("tok-a") is None
    assert len(tokens.owners) == 0


def test_a_body_that_does_not_decode_teaches_nothing() -> None:
    tokens = lookup()
    stage = seen(tokens)
    whole = described(2, [("tok-a", "alice")])
    assert stage.on_response(context(DESCRIBE_DELEGATION_TOKEN, 2), memoryview(whole[:-8])) is None
    assert stage.on_response(context(CREATE_DELEGATION_TOKEN, 2), memoryview(b"\x00")) is None
    assert len(tokens.owners) == 0


def test_the_body_is_read_in_the_version_the_broker_answered_in() -> None:
    tokens = lookup()
    ctx = context(CREATE_DELEGATION_TOKEN, 3)
    ctx.forward_as(1)  # a stage lowered the request: the broker answers in v1
    TokenOwnersSeen(tokens).on_response(ctx, memoryview(created(1, "tok-1", "alice")))
    assert tokens.known("tok-1") == "alice"
