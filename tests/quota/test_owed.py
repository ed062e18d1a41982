"""Kafka's throttle on a fleet, settled at the store's reads (SharedRate.owe, Owed,
ClientQuotaManager.owed_wait_ms, QuotaCharge.hold_ms), with a fake clock.

Two replicas, `a` and `b`, each a QuotaEngine with a store registry, share one Produce quota of
1 MB/s for client-id "c" through `Sums` (the sync script's arithmetic). A request is throttled on
what its replica knew when it came; the reads after it bring the other replica's bytes, and the
connection is held until Kafka's throttle of the request on the bytes that came before it.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import cast

import pytest

from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.protocol.api_keys import FETCH, PRODUCE
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.quota_charge import QuotaCharge
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.managers import ChargeHandle, ClientQuotaManager
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.shared import SharedQuotas
from kafka_quota_proxy.quota.shared_rate import SharedRate
from tests.quota.test_shared import Sums
from tests.support.managers import produce_bytes

QUOTA = 1_000_000.0
Handles = dict[object, ChargeHandle]


class Fleet:
    """Replicas on one fake clock, synced through one `Sums` in the order given."""

    def __init__(self, replicas: int = 2, enforcement: str = "kafka") -> None:
        self.now = [0]
        self.sums = Sums()
        store = QuotaStore({QuotaEntity(client_id="c"): {QuotaKey.PRODUCER_BYTE_RATE: QUOTA}})
        settings = QuotaSettings(scope="cluster", byte_rate_enforcement=enforcement)
        self.engines = [QuotaEngine(settings, store, clock=lambda: self.now[0], shared_buckets=1)
                        for _ in range(replicas)]
        for engine in self.engines:
            self.registry(engine).live_replicas = replicas
            self.registry(engine).rng = random.Random(7)
        self.handles: list[Handles] = [{} for _ in range(replicas)]

    @staticmethod
    def registry(engine: QuotaEngine) -> SharedQuotas:
        assert engine.shared is not None
        return engine.shared

    def produce(self, i: int) -> ClientQuotaManager:
        return produce_bytes(self.engines[i].scope("broker"))

    def record(self, i: int, size: int, at: int, paced: bool = False) -> int:
        self.now[0] = at
        return self.produce(i).record_and_get_throttle_ms("", "c", size, at, self.handles[i], paced)

    def sync(self, at: int, order: tuple[int, ...] = (1, 0)) -> None:
        self.now[0] = at
        for i in order:
            self.sums.sync(self.registry(self.engines[i]), f"r{i}", at)

    def wait(self, i: int, at: int) -> int:
        return self.produce(i).owed_wait_ms(self.handles[i], at)

    def stat(self, i: int) -> SharedRate:
        (stat,) = self.registry(self.engines[i])._stats.values()
        return cast(SharedRate, stat)


def _warmed() -> Fleet:
    """Both replicas recorded 1000 B at 10 ms and were read twice (at 100 and 200 ms): their
    stats are past their first read."""
    fleet = Fleet()
    fleet.record(0, 1000, 10)
    fleet.record(1, 1000, 10)
    fleet.sync(100)
    fleet.sync(200)
    return fleet


def test_a_request_owes_kafkas_throttle_on_the_bytes_the_next_reads_show_came_before_it() -> None:
    fleet = _warmed()
    assert fleet.wait(0, 200) == 0  # the first bytes owed nothing
    fleet.record(1, 12_000_000, 250)  # b's client, which a knows nothing of until its next read
    # a's own 501,000 B over its Rate's window, 270 ms since its first sample and (N-1) W more,
    # 10.27 s; b's 1000 B over the 10 s the others' bytes are at least spread over: 48,883 B/s,
    # under the quota. Kafka's throttle on it would be (48,883 - Q) / Q * 10.27 s = -9768 ms,
    # and each byte more before it 10.27 s / (10 s * Q) = 1.027 us.
    assert fleet.record(0, 500_000, 280) == 0
    (owed,) = fleet.handles[0][fleet.produce(0)].owed
    assert (owed.at_ms, owed.slack_ms, owed.per_byte_ms) == (280, pytest.approx(-9767.973), 0.001027)
    assert fleet.wait(0, 290) == 0  # nothing known yet: not held
    fleet.sync(300)  # b writes, then a reads: b's 12 MB
    # a's request came 0.8 into the interval between its reads (200 and 300 ms): of the bytes the
    # first read after it brings, 1 - 0.2^2 / 2 = 0.98 came before it.
    assert owed.missed == pytest.approx(11_760_000)
    assert owed.until_ms == pytest.approx(280 - 9767.973 + 11_760_000 * 0.001027)  # 2589.5
    assert fleet.wait(0, 300) == 2290
    fleet.record(1, 1_000_000, 350)
    fleet.sync(400)  # the second read after it: 0.8^2 / 2 = 0.32 of b's next 1 MB
    assert owed.until_ms == pytest.approx(2589.547 + 320_000 * 0.001027)  # 2918.2
    fleet.record(1, 1_000_000, 450)
    fleet.sync(500)  # a third read brings nothing from before it
    assert owed.until_ms == pytest.approx(2918.187)
    assert fleet.wait(0, 2000) == 918
    # Paid: forgotten.
    assert fleet.wait(0, 2919) == 0
    assert fleet.handles[0][fleet.produce(0)].owed == []


def test_the_throttle_told_at_once_is_kafkas_on_what_the_replica_knows() -> None:
    fleet = _warmed()
    fleet.record(1, 12_000_000, 250)
    fleet.sync(300)  # a knows b's 12 MB now
    # a's 501,000 B over 10.31 s and b's 12,001,000 over 10 s: 1,248,694 B/s, over the quota by
    # 24.87%: Kafka's throttle, 0.2487 * 10.31 s.
    assert fleet.record(0, 500_000, 320) == 2564
    fleet.sync(400)
    fleet.sync(500)
    # Nothing came from b since: its connection owes what it was told, which its mute pays.
    assert fleet.wait(0, 320 + 2564) == 0


def test_one_replica_alone_owes_nothing_beyond_the_throttles_it_told() -> None:
    fleet = Fleet(replicas=1)
    at = throttled = 0
    for i in range(60):
        at += 37 + (i % 5) * 13
        throttle = fleet.record(0, 150_000 + (i * 7919) % 100_000, at)
        if i % 3 == 0:
            fleet.sync(at + 1, order=(0,))
        at += throttle  # the client waits its throttle (KIP-219), as the mute makes it
        throttled += throttle
        assert fleet.wait(0, at) == 0
    assert throttled > 0.5 * at  # well over the quota: throttled most of the way


def test_a_fresh_stats_first_read_counts_older_samples_whole_and_draws_its_place_among_the_recent() -> None:
    fleet = Fleet()
    fleet.record(1, 5_000_000, 10)  # b's, in aligned sample 0
    for at in range(100, 3100, 100):
        fleet.sync(at, order=(1,))
    fleet.record(1, 1_000_000, 3020)  # sample 3, the current one when a first reads
    fleet.sync(3050, order=(1,))
    # a's first bytes: its stat is new, and knows nothing of b's.
    assert fleet.record(0, 100_000, 3060) == 0
    (owed,) = fleet.handles[0][fleet.produce(0)].owed
    fleet.sync(3100, order=(0,))
    # b's 5 MB of sample 0 came before; of its 1 MB in the last two samples, a part drawn (the
    # fleet's first bytes come at about the same time; on one broker, in some order).
    draw = random.Random(7).random()
    assert owed.missed == pytest.approx(5_000_000 + 1_000_000 * draw)


def test_a_young_stat_holds_for_a_guess_of_the_others_first_bytes_until_its_reads_show_them() -> None:
    # Three replicas' clients start at once, 1 MB requests 10 ms apart; no replica has read the
    # others yet, and each writes its bytes at its own sync. On one broker the fleet's 12 MB
    # would pass Kafka's first allowance (10 s of quota) and throttle the last ones.
    fleet = Fleet(replicas=3)
    told = [fleet.record(i, 1_000_000, 10 + 10 * k + i) for k in range(4) for i in range(3)]
    assert told == [0] * 12  # on what each knows (its own 1-4 MB), under the quota: no throttle
    owed = fleet.handles[0][fleet.produce(0)].owed
    # Each takes the two others to have sent as much as it: a's fourth request, its 4 MB and a
    # guessed 8 MB, owes about (4 + 8 - 10) MB at 1 ms per kB: its 4 MB leave 6 s of slack under
    # the quota, the guess costs 8 s.
    assert [o.guess for o in owed] == [2_000_000, 4_000_000, 6_000_000, 8_000_000]
    assert (owed[3].slack_ms, owed[3].per_byte_ms) == (pytest.approx(-6030), pytest.approx(0.001003))
    assert owed[3].until_ms == pytest.approx(2034)
    # Held, not told: asked again at the next read (a whole interval, never read yet).
    assert fleet.wait(0, 45) == 100
    fleet.sync(100, order=(1, 2, 0))
    # The first read may not yet show every other replica's first bytes: still the guess.
    assert fleet.stat(0).reads == 1 and fleet.wait(0, 100) == 100
    fleet.sync(200, order=(1, 2, 0))
    # The second gives the guesses way to what the two reads showed (the others' first bytes, a
    # part of them drawn to have come before each request, as for any fresh stat): here none of
    # a's requests had Kafka's first allowance behind it.
    assert [o.guess for o in owed] == [0, 0, 0, 0]
    assert max(o.until_ms for o in owed) < 200 and fleet.wait(0, 200) == 0


def test_while_the_store_is_out_of_reach_nothing_is_owed() -> None:
    fleet = _warmed()
    fleet.registry(fleet.engines[0]).degrade(300, "open")
    owed = fleet.handles[0][fleet.produce(0)].owed
    before = list(owed)
    fleet.record(0, 500_000, 300)
    assert owed == before
    assert fleet.stat(0).pending == []


def test_paced_a_rate_is_not_settled_its_reads_pace_the_others_bytes() -> None:
    fleet = _warmed()
    stat = fleet.stat(0)
    assert stat.settles and stat.reads == 2
    fleet.record(0, 1000, 250, paced=True)
    fleet.sync(300)
    assert not stat.settles and stat.reads == 2 and stat.pending == []


def _ctx(key: int, handles: Handles, engine: QuotaEngine) -> RequestContext:
    header = SimpleNamespace(api_key=key, client_id="c")
    conn = SimpleNamespace(upstream="broker", quotas=engine.scope("broker"), charge_handles=handles,
                           principal="")
    return cast(RequestContext, SimpleNamespace(header=header, conn=conn))


def test_a_produce_waits_unread_for_what_its_connection_owes() -> None:
    fleet = _warmed()
    fleet.record(1, 12_000_000, 250)
    fleet.record(0, 500_000, 280)
    fleet.sync(300)
    charge = QuotaCharge(fleet.engines[0])
    fleet.now[0] = 300
    first = fleet.engines[0]
    assert charge.hold_ms(_ctx(PRODUCE, fleet.handles[0], first)) == 2290
    assert charge.hold_ms(_ctx(FETCH, fleet.handles[0], first)) == 0  # a consumer quota owes nothing
    fleet.now[0] = 2590
    assert charge.hold_ms(_ctx(PRODUCE, fleet.handles[0], first)) == 0


def test_without_a_store_kafkas_mode_holds_nothing() -> None:
    store = QuotaStore({QuotaEntity(client_id="c"): {QuotaKey.PRODUCER_BYTE_RATE: QUOTA}})
    engine = QuotaEngine(QuotaSettings(), store, clock=lambda: 0)
    handles: Handles = {}
    produce_bytes(engine.scope("broker")).record_and_get_throttle_ms("", "c", 50_000_000, 0, handles)
    assert QuotaCharge(engine).hold_ms(_ctx(PRODUCE, handles, engine)) == 0
    assert handles[produce_bytes(engine.scope("broker"))].owed == []
