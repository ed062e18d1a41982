"""A connection's rules (proxy/datapath/core.py) by feeding bytes on a fake clock, with no socket
and no event loop: what the core is told (requests read, the broker's responses, a wait's end,
work done elsewhere) and the actions it emits in answer, in order."""

from __future__ import annotations

import struct
from concurrent.futures import Future
from dataclasses import dataclass, field

from kafka_quota_proxy.config import HostPort, Settings
from kafka_quota_proxy.protocol.framing import FrameHead, FramePiece
from kafka_quota_proxy.protocol.headers import frame_response
from kafka_quota_proxy.proxy.chain import Pipeline
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.datapath.actions import (
    CANCEL_WAITS,
    CLOSE,
    LINGER,
    READ_OFF,
    READ_ON,
    Action,
    AwaitWork,
    ToBroker,
    ToClient,
    WaitUntil,
)
from kafka_quota_proxy.proxy.datapath.core import ConnectionCore
from kafka_quota_proxy.proxy.datapath.read_gate import Pause
from kafka_quota_proxy.proxy.datapath.streaming import response_head, response_piece
from kafka_quota_proxy.proxy.observability.metrics import ProxyMetrics
from kafka_quota_proxy.proxy.observability.usage_log import UsageMeter
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage, ResponseStage
from kafka_quota_proxy.proxy.stages.sasl_inspect import SaslInspect
from kafka_quota_proxy.proxy.stages.sasl_terminate import SaslTerminate
from tests.proxy.conftest import produce_acks0_v3, request_frame

METADATA, API_VERSIONS, PRODUCE, SASL_AUTHENTICATE = 3, 18, 0, 36


def metadata(correlation_id: int) -> bytes:
    return request_frame(METADATA, 0, correlation_id)


def produce(correlation_id: int) -> bytes:
    """A Produce v3 with acks=1 and no topics."""
    return request_frame(PRODUCE, 3, correlation_id, struct.pack(">hhii", -1, 1, 1000, 0))


def answer(correlation_id: int, body: bytes = b"\x00\x00\x00\x00") -> bytes:
    return frame_response(correlation_id, 0, body)


class Throttles(RequestStage):
    """Throttles the requests with these correlation ids, as a quota stage would."""

    def __init__(self, throttles: dict[int, int]) -> None:
        self.throttles = throttles

    def on_request(self, ctx: RequestContext) -> Reply | None:
        ctx.throttle_for(self.throttles.get(ctx.header.correlation_id, 0))
        return None


class Answers(RequestStage):
    """Answers ApiVersions itself, and SaslAuthenticate later (`pending`), as the proxy's own
    stages do (a PLAIN password is checked on a worker thread)."""

    api_keys = frozenset({API_VERSIONS, SASL_AUTHENTICATE})

    def __init__(self) -> None:
        self.pending: list[Future[Reply]] = []

    def on_request(self, ctx: RequestContext) -> Reply | None:
        if ctx.api_key == API_VERSIONS:
            return Reply(b"\x00\x00")
        later: Future[Reply] = Future()
        self.pending.append(later)
        return Reply(b"", later=later)  # type: ignore[arg-type]


@dataclass
class Pacer(RequestStage):
    """A paced quota shared by every connection of one entity: each Produce takes `cost`
    seconds of it, and one that comes before its entity's turn waits (`hold_ms`)."""

    clock: list[float]
    cost: float = 0.1
    turn: float = 0.0
    api_keys: frozenset[int] = frozenset({PRODUCE})
    holds: frozenset[int] = frozenset({PRODUCE})

    def hold_ms(self, ctx: RequestContext) -> int:
        return max(0, round((self.turn - self.clock[0]) * 1000))

    def on_request(self, ctx: RequestContext) -> Reply | None:
        self.turn = max(self.turn, self.clock[0]) + self.cost
        return None


@dataclass
class Host:
    pipeline: Pipeline
    settings: Settings = field(default_factory=lambda: Settings(upstream=(HostPort("127.0.0.1", 9092),)))
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)
    usage: UsageMeter | None = None
    sasl_stage: SaslInspect | SaslTerminate | None = None


class Connection:
    """A core and the actions it emitted, read off in order (`took`)."""

    def __init__(self, *stages: RequestStage, host: Host | None = None) -> None:
        self.host = host or Host(Pipeline(request=list(stages), response=[]))
        self.actions: list[Action] = []
        self.core = ConnectionCore(self.host, ConnectionInfo("127.0.0.1:5000", "bootstrap"),
                                   self.actions.append, stamp=lambda: 0.0)

    def took(self) -> list[object]:
        """The actions since the last look, bytes as bytes."""
        taken, self.actions[:] = list(self.actions), []
        return [normal(action) for action in taken]


def normal(action: Action) -> object:
    if isinstance(action, ToBroker):
        return ToBroker([bytes(part) for part in action.parts])
    if isinstance(action, ToClient):
        data = action.data
        return ToClient(b"".join(bytes(p) for p in data) if isinstance(data, list) else bytes(data))
    return action


def test_responses_go_out_in_request_order_with_the_proxys_own_between_the_brokers() -> None:
    conn = Connection(Answers())
    core = conn.core
    core.client_bytes(metadata(1) + request_frame(API_VERSIONS, 0, 2) + metadata(3), 0.0)
    # The two forwarded in one write; the local answer is ready at once but waits its turn.
    assert conn.took() == [ToBroker([metadata(1), metadata(3)])]
    core.response(memoryview(answer(1)), 0.1)
    assert conn.took() == [ToClient(answer(1)), ToClient(frame_response(2, 0, b"\x00\x00"))]
    core.response(memoryview(answer(3)), 0.2)
    assert conn.took() == [ToClient(answer(3))]
    assert not core.order.inflight


def test_a_request_past_the_read_ahead_bound_stops_reading_until_an_answer() -> None:
    conn = Connection()
    core = conn.core
    frames = b"".join(metadata(i) for i in range(1, 6))  # max_inflight_requests: 5
    core.client_bytes(frames, 0.0)
    assert conn.took() == [ToBroker([metadata(i) for i in range(1, 6)]), READ_OFF]
    core.response(memoryview(answer(1)), 0.1)
    assert conn.took() == [READ_ON, ToClient(answer(1))]


def test_acks0_produce_answered_or_not_by_the_broker() -> None:
    conn = Connection()
    core = conn.core
    core.client_bytes(produce_acks0_v3(5) + metadata(6), 0.0)
    assert conn.took() == [ToBroker([produce_acks0_v3(5), metadata(6)])]
    # A broker that answers acks=0 (Tansu): passed on in its place.
    core.response(memoryview(answer(5)), 0.1)
    core.response(memoryview(answer(6)), 0.1)
    assert conn.took() == [ToClient(answer(5)), ToClient(answer(6))]
    # One that does not (Kafka): the next answer is the next request's, nothing held up.
    core.client_bytes(produce_acks0_v3(7) + metadata(8), 0.2)
    core.response(memoryview(answer(8)), 0.3)
    assert conn.took() == [ToBroker([produce_acks0_v3(7), metadata(8)]), ToClient(answer(8))]
    assert not core.order.unasked


def test_a_throttled_request_mutes_the_connection_from_its_response_for_the_throttle() -> None:
    conn = Connection(Throttles({1: 100}))
    core = conn.core
    core.client_bytes(metadata(1) + metadata(2), 0.0)
    # Charged over its quota: nothing more is read, and the next request read waits.
    assert conn.took() == [READ_OFF, ToBroker([metadata(1)])]
    assert core.intake.held
    core.response(memoryview(answer(1)), 0.5)
    # The throttle runs from when the response went out (KIP-219).
    assert conn.took() == [ToClient(answer(1)), WaitUntil(Pause.THROTTLE, 0.6)]
    core.waited(Pause.THROTTLE, 0.6)
    assert conn.took() == [READ_ON, ToBroker([metadata(2)])]


def test_a_throttle_whose_response_is_still_to_go_out_keeps_reading_paused() -> None:
    conn = Connection(Throttles({1: 100, 2: 300}))
    core = conn.core
    core.client_bytes(metadata(1), 0.0)
    core.response(memoryview(answer(1)), 0.0)
    core.waited(Pause.THROTTLE, 0.1)
    core.client_bytes(metadata(2), 0.1)  # over again: muted until its answer, then 300 ms
    conn.took()
    core.response(memoryview(answer(2)), 0.2)
    assert conn.took() == [ToClient(answer(2)), WaitUntil(Pause.THROTTLE, 0.5)]
    core.waited(Pause.THROTTLE, 0.5)
    assert conn.took() == [READ_ON]


def test_a_paced_turn_taken_by_another_connection_waits_again() -> None:
    clock = [0.0]
    pacer = Pacer(clock)
    a, b = Connection(pacer), Connection(pacer)
    a.core.client_bytes(produce(1), 0.0)
    assert a.took() == [ToBroker([produce(1)])]  # the entity's turn until 0.1 taken
    clock[0] = 0.05
    b.core.client_bytes(produce(1), 0.05)
    assert b.took() == [READ_OFF, WaitUntil(Pause.PACE, 0.1)]  # read, not handled
    clock[0] = 0.1
    a.core.response(memoryview(answer(1)), 0.1)
    a.core.client_bytes(produce(2), 0.1)  # back first: it takes the turn
    assert a.took() == [ToClient(answer(1)), ToBroker([produce(2)])]
    b.core.waited(Pause.PACE, 0.1)  # asked afresh: the next turn is at 0.2
    assert b.took() == [READ_ON, READ_OFF, WaitUntil(Pause.PACE, 0.2)]
    clock[0] = 0.2
    b.core.waited(Pause.PACE, 0.2)
    assert b.took() == [READ_ON, ToBroker([produce(1)])]


def test_an_authentication_decided_elsewhere_holds_what_follows_until_it_is() -> None:
    answers = Answers()
    conn = Connection(answers)
    core = conn.core
    core.client_bytes(request_frame(SASL_AUTHENTICATE, 1, 1) + metadata(2), 0.0)
    (off, wait) = conn.took()
    assert off == READ_OFF and isinstance(wait, AwaitWork) and wait.reason is Pause.AUTHENTICATING
    assert core.intake.held  # the Metadata waits, read but not forwarded
    answers.pending[0].set_result(Reply(b"\x00\x01"))
    core.settled(wait.token, None, 0.1)
    assert conn.took() == [READ_ON, ToClient(frame_response(1, 0, b"\x00\x01")), ToBroker([metadata(2)])]


def test_a_failed_authentication_is_answered_late_and_then_the_connection_ends() -> None:
    answers = Answers()
    conn = Connection(answers)
    core = conn.core
    core.client_bytes(request_frame(SASL_AUTHENTICATE, 1, 1) + metadata(2), 0.0)
    (_, wait) = conn.took()
    assert isinstance(wait, AwaitWork)
    answers.pending[0].set_result(Reply(b"\x00\x3a", delay_ms=500, close_after=True))
    core.settled(wait.token, None, 1.0)
    # Nothing more is read: the answer is held back, then the connection closes.
    assert conn.took() == [READ_ON, READ_OFF, WaitUntil(Pause.HELD_ANSWER, 1.5)]
    assert core.reasons == {Pause.CLOSING, Pause.HELD_ANSWER}
    core.waited(Pause.HELD_ANSWER, 1.5)
    assert conn.took() == [ToClient(frame_response(1, 0, b"\x00\x3a")), CANCEL_WAITS, READ_ON, LINGER]
    assert not core.intake.held  # the Metadata after it is never handled


def test_work_that_fails_closes_the_connection_rather_than_hold_it() -> None:
    conn = Connection(Answers())
    core = conn.core
    core.client_bytes(request_frame(SASL_AUTHENTICATE, 1, 1), 0.0)
    (_, wait) = conn.took()
    assert isinstance(wait, AwaitWork)
    core.settled(wait.token, RuntimeError("bug"), 0.1)
    assert conn.took() == [READ_ON, CLOSE]


def test_a_malformed_frame_closes_its_connection_only() -> None:
    host = Host(Pipeline(request=[], response=[]))
    bad, good = Connection(host=host), Connection(host=host)
    bad.core.client_bytes(b"\xff\xff\xff\xff", 0.0)  # a negative size
    assert bad.took() == [CLOSE]
    assert host.metrics.protocol_errors.labels("negative_frame_length")._value.get() == 1
    good.core.client_bytes(metadata(1), 0.0)
    assert good.took() == [ToBroker([metadata(1)])]


def test_a_broker_that_reads_again_lets_the_requests_held_meanwhile_go() -> None:
    conn = Connection()
    core = conn.core
    core.pause(Pause.UPSTREAM_BUSY)
    core.client_bytes(metadata(1), 0.0)
    assert conn.took() == [READ_OFF]
    core.resume(Pause.UPSTREAM_BUSY, 0.1)
    assert conn.took() == [READ_ON, ToBroker([metadata(1)])]


def test_a_drain_ends_after_the_last_response() -> None:
    conn = Connection()
    core = conn.core
    core.client_bytes(metadata(1), 0.0)
    core.begin_drain(0.1)
    assert conn.took() == [ToBroker([metadata(1)]), READ_OFF]
    core.response(memoryview(answer(1)), 0.2)
    assert conn.took() == [ToClient(answer(1)), CANCEL_WAITS, READ_ON, LINGER]


FETCH = 1


def fetch(correlation_id: int) -> bytes:
    return request_frame(FETCH, 4, correlation_id)


def test_a_large_fetch_response_is_written_on_as_it_arrives() -> None:
    conn = Connection()
    core = conn.core
    core.client_bytes(fetch(1) + metadata(2), 0.0)
    conn.took()
    whole = answer(1, b"\x00" * 1000)
    response_head(core, FrameHead(whole[:100], len(whole)), 0.1)
    assert conn.took() == [ToClient(whole[:100])]  # cut through: its head goes on at once
    response_piece(core, FramePiece(memoryview(whole[100:600]), last=False), 0.1)
    core.response(memoryview(answer(2)), 0.1)  # the next answer waits for the rest of this one
    response_piece(core, FramePiece(memoryview(whole[600:]), last=True), 0.2)
    assert conn.took() == [ToClient(whole[100:600]), ToClient(whole[600:]), ToClient(answer(2))]


class HoldsMetadata(ResponseStage):
    """Holds a Metadata response until `later` is done (as a delegation token's owner is asked of
    the broker before its response goes out, sasl_inspect.py)."""

    api_keys = frozenset({METADATA})

    def __init__(self) -> None:
        self.later: Future[None] = Future()

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | None:
        ctx.hold = self.later  # type: ignore[assignment]
        return None


def test_a_large_response_behind_a_held_one_is_gathered_whole_and_goes_out_in_its_turn() -> None:
    held = HoldsMetadata()
    conn = Connection(host=Host(Pipeline(request=[], response=[held])))
    core = conn.core
    core.client_bytes(metadata(1) + fetch(2), 0.0)
    core.response(memoryview(answer(1)), 0.1)
    (forwarded, off, wait) = conn.took()
    assert forwarded == ToBroker([metadata(1), fetch(2)]) and off == READ_OFF
    assert isinstance(wait, AwaitWork) and wait.reason is Pause.HELD_RESPONSE
    whole = answer(2, b"\x01" * 1000)
    response_head(core, FrameHead(whole[:100], len(whole)), 0.1)
    response_piece(core, FramePiece(memoryview(whole[100:]), last=True), 0.2)
    assert conn.took() == []  # nothing written before the held answer
    held.later.set_result(None)
    core.settled(wait.token, None, 0.3)
    assert conn.took() == [READ_ON, ToClient(answer(1)), ToClient(whole)]


def test_a_broker_lost_mid_response_ends_the_connection() -> None:
    conn = Connection()
    core = conn.core
    core.client_bytes(fetch(1), 0.0)
    conn.took()
    whole = answer(1, b"\x00" * 1000)
    response_head(core, FrameHead(whole[:100], len(whole)), 0.1)
    response_piece(core, FramePiece(memoryview(whole[100:300]), last=False), 0.1)
    core.broker_lost("connection reset")
    # The client has part of a response it can never finish: its connection is closed.
    assert conn.took() == [ToClient(whole[:100]), ToClient(whole[100:300]), CLOSE]
