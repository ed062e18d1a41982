"""Delegation-token clients in SASL passthrough, identified as Kafka identifies them: as the
token's owner (identity/delegation_tokens.py). First the lookup alone (proxy/token_owners.py),
with a scripted `ask` and a fake clock; then a whole proxy in front of a scripted broker that
answers SCRAM rounds, the proxy's own login and DescribeDelegationToken."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import pytest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from kafka_quota_proxy.config.identity_settings import SaslSettings
from kafka_quota_proxy.identity.delegation_tokens import TokenOwners
from kafka_quota_proxy.protocol.api_keys import (
    CREATE_DELEGATION_TOKEN,
    DESCRIBE_DELEGATION_TOKEN,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
)
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.headers import PROXY_CLIENT_ID, RequestHeader, frame_request
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext, SaslState
from kafka_quota_proxy.proxy.stages.sasl_inspect import SaslInspect
from kafka_quota_proxy.proxy.stages.sasl_principals import Principals
from kafka_quota_proxy.proxy.token_owners import NO_LOGIN, LookupFailed, TokenOwnerLookup
from tests.proxy.conftest import (
    LOOPS,
    Harness,
    correlation_id,
    is_closed,
    list_groups,
    read_frame,
    run_on,
    running,
)
from tests.support import fake_broker
from tests.support.fake_broker import BrokerConn

run = asyncio.run
CREATE = codec()[CREATE_DELEGATION_TOKEN]
DESCRIBE = codec()[DESCRIBE_DELEGATION_TOKEN]


# --- the lookup alone -------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedAsk:
    """The broker's answers to the proxy's DescribeDelegationToken, one ask at a time."""

    def __init__(self, *answers: list[tuple[str, str]] | Exception | None) -> None:
        self.answers = list(answers)  # None: never answers
        self.asked = 0
        self.release = asyncio.Event()

    async def __call__(self) -> list[tuple[str, str]]:
        answer = self.answers[self.asked]
        self.asked += 1
        await self.release.wait()
        if answer is None:
            await asyncio.sleep(3600)
        if isinstance(answer, Exception):
            raise answer
        assert answer is not None
        return answer


def lookup(ask: ScriptedAsk | None, clock: Clock, timeout: float = 5.0,
           spawn_ok: bool = True) -> TokenOwnerLookup:
    def spawn(coro: Coroutine[Any, Any, None]) -> bool:
        if not spawn_ok:
            coro.close()
            return False
        asyncio.get_running_loop().create_task(coro)
        return True
    return TokenOwnerLookup(TokenOwners(), ask, spawn, clock, timeout, asker="kqp")


def test_an_unknown_token_is_asked_for_once_and_learnt() -> None:
    async def scenario() -> None:
        ask, clock = ScriptedAsk([("tok", "alice"), ("other", "bob")]), Clock()
        tokens = lookup(ask, clock)
        found = tokens.find("tok")
        assert found is not None and tokens.find("tok") is found  # one question, however often asked
        ask.release.set()
        assert await found == "alice"
        assert ask.asked == 1
        assert tokens.known("tok") == "alice" and tokens.known("other") == "bob"  # every owner learnt
        assert tokens.find("tok") is None  # known: nothing to ask
    run(scenario())


def test_tokens_wanted_during_an_ask_wait_for_the_next_one_together() -> None:
    async def scenario() -> None:
        ask, clock = ScriptedAsk([("a", "alice")], [("a", "alice"), ("b", "bob"), ("c", "carol")]), Clock()
        tokens = lookup(ask, clock)
        first = tokens.find("a")
        await asyncio.sleep(0)  # the first ask is running
        second, third = tokens.find("b"), tokens.find("c")
        assert first is not None and second is not None and third is not None
        assert second is not first
        ask.release.set()
        assert (await first, await second, await third) == ("alice", "bob", "carol")
        assert ask.asked == 2  # not one per token
    run(scenario())


def test_a_token_not_described_falls_back_and_is_asked_again_after_exactly_30_s() -> None:
    async def scenario() -> None:
        ask, clock = ScriptedAsk([("x", "xavier")], [("tok", "alice")]), Clock()
        ask.release.set()
        tokens = lookup(ask, clock)
        found = tokens.find("tok")
        assert found is not None and await found is None
        assert tokens.why_unknown("tok") == (
            "not among the 1 tokens the broker describes to the proxy's user 'kqp' (it needs Describe "
            "on the token, or DescribeTokens on its owner)")
        clock.now += 29.999
        assert tokens.find("tok") is None and ask.asked == 1  # not asked again yet
        clock.now += 0.001
        found = tokens.find("tok")
        assert found is not None and await found == "alice" and ask.asked == 2
    run(scenario())


def test_a_refusal_a_failure_and_silence_each_fall_back_with_the_reason() -> None:
    async def scenario() -> None:
        refused = LookupFailed("the broker at k:9092 refused the proxy's DescribeDelegationToken")
        ask, clock = ScriptedAsk(refused, None), Clock()
        ask.release.set()
        tokens = lookup(ask, clock, timeout=0.05)
        found = tokens.find("a")
        assert found is not None and await found is None
        assert tokens.why_unknown("a") == str(refused)
        found = tokens.find("b")
        assert found is not None and await found is None  # the ask never answered: timed out
        assert tokens.why_unknown("b") == (
            "no broker answered the proxy's DescribeDelegationToken within 0.05 s")
    run(scenario())


def test_without_a_login_of_its_own_the_proxy_asks_nothing() -> None:
    async def scenario() -> None:
        tokens = lookup(None, Clock())
        assert tokens.find("tok") is None
        assert tokens.why_unknown("tok") == NO_LOGIN
        tokens.learn([("tok", "alice")])  # from a response passing by
        assert tokens.known("tok") == "alice"
    run(scenario())


def test_an_ask_the_shutting_down_proxy_will_not_start_answers_at_once() -> None:
    async def scenario() -> None:
        ask = ScriptedAsk([("tok", "alice")])
        tokens = lookup(ask, Clock(), spawn_ok=False)
        found = tokens.find("tok")
        assert found is not None and found.done() and found.result() is None
        assert ask.asked == 0 and tokens.why_unknown("tok") == "the proxy is shutting down"
    run(scenario())


# --- a whole proxy in front of a scripted broker ----------------------------------------------

TOKEN, OWNER, HMAC = "tOkEnId0123456789abcdE", "alice", b"SECRET-HMAC-never-logged"


def token_described(token_id: str, owner: str) -> Any:
    return DESCRIBE.response.DescribedDelegationToken(
        principal_type="User", principal_name=owner, token_requester_principal_type="User",
        token_requester_principal_name=owner, issue_timestamp=1, expiry_timestamp=2,
        max_timestamp=3, token_id=token_id, hmac=HMAC, renewers=[])


class ScramBroker:
    """Says yes to every SASL round (the broker is the authority, the proxy only watches), and
    answers the token APIs from `tokens` (token id -> owner)."""

    def __init__(self, tokens: dict[str, str], describe_error: int = 0) -> None:
        self.tokens = tokens
        self.describe_error = describe_error
        self.describes = 0
        self.answer_describe = asyncio.Event()
        self.answer_describe.set()

    async def __call__(self, conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        v = header.api_version
        if header.api_key == SASL_HANDSHAKE:
            return bytes(SaslHandshakeResponse(version=v, error_code=0, mechanisms=[
                "PLAIN", "SCRAM-SHA-512"]).encode(version=v))
        if header.api_key == SASL_AUTHENTICATE:
            return bytes(SaslAuthenticateResponse(version=v, error_code=0, error_message=None,
                                                  auth_bytes=b"r=x,s=c2FsdA==,i=4096",
                                                  session_lifetime_ms=0).encode(version=v))
        if header.api_key == DESCRIBE_DELEGATION_TOKEN:
            assert header.client_id == PROXY_CLIENT_ID  # the proxy's own connection asks
            self.describes += 1
            await self.answer_describe.wait()
            tokens = [token_described(t, o) for t, o in self.tokens.items()]
            return bytes(DESCRIBE.response(version=v, error_code=self.describe_error,
                                           tokens=[] if self.describe_error else tokens,
                                           throttle_time_ms=0).encode(version=v))
        if header.api_key == CREATE_DELEGATION_TOKEN:
            token_id, owner = "createdThroughProxy000", "bob"
            self.tokens[token_id] = owner
            return bytes(CREATE.response(version=v, error_code=0, principal_type="User", principal_name=owner,
                                         token_requester_principal_type="User",
                                         token_requester_principal_name=owner, issue_timestamp_ms=1,
                                         expiry_timestamp_ms=2, max_timestamp_ms=3, token_id=token_id,
                                         hmac=HMAC, throttle_time_ms=0).encode(version=v))
        return fake_broker.list_groups_v0_body()


@pytest.fixture(autouse=True)
def broker_knows_the_token_apis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_broker, "API_KEYS", [*fake_broker.API_KEYS, (SASL_HANDSHAKE, 0, 1),
                                                  (SASL_AUTHENTICATE, 0, 2), (CREATE_DELEGATION_TOKEN, 1, 3),
                                                  (DESCRIBE_DELEGATION_TOKEN, 1, 3)])


PASSTHROUGH: dict[str, Any] = {
    "sasl": {"mode": "passthrough"},
    "upstream_sasl": {"mechanism": "PLAIN", "username": "kqp", "password": "kqp-password"},
}


def frame(msg: Any, correlation: int, version: int = 1) -> bytes:
    return frame_request(msg, version, correlation, "token-client")


async def token_login(h: Harness, token_id: str = TOKEN, reader_writer: Any = None,
                      first: int = 1) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """SaslHandshake and both SCRAM rounds of a delegation-token login, through the proxy."""
    reader, writer = reader_writer or await h.connect()
    writer.write(frame(SaslHandshakeRequest(mechanism="SCRAM-SHA-512"), first))
    assert correlation_id(await read_frame(reader)) == first
    client_first = f"n,,n={token_id},r=clientnonce,tokenauth=true".encode()
    writer.write(frame(SaslAuthenticateRequest(auth_bytes=client_first), first + 1))
    assert correlation_id(await read_frame(reader)) == first + 1
    client_final = b"c=biws,r=clientnonceserver,p=cHJvb2Y="
    writer.write(frame(SaslAuthenticateRequest(auth_bytes=client_final), first + 2))
    return reader, writer


def principals(h: Harness) -> list[str]:
    return sorted(c.info.principal for c in h.proxy.connections)


def lookup_of(h: Harness) -> TokenOwnerLookup:
    sasl = h.proxy.sasl_stage
    assert isinstance(sasl, SaslInspect) and sasl.tokens is not None
    return sasl.tokens


@pytest.mark.parametrize("loop", LOOPS)
def test_a_token_created_elsewhere_is_its_owner_and_the_login_waits_for_the_answer(
        loop: str, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        broker = ScramBroker({TOKEN: OWNER, "someoneElse00000000000": "carol"})
        broker.answer_describe.clear()
        async with running(broker, **PASSTHROUGH) as h:
            reader, writer = await token_login(h)
            await h.wait_for(lambda: broker.describes == 1)
            # The last SCRAM answer waits for the owner: nothing is charged to the token id.
            last = asyncio.ensure_future(read_frame(reader))
            await asyncio.sleep(0.2)
            assert not last.done() and principals(h) == ["ANONYMOUS"]
            broker.answer_describe.set()
            assert correlation_id(await last) == 3
            assert principals(h) == [OWNER]
            writer.write(list_groups(4))
            assert correlation_id(await read_frame(reader)) == 4
            # A second client with the same token: known now, nothing asked.
            reader2, writer2 = await token_login(h)
            assert correlation_id(await read_frame(reader2)) == 3
            assert principals(h) == [OWNER, OWNER] and broker.describes == 1
            writer.close()
            writer2.close()
    with caplog.at_level(logging.DEBUG, logger="kafka_quota_proxy"):
        run_on(loop, scenario())
    said = caplog.text
    assert f"authenticated as {OWNER} (the owner of delegation token {TOKEN})" in said
    assert "SECRET" not in said and "cHJvb2Y" not in said  # no HMAC, no SCRAM proof


def test_an_owner_not_described_leaves_the_token_id_said_once_and_asked_once(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        broker = ScramBroker({"someoneElse00000000000": "carol"})
        async with running(broker, **PASSTHROUGH) as h:
            clients = [await token_login(h) for _ in range(2)]
            for reader, _ in clients:
                assert correlation_id(await read_frame(reader)) == 3
            assert principals(h) == [TOKEN, TOKEN]
            assert broker.describes == 1  # the second login within 30 s asked nothing
            for _, writer in clients:
                writer.close()
    with caplog.at_level(logging.INFO, logger="kafka_quota_proxy"):
        run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"delegation token {TOKEN}: its owner is unknown (not among the 1 tokens the broker describes "
        "to the proxy's user 'kqp' (it needs Describe on the token, or DescribeTokens on its owner)); "
        "its clients are identified by the token id, not by their owner as Kafka identifies them, "
        "until the proxy learns the owner"]
    assert "SECRET" not in caplog.text


def test_a_refused_describe_says_kafkas_error() -> None:
    async def scenario() -> None:
        broker = ScramBroker({TOKEN: OWNER}, describe_error=64)  # DELEGATION_TOKEN_REQUEST_NOT_ALLOWED
        async with running(broker, **PASSTHROUGH) as h:
            reader, writer = await token_login(h)
            assert correlation_id(await read_frame(reader)) == 3
            assert principals(h) == [TOKEN]
            writer.close()
            why = lookup_of(h).why_unknown(TOKEN)
            assert "DelegationTokenRequestNotAllowedError (error 64)" in why and "'kqp'" in why
    run(scenario())


def test_a_token_created_through_the_proxy_is_known_without_asking() -> None:
    async def scenario() -> None:
        broker = ScramBroker({})
        async with running(broker, **PASSTHROUGH) as h:
            reader, writer = await h.connect()
            writer.write(frame(CREATE.request(owner_principal_type=None, owner_principal_name=None,
                                              renewers=[], max_lifetime_ms=-1), 1, version=3))
            assert correlation_id(await read_frame(reader)) == 1
            reader2, writer2 = await token_login(h, "createdThroughProxy000")
            assert correlation_id(await read_frame(reader2)) == 3
            assert "bob" in principals(h) and broker.describes == 0
            writer.close()
            writer2.close()
    run(scenario())


def test_without_upstream_sasl_a_token_client_is_its_token_id(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        broker = ScramBroker({TOKEN: OWNER})
        async with running(broker, sasl={"mode": "passthrough"}) as h:
            reader, writer = await token_login(h)
            assert correlation_id(await read_frame(reader)) == 3
            assert principals(h) == [TOKEN] and broker.describes == 0
            writer.close()
    with caplog.at_level(logging.WARNING, logger="kafka_quota_proxy"):
        run(scenario())
    assert NO_LOGIN in caplog.text


def test_a_re_authentication_with_the_token_moves_from_its_id_to_its_owner_once_learnt() -> None:
    async def scenario() -> None:
        broker = ScramBroker({})
        async with running(broker, **PASSTHROUGH) as h:
            reader, writer = await token_login(h)
            assert correlation_id(await read_frame(reader)) == 3
            assert principals(h) == [TOKEN]
            broker.tokens[TOKEN] = OWNER
            lookup_of(h).learn([(TOKEN, OWNER)])  # as from a Describe response passing by
            await token_login(h, reader_writer=(reader, writer), first=4)  # KIP-368 re-authentication
            assert correlation_id(await read_frame(reader)) == 6
            assert principals(h) == [OWNER]  # not closed as a spoofing attempt
            writer.write(list_groups(7))
            assert correlation_id(await read_frame(reader)) == 7
            writer.close()
    run(scenario())


def test_an_ordinary_scram_user_is_untouched() -> None:
    async def scenario() -> None:
        broker = ScramBroker({})
        async with running(broker, **PASSTHROUGH) as h:
            reader, writer = await h.connect()
            writer.write(frame(SaslHandshakeRequest(mechanism="SCRAM-SHA-512"), 1))
            await read_frame(reader)
            writer.write(frame(SaslAuthenticateRequest(auth_bytes=b"n,,n=dave,r=nonce"), 2))
            await read_frame(reader)
            writer.write(frame(SaslAuthenticateRequest(auth_bytes=b"c=biws,r=nonceserver,p=cA=="), 3))
            assert correlation_id(await read_frame(reader)) == 3
            assert principals(h) == ["dave"] and broker.describes == 0
            writer.close()
    run(scenario())


def test_requests_read_while_a_login_is_held_wait_for_it() -> None:
    async def scenario() -> None:
        broker = ScramBroker({TOKEN: OWNER})
        broker.answer_describe.clear()
        async with running(broker, **PASSTHROUGH) as h:
            reader, writer = await token_login(h)
            (conn,) = [c for c in h.broker.conns if c.frames and b"token-client" in c.frames[0]]
            await h.wait_for(lambda: broker.describes == 1 and len(conn.frames) == 3)
            await asyncio.sleep(0.1)  # the last SCRAM answer is at the proxy, held
            writer.write(list_groups(4))
            await asyncio.sleep(0.1)
            assert len(conn.frames) == 3  # ListGroups not read while the login is held
            broker.answer_describe.set()
            assert [correlation_id(await read_frame(reader)) for _ in range(2)] == [3, 4]
            assert principals(h) == [OWNER]
            writer.close()
    run(scenario())


def test_a_legacy_v0_token_login_binds_the_owner_too() -> None:
    """SaslHandshake v0: bare SCRAM tokens, the broker's bare answers (datapath's legacy path)."""
    async def scenario() -> None:
        ask = ScriptedAsk([(TOKEN, OWNER)])
        settings = SaslSettings(mode="passthrough")
        stage = SaslInspect(settings, Principals(settings), lookup(ask, Clock()))
        conn = ConnectionInfo("127.0.0.1:5555", "bootstrap")
        conn.sasl = SaslState(mechanism="SCRAM-SHA-512", legacy=True)
        header = RequestHeader(SASL_AUTHENTICATE, 0, -1, None, 4, None)
        stage.legacy_token(conn, f"n,,n={TOKEN},r=nonce,tokenauth=true".encode())
        first, last = (RequestContext(header, memoryview(b""), conn, raw=True) for _ in range(2))
        assert stage.legacy_answer(first) is False and first.hold is None
        await asyncio.sleep(0)
        assert ask.asked == 1  # asked once the broker accepted the token's id
        assert stage.legacy_answer(last) is True
        assert last.hold is not None and not last.hold.done() and conn.principal == "ANONYMOUS"
        ask.release.set()
        await last.hold
        assert conn.principal == OWNER and conn.sasl.token_id == TOKEN and not conn.sasl.legacy
    run(scenario())


def test_a_re_authentication_with_someone_elses_token_closes_the_connection() -> None:
    """Found out only once the broker has said whose the token is: the held answer is not sent."""
    async def scenario() -> None:
        broker = ScramBroker({TOKEN: "bob"})
        async with running(broker, **PASSTHROUGH) as h:
            reader, writer = await h.connect()
            writer.write(frame(SaslHandshakeRequest(mechanism="SCRAM-SHA-512"), 1))
            await read_frame(reader)
            writer.write(frame(SaslAuthenticateRequest(auth_bytes=b"n,,n=dave,r=nonce"), 2))
            await read_frame(reader)
            writer.write(frame(SaslAuthenticateRequest(auth_bytes=b"c=biws,r=nonceserver,p=cA=="), 3))
            await read_frame(reader)
            assert principals(h) == ["dave"]
            await token_login(h, reader_writer=(reader, writer), first=4)
            assert await is_closed(reader)
            assert h.errors("sasl_spoofing") == 1
    run(scenario())
