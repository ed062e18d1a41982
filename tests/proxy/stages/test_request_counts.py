"""RequestCounts (proxy/stages/request_counts.py), called directly with a real QuotaEngine on a fake
clock: the one stage of the request-rate kinds registered in quota/kinds.py. It asks for the API
keys its kinds count, charges each such request one to every kind that counts its key, throttles
by Kafka's rule (the kind's quota_type counted, the client held in mode enforce only), and charges
nothing for an exempt client or before any client quota is configured."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.protocol.api_keys import DESCRIBE_GROUPS, LIST_GROUPS
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.request_counts import RequestCounts
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import QuotaKind, registered
from kafka_quota_proxy.quota.resolution import QuotaStore
from tests.proxy.conftest import request_frame
from tests.proxy.quota_support import kafka_throttle
from tests.support.kinds import LIST_GROUPS_RATE

NOW = 5_000
BROKER = "b1:9092"
# Two toy kinds: issue 38's counts ListGroups, the other ListGroups and DescribeGroups.
LISTS = LIST_GROUPS_RATE
GROUPS = QuotaKind(QuotaKey("group_request_rate"), "groups", extension=True,
                   counts=frozenset({LIST_GROUPS, DESCRIBE_GROUPS}))


@pytest.fixture(autouse=True)
def kinds() -> Iterator[None]:
    with registered(LISTS), registered(GROUPS):
        yield


def engine(quotas: dict[QuotaKey, float], mode: str = "enforce",
           exempt: tuple[str, ...] = ()) -> QuotaEngine:
    store = QuotaStore({QuotaEntity(client_id="c"): quotas})
    settings = QuotaSettings(mode=mode, exempt_client_ids=frozenset(exempt))  # type: ignore[arg-type]
    return QuotaEngine(settings, store, clock=lambda: NOW)


def request(e: QuotaEngine, api_key: int, client_id: bytes = b"c") -> RequestContext:
    frame = memoryview(request_frame(api_key, 1, 7, client_id=client_id))
    ctx = RequestContext(parse_request_header(frame), frame,
                         ConnectionInfo("127.0.0.1:5000", "bootstrap", principal="alice"))
    ctx.conn.quotas = e.scope(BROKER)
    return ctx


def throttles(e: QuotaEngine) -> dict[tuple[str, str, str], tuple[int, int]]:
    return {k: (r.count, r.total_ms) for k, r in e.throttles.records.items()}


def test_it_asks_for_the_keys_its_kinds_count() -> None:
    assert RequestCounts(engine({}), (LISTS,)).api_keys == frozenset({LIST_GROUPS})
    assert RequestCounts(engine({}), (LISTS, GROUPS)).api_keys == frozenset({LIST_GROUPS, DESCRIBE_GROUPS})


def test_each_request_counts_one_and_the_one_over_the_rate_is_throttled_by_kafkas_rule() -> None:
    e = engine({LISTS.key: 2})
    stage = RequestCounts(e, (LISTS,))
    # A new sensor's rate spans (11 - 1) windows of 1 s: 20 requests at one instant are 2/s.
    for _ in range(20):
        ctx = request(e, LIST_GROUPS)
        assert stage.on_request(ctx) is None
        assert ctx.throttle_ms == 0
    ctx = request(e, LIST_GROUPS)
    assert stage.on_request(ctx) is None  # told by the response's throttle_time_ms, not answered here
    assert ctx.throttle_ms == kafka_throttle(2.1, 2) == 500
    assert e.scope(BROKER).rates[LISTS.key].measure("alice", "c", NOW) == 2.1
    assert throttles(e) == {("list_groups", "alice", "c"): (1, 500)}


def test_a_request_counts_for_every_kind_that_counts_its_key() -> None:
    e = engine({LISTS.key: 100, GROUPS.key: 100})
    stage = RequestCounts(e, (LISTS, GROUPS))
    for api_key in (LIST_GROUPS, LIST_GROUPS, DESCRIBE_GROUPS):
        stage.on_request(request(e, api_key))
    q = e.scope(BROKER)
    assert q.rates[LISTS.key].measure("alice", "c", NOW) == 0.2  # 2 over 10 s
    assert q.rates[GROUPS.key].measure("alice", "c", NOW) == 0.3  # 3 over 10 s


@pytest.mark.parametrize("mode", ["observe", "off"])
def test_without_enforcement_the_client_is_not_held(mode: str) -> None:
    e = engine({LISTS.key: 0.1}, mode=mode)
    stage = RequestCounts(e, (LISTS,))
    for _ in range(2):  # the second is 0.2/s, over 0.1/s
        ctx = request(e, LIST_GROUPS)
        stage.on_request(ctx)
        assert ctx.throttle_ms == 0
    # observe counts the throttle it would have told; off charges nothing at all
    expected = {("list_groups", "alice", "c"): (1, kafka_throttle(0.2, 0.1))} if mode == "observe" else {}
    assert throttles(e) == expected


def test_an_exempt_client_is_not_charged() -> None:
    e = engine({LISTS.key: 0.1}, exempt=("c",))
    ctx = request(e, LIST_GROUPS)
    RequestCounts(e, (LISTS,)).on_request(ctx)
    assert ctx.throttle_ms == 0
    assert e.scope(BROKER).rates[LISTS.key].measure("alice", "c", NOW) == 0.0


def test_nothing_is_charged_before_any_client_quota_is_configured() -> None:
    e = engine({})
    ctx = request(e, LIST_GROUPS)
    RequestCounts(e, (LISTS,)).on_request(ctx)
    assert e.scope(BROKER).rates[LISTS.key].measure("alice", "c", NOW) == 0.0
    assert throttles(e) == {}
