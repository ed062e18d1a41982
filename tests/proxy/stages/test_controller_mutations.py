"""ControllerMutationCharge (proxy/stages/controller_mutations.py), called directly with a real
QuotaEngine on a fake clock: KIP-599's token bucket (1 partition/s, 11 windows of 1 s: a burst of
11) charged with the partitions a request creates or deletes; strict from CreateTopics v6 (checked
first: refused once the bucket is below zero, every topic failed with THROTTLING_QUOTA_EXCEEDED
and the throttle told, nothing recorded), permissive before (recorded, then throttled)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin.topics import CreateTopicsResponse

from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.protocol.api_keys import CREATE_PARTITIONS, CREATE_TOPICS, DELETE_TOPICS
from kafka_quota_proxy.protocol.error_codes import THROTTLING_QUOTA_EXCEEDED
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.base import Reply
from kafka_quota_proxy.proxy.stages.controller_mutations import (
    STRICT_FROM,
    ControllerMutationCharge,
    mutation_permits,
)
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaStore
from tests.proxy.conftest import request_frame
from tests.proxy.quota_support import create_topics
from tests.support.managers import mutation_bucket

NOW = 5_000
BROKER = "b1:9092"


def engine(mode: str = "enforce") -> QuotaEngine:
    store = QuotaStore({QuotaEntity(client_id="c"): {QuotaKey.CONTROLLER_MUTATION_RATE: 1.0}})
    return QuotaEngine(QuotaSettings(mode=mode), store, clock=lambda: NOW)  # type: ignore[arg-type]


def creating(e: QuotaEngine, version: int, partitions: int) -> RequestContext:
    body = bytes(create_topics(version, [("t", partitions, 0)]).encode(version=version))
    frame = memoryview(request_frame(CREATE_TOPICS, version, 7, body, client_id=b"c", flexible=version >= 5))
    ctx = RequestContext(parse_request_header(frame), frame,
                         ConnectionInfo("127.0.0.1:5000", "bootstrap", principal="alice"))
    ctx.conn.quotas = e.scope(BROKER)
    return ctx


def tokens(e: QuotaEngine) -> float | None:
    return mutation_bucket(e.scope(BROKER)).tokens("alice", "c", NOW)


def throttles(e: QuotaEngine) -> dict[tuple[str, str, str], tuple[int, int]]:
    return {k: (r.count, r.total_ms) for k, r in e.throttles.records.items()}


def test_it_asks_for_the_three_mutating_apis_strict_from_kip_599s_versions() -> None:
    assert ControllerMutationCharge(engine(), lambda topic: None).api_keys == frozenset(
        {CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS})
    assert STRICT_FROM == {CREATE_TOPICS: 6, DELETE_TOPICS: 5, CREATE_PARTITIONS: 3}


def test_strict_a_request_is_let_through_while_the_bucket_is_not_below_zero_then_refused() -> None:
    e = engine()
    stage = ControllerMutationCharge(e, lambda topic: None)
    first = creating(e, 6, 12)
    assert stage.on_request(first) is None  # 11 tokens: checked first, then all 12 recorded
    assert first.charged is not None and first.charged.permits == 12
    assert first.throttle_ms == 0  # Kafka's strict quota throttles only what it refuses
    assert tokens(e) == -1.0
    second = creating(e, 6, 1)
    reply = stage.on_request(second)
    assert isinstance(reply, Reply) and reply.body is not None
    answer: Any = CreateTopicsResponse.decode(reply.body, version=6)  # type: ignore[attr-defined]
    # 1 token short at 1/s: 1 s
    assert (answer.throttle_time_ms, [(t.name, t.error_code, t.error_message) for t in answer.topics]) == (
        1_000, [("t", THROTTLING_QUOTA_EXCEEDED, "The throttling quota has been exceeded.")])
    assert second.throttle_ms == 1_000
    assert tokens(e) == -1.0  # nothing recorded for the refused request
    assert throttles(e) == {("controller_mutation", "alice", "c"): (1, 1_000)}


def test_permissive_before_the_strict_versions_a_request_is_recorded_then_throttled() -> None:
    e = engine()
    stage = ControllerMutationCharge(e, lambda topic: None)
    assert stage.on_request(creating(e, 5, 11)) is None
    ctx = creating(e, 5, 3)
    assert stage.on_request(ctx) is None  # forwarded all the same
    assert tokens(e) == -3.0
    assert ctx.throttle_ms == 3_000
    assert throttles(e) == {("controller_mutation", "alice", "c"): (1, 3_000)}


def test_in_mode_observe_nothing_is_refused_and_every_throttle_is_counted() -> None:
    e = engine("observe")
    stage = ControllerMutationCharge(e, lambda topic: None)
    stage.on_request(creating(e, 6, 12))
    ctx = creating(e, 6, 1)
    assert stage.on_request(ctx) is None
    assert ctx.throttle_ms == 0
    assert tokens(e) == -2.0
    # recorded as permissive, so each counts the throttle it would have had: 1 s, then 2 s
    assert throttles(e) == {("controller_mutation", "alice", "c"): (2, 3_000)}


def test_the_permits_are_the_partitions_created_or_deleted() -> None:
    known = {"a": 3, "b": 5}.get
    created: Any = create_topics(6, [("x", 4, 0), ("y", -1, 0), ("z", -1, 2)])
    # num_partitions, Kafka's default of 1 for -1, explicit assignments
    assert mutation_permits(CREATE_TOPICS, created, known) == 4 + 1 + 2

    class Topic:
        def __init__(self, name: str, count: int = 0) -> None:
            self.name, self.count = name, count

    class Partitions:
        topics = [Topic("a", 5), Topic("b", 2), Topic("new", 4)]  # to 5 from 3; fewer; unknown

    assert mutation_permits(CREATE_PARTITIONS, Partitions(), known) == 2 + 0 + 4

    class Deleted:
        API_VERSION = 6
        topics = [Topic("a"), Topic("unknown")]

    assert mutation_permits(DELETE_TOPICS, Deleted(), known) == 3 + 1
