"""`quota.byte_rate_enforcement: paced` end to end: an in-process Proxy in front of a scripted
broker, two connections under one client-id, the quota engine on a fake clock. A request waits
unread until its entity's pace lets it in, whichever connection it came on (QuotaCharge.hold_ms);
a fetch whose turn another connection took is answered empty (QuotaSettle).

The fake clock drives the pace; the holds and mutes run on the event loop's real time. While the
fake clock stands still a held request stays held however long it waits, so "not yet" is checked
by waiting, and "now" by moving the fake clock.
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from kafka_quota_proxy.protocol.headers import RequestHeader
from kafka_quota_proxy.proxy.datapath.client import ClientConnection
from tests.proxy.conftest import running
from tests.proxy.quota_support import (
    START_MS,
    Script,
    arrival,
    connect,
    fetch,
    freeze,
    list_groups,
    produce,
    records_for_fetch_size,
    run,
    scope,
)
from tests.support.fake_broker import BrokerConn
from tests.support.managers import fetch_bytes, produce_bytes

# window_num 2: Kafka's first allowance, and the pace's credit, is (N-1) W = 1 s of quota.
PACED = {"byte_rate_enforcement": "paced", "window_num": 2}
QUOTA = 100_000


@pytest.mark.parametrize("enforcement", ["kafka", "paced"])
def test_a_second_connection_waits_for_the_turn_the_first_took(enforcement: str) -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quota={**PACED, "byte_rate_enforcement": enforcement},
                           quotas=[{"client-id": "c", "producer_byte_rate": QUOTA}]) as h:
            now = freeze(h)
            first, second = await connect(h), await connect(h)
            second.correlation = 100
            # 105,000 B: the 1 s of credit and 50 ms more. Kafka's throttle is the same 50 ms,
            # (105,000 / 1 s - Q) / Q * 1 s: one connection's alone is held either way.
            assert (await first.call(produce(7, 105_000))).throttle_time_ms == 50
            # A group request is never held, whatever the quota.
            corr = await second.send(list_groups())
            await arrival(h, script, corr)
            await second.recv(list_groups())
            corr = await second.send(produce(7, 1000))
            if enforcement == "kafka":
                # Kafka's: the other connection sends on, over the quota, throttled in its turn.
                await arrival(h, script, corr)
                assert (await second.recv(produce(7, 1000)))[1].throttle_time_ms == 60
            else:
                # Paced: its request waits unread while the first one's bytes are not paid for.
                await asyncio.sleep(0.2)
                assert corr not in script.arrivals
                (conn,) = [c for c in h.proxy.connections if cast(ClientConnection, c).core.intake.held]
                assert "pace" in cast(ClientConnection, conn).core.reasons
                now[0] += 50  # paid for: its turn
                await arrival(h, script, corr)
                # Its own 1000 B at the quota: the next bytes may come 10 ms after its turn.
                assert (await second.recv(produce(7, 1000)))[1].throttle_time_ms == 10
            q = h.proxy.engine.scope(scope(h))
            # Kafka's rate, as ever: over the 1 s every window starts with, and the 50 ms since.
            rate = produce_bytes(q).measure("ANONYMOUS", "c", now[0])
            assert rate == 106_000 / (1 + (now[0] - START_MS) / 1000)
            first.close()
            second.close()
    run(scenario())


class SlowFetches(Script):
    """Answers a Fetch only after `fetch_delay` s: both connections' fetches are then forwarded
    before either is answered."""

    fetch_delay = 0.2

    async def __call__(self, conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        if header.api_key == 1:
            await asyncio.sleep(self.fetch_delay)
        return await super().__call__(conn, header, frame)


def test_a_fetch_whose_turn_another_connection_took_is_answered_empty() -> None:
    """Both fetches are read while the entity's turn has come; the first answered is delivered,
    charged and paced, its connection muted until the next turn; the other is answered empty,
    as Kafka answers a throttled fetch, and charged nothing."""
    script = SlowFetches()
    version = 12

    async def scenario() -> None:
        async with running(script, quota=PACED,
                           quotas=[{"client-id": "c", "consumer_byte_rate": QUOTA}]) as h:
            freeze(h)
            one, two = await connect(h), await connect(h)
            two.correlation = 100
            script.fetch_records = records_for_fetch_size(version, 105_000)
            request = fetch(version)
            await one.send(request)
            await two.send(request)
            answers = [(await one.recv(request))[1], (await two.recv(request))[1]]
            delivered = [a for a in answers if a.responses]
            empty = [a for a in answers if not a.responses]
            assert len(delivered) == len(empty) == 1
            assert delivered[0].throttle_time_ms == 50  # paid for 50 ms after now
            assert (empty[0].throttle_time_ms, empty[0].error_code) == (50, 0)
            q = h.proxy.engine.scope(scope(h))
            assert fetch_bytes(q).measure("ANONYMOUS", "c", START_MS) == 105_000  # the delivered one alone
            one.close()
            two.close()
    run(scenario())


def test_only_produce_and_fetches_are_asked_whether_to_wait() -> None:
    async def scenario() -> None:
        async with running(Script(), quota=PACED) as h:
            pipeline = h.proxy.pipeline
            assert [type(s).__name__ for s in pipeline.request_holds(0)] == ["QuotaCharge"]  # Produce
            assert [type(s).__name__ for s in pipeline.request_holds(1)] == ["QuotaCharge"]  # Fetch
            assert [type(s).__name__ for s in pipeline.request_holds(78)] == ["QuotaCharge"]  # ShareFetch
            assert pipeline.request_holds(3) == pipeline.request_holds(16) == ()  # Metadata, ListGroups
    run(scenario())
