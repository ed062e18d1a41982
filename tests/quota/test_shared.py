"""The shared-rate math (quota/shared.py) with a fake clock.

The store here is `Sums`, a few lines that do what the sync script does (absolute writes per
replica, sums per entity and sample, the replica marker). It tests the arithmetic on this side;
what the real script does on a real Valkey is tested in tests/integration/test_store_sync.py.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.quota.aligned import StoreClock
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.managers import ClientQuotaManager
from kafka_quota_proxy.quota.rate import MetricConfig, Rate
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.sensors import LocalSensors
from kafka_quota_proxy.quota.shared import ScopedShared, SharedQuotas, bucket_of, sensor_key_text
from kafka_quota_proxy.quota.shared_fetch import SharedFetchRate
from kafka_quota_proxy.quota.shared_pacer import SharedPacer
from kafka_quota_proxy.quota.shared_rate import SharedRate
from kafka_quota_proxy.quota.throttle import rate_throttle_time_ms
from kafka_quota_proxy.quota.topics import Leadership, TopicQuotaManager
from tests.support.managers import topic_produce

CONFIG = MetricConfig(samples=11, window_ms=1000)
KEY = sensor_key_text("produce", "cluster", ("Produce", "alice", ""))


class Sums:
    """What the sync script keeps: per (entity, sample) each replica's absolute count."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], dict[str, int]] = {}
        self.markers: set[tuple[int, str]] = set()
        self.wrote: set[tuple[int, str]] = set()

    def sync(self, quotas: SharedQuotas, replica: str, now_ms: float) -> None:
        for batch in quotas.collect(now_ms):
            mark = (batch.bucket, replica)
            lost = mark in self.wrote and mark not in self.markers
            self.markers.add(mark)
            self.wrote.add(mark)
            for key, writes in batch.writes.items():
                for s, v in writes.items():
                    self.counts.setdefault((key, s), {})[replica] = v
            totals = {key: {s: sum(self.counts.get((key, s), {}).values()) for s in wanted}
                      for key, wanted in batch.reads.items()}
            quotas.applied(batch, totals, lost, now_ms)

    def lose_everything(self) -> None:
        self.counts.clear()
        self.markers.clear()


def test_one_replica_measures_and_throttles_exactly_as_kafkas_rate() -> None:
    quotas = SharedQuotas(CONFIG, clock=StoreClock(offset_ms=123_456))
    shared = quotas.rate(KEY)
    plain = Rate(CONFIG)
    sums = Sums()
    now = 5_000.0
    for i in range(400):
        now += 37 + (i % 7) * 11
        size = 1000 + (i * 7919) % 5000
        shared.record(size, now)
        plain.record(size, now)
        if i % 3 == 0:
            sums.sync(quotas, "only", now)
        assert shared.measure(now) == plain.measure(now)
        assert shared.surely_within(50_000, now) == plain.surely_within(50_000, now)
        assert (rate_throttle_time_ms(shared, shared.measure(now), 20_000, now)
                == rate_throttle_time_ms(plain, plain.measure(now), 20_000, now))


@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(-500, 100_000), st.booleans()),
                max_size=60))
def test_one_replica_is_kafkas_rate_for_any_sequence(events: list[tuple[int, int, bool]]) -> None:
    quotas = SharedQuotas(CONFIG, clock=StoreClock(offset_ms=777))
    shared = quotas.rate(KEY)
    plain = Rate(CONFIG)
    sums = Sums()
    now = 0.0
    for gap, size, sync in events:
        now += gap
        shared.record(size, now)
        plain.record(size, now)
        if sync:
            sums.sync(quotas, "only", now)
        assert shared.measure(now) == plain.measure(now)


def _run_replicas(rates_bps: list[float], seconds: float, sync_ms: int = 100,
                  step_ms: int = 10) -> list[SharedQuotas]:
    sums = Sums()
    clock = StoreClock()
    fleet = [SharedQuotas(CONFIG, clock=clock) for _ in rates_bps]
    stats = [q.rate(KEY) for q in fleet]
    now = 0.0
    while now < seconds * 1000:
        now += step_ms
        for stat, bps in zip(stats, rates_bps, strict=True):
            if bps:
                stat.record(bps * step_ms / 1000, now)
        if now % sync_ms == 0:
            for i, q in enumerate(fleet):
                sums.sync(q, f"r{i}", now)
    return fleet


def test_each_replica_sees_the_whole_fleets_rate() -> None:
    fleet = _run_replicas([600.0, 300.0, 100.0], seconds=30)
    now = 30_000.0
    for quotas in fleet:
        seen = quotas.rate(KEY).measure(now)
        assert seen == pytest.approx(1000.0, rel=0.02)


def test_a_replica_with_no_traffic_still_sees_the_others() -> None:
    fleet = _run_replicas([500.0, 0.0], seconds=20)
    idle = fleet[1].rate(KEY)
    assert idle.others_rate(20_000.0) == pytest.approx(500.0, rel=0.02)


def test_the_others_rate_runs_from_their_first_bytes_in_the_oldest_sample_as_kafkas_does() -> None:
    # Another replica's client sends 100 kB lumps every 2 s, 0.6 s into an aligned sample (a
    # flat-out producer's large requests between throttles). Kafka's Rate over those bytes starts
    # its oldest sample at its first event (20.6 s): 600 kB over 10.4 s. Counted from the aligned
    # sample's start (20.0 s), the others' rate read 5.5% low; from when the reads show the first
    # bytes came (a sync interval before the read that first shows them), it is Kafka's here, and
    # off by at most about an interval's worth of the span elsewhere.
    sums = Sums()
    clock = StoreClock()
    here, there = SharedQuotas(CONFIG, clock=clock), SharedQuotas(CONFIG, clock=clock)
    mine, theirs = here.rate(KEY), there.rate(KEY)
    kafka = Rate(CONFIG)
    now = 0.0
    while now < 31_000:
        now += 100
        if now % 2000 == 600:
            theirs.record(100_000, now)
            kafka.record(100_000, now)
        if now % 1000 == 0:
            mine.record(1, now)  # a byte a second: a stat that records nothing is let go from the sync
        sums.sync(here, "here", now)  # reads before the other replica writes, at each tick
        sums.sync(there, "there", now)
    assert kafka.measure(now) == pytest.approx(600_000 / 10.4)
    # The lump of 20.6 s was written at the other's sync that tick, after this replica's read, and
    # first read at 20.7 s: taken to have come a sync interval before, at 20.6 s.
    assert mine.others_rate(now) == pytest.approx(kafka.measure(now))


def test_a_retried_sync_never_counts_twice() -> None:
    sums = Sums()
    a, b = SharedQuotas(CONFIG), SharedQuotas(CONFIG)
    a.rate(KEY).record(10_000, 500)
    b.rate(KEY).record(5_000, 500)
    for _ in range(3):  # the same absolute values written again and again
        for batch in a.collect(600):
            for key, writes in batch.writes.items():
                for s, v in writes.items():
                    sums.counts.setdefault((key, s), {})["a"] = v
        sums.sync(a, "a", 600)
    sums.sync(b, "b", 600)
    sums.sync(a, "a", 700)
    assert sum(sum(c.values()) for c in sums.counts.values()) == 15_000
    assert b.rate(KEY).others == {0: 10_000}
    assert a.rate(KEY).others == {0: 5_000}


def test_the_sample_before_is_read_only_while_the_others_may_still_write_it() -> None:
    # Each replica writes its last bytes of a sample at its first sync after the boundary, so a
    # known key reads the sample before only in the first settle_ms of the current one (the
    # store's work for a read halves); a new key reads every retained sample.
    quotas = SharedQuotas(CONFIG)
    quotas.rate(KEY).record(100, 5_050)
    assert quotas.collect(5_100, settle_ms=300)[0].reads[KEY] == list(range(5 - 11, 6))  # new: all
    quotas.applied(quotas.collect(5_100, settle_ms=300)[0], {KEY: {5: 100}}, False, 5_100)
    assert quotas.collect(5_250, settle_ms=300)[0].reads[KEY] == [4, 5]
    assert quotas.collect(5_300, settle_ms=300)[0].reads[KEY] == [5]
    assert quotas.collect(5_999, settle_ms=300)[0].reads[KEY] == [5]
    assert quotas.collect(6_000, settle_ms=300)[0].reads[KEY] == [5, 6]
    assert quotas.collect(5_999)[0].reads[KEY] == [4, 5]  # no settle_ms: always both
    # What was read of the sample before stays in the others' counts when it is no longer read.
    other = SharedQuotas(CONFIG)
    sums = Sums()
    other.rate(KEY).record(700, 5_900)
    sums.sync(other, "b", 5_950)
    for now in (5_950, 6_050, 6_400):
        batch = quotas.collect(now, settle_ms=300)[0]
        sums.counts.setdefault((KEY, 5), {})["a"] = 100
        totals = {key: {s: sum(sums.counts.get((key, s), {}).values()) for s in wanted}
                  for key, wanted in batch.reads.items()}
        quotas.applied(batch, totals, False, now)
    assert quotas.rate(KEY).others == {5: 700}


def test_after_the_store_loses_everything_each_replica_writes_its_retained_samples_again() -> None:
    sums = Sums()
    a, b = SharedQuotas(CONFIG), SharedQuotas(CONFIG)
    ra, rb = a.rate(KEY), b.rate(KEY)
    for t in range(0, 5000, 100):
        ra.record(100, t)
        sums.sync(a, "a", t)
        sums.sync(b, "b", t)
    assert rb.others_rate(5000) > 0
    sums.lose_everything()
    sums.sync(a, "a", 5100)  # finds its marker gone: lost
    sums.sync(a, "a", 5200)  # writes everything retained again
    sums.sync(b, "b", 5200)
    assert sum(rb.others.values()) == 5000
    assert sum(sum(c.values()) for c in sums.counts.values()) == 5000


def test_degraded_share_is_the_replicas_recent_fraction_but_never_below_one_over_live() -> None:
    fleet = _run_replicas([750.0, 250.0], seconds=12)
    now = 12_000.0
    for q in fleet:
        q.live_replicas = 2
        q.degrade(now)
    hot, cold = fleet[0].rate(KEY), fleet[1].rate(KEY)
    assert hot.degraded is not None and hot.degraded.share == pytest.approx(0.75, abs=0.01)
    assert cold.degraded is not None and cold.degraded.share == pytest.approx(0.5)  # 1/N_live
    # The hot replica alone is now held to 0.75 of the quota: its own rate over its share.
    assert hot.measure(now) == Rate.measure(hot, now) / hot.degraded.share
    fleet[0].degrade(now, "closed")
    assert hot.degraded is not None and hot.degraded.share == 0.5
    fleet[0].degrade(now, "open")
    assert hot.degraded is not None and hot.degraded.share == 1.0
    fleet[0].recover()
    assert hot.degraded is None


def test_an_idle_rate_is_let_go_and_synced_again_when_it_records() -> None:
    sums = Sums()
    q = SharedQuotas(CONFIG)
    r = q.rate(KEY)
    r.record(100, 0)
    sums.sync(q, "a", 100)
    sums.sync(q, "a", 30_000)  # samples out of the window, nothing recorded: let go
    assert len(q) == 0 and not r.listed
    r.record(200, 30_100)
    assert len(q) == 1 and r.listed
    sums.sync(q, "a", 30_200)
    assert sums.counts[(KEY, 30)] == {"a": 200}


def test_a_shared_bucket_is_charged_with_the_others_spending() -> None:
    sums = Sums()
    a, b = SharedQuotas(CONFIG), SharedQuotas(CONFIG)
    key = sensor_key_text("mutation", "cluster", ("ControllerMutation", "u", ""))
    ba, bb = a.bucket(key, 10.0), b.bucket(key, 10.0)
    assert bb.tokens(0) == 110.0  # a burst of N * W * Q
    ba.record(60, 0)
    sums.sync(a, "a", 100)
    sums.sync(b, "b", 100)
    assert bb.tokens(100) == pytest.approx(110.0 - 60.0, abs=1.5)


def test_bucket_of_is_stable_and_spread() -> None:
    assert bucket_of("produce\x1fcluster\x1fProduce\x1falice\x1f", 16) == bucket_of(
        "produce\x1fcluster\x1fProduce\x1falice\x1f", 16)
    spread = {bucket_of(f"k{i}", 16) for i in range(200)}
    assert spread == set(range(16))


def test_shared_rate_is_a_rate() -> None:
    assert isinstance(SharedQuotas(CONFIG).rate(KEY), SharedRate)
    assert isinstance(SharedQuotas(CONFIG).rate(KEY), Rate)


def test_until_the_next_read_the_others_are_taken_to_go_on_in_their_recent_proportion() -> None:
    """Replicas running at once must not each admit all the headroom they saw: between reads, a
    replica counts its new bytes again for the others, as many times as they lately had its."""
    fleet = _run_replicas([300.0, 600.0], seconds=12)
    for q in fleet:
        q.live_replicas = 3  # a third one idle: the cap, N_live - 1, is 2
    sums = Sums()
    for i, q in enumerate(fleet):
        sums.sync(q, f"again{i}", 12_000)
    slow = fleet[0].rate(KEY)
    mine, total = slow.window_bytes(12_000.0)
    assert slow.ratio == (total - mine) / mine  # the other lately sent about twice its bytes
    assert 1.7 < slow.ratio < 2.0
    before = slow.others_rate(12_050.0)
    slow.record(1_000, 12_050.0)
    # 1,000 more of its own, so 2,000 more of the others' until the next read
    assert slow.others_rate(12_050.0) == pytest.approx(before + slow.ratio * 1_000 / 11.05, rel=0.01)
    assert 0.45 < fleet[1].rate(KEY).ratio < 0.6
    fleet[0].live_replicas = 2
    sums.sync(fleet[0], "again0", 12_100)
    assert slow.ratio == 1.0  # capped at N_live - 1


def test_until_its_first_read_a_new_stat_takes_each_live_replica_to_send_as_much_as_it_does() -> None:
    # A client that has just become busy on this replica, its tenant busy on 9 others a moment
    # ago: before the first read, counting the others as nothing admitted a sync interval's
    # worth at line speed. Each live replica is taken to send what this one does (its fair share).
    quotas = SharedQuotas(CONFIG)
    quotas.live_replicas = 10
    fresh = quotas.rate(KEY)
    assert fresh.ratio == 9.0
    fresh.record(100_000, 5_000.0)
    assert fresh.others_rate(5_000.0) == 9 * 100_000 / 10.0  # over (N-1) windows, as Kafka's min
    assert fresh.measure(5_000.0) == 10 * 100_000 / 10.0
    assert not fresh.surely_within(10 * 100_000 / 10.0 - 1, 5_000.0)
    Sums().sync(quotas, "r0", 5_050.0)  # the store: nobody else sent anything
    assert fresh.ratio == 0.0
    assert fresh.measure(5_050.0) == Rate.measure(fresh, 5_050.0)
    # Alone (N_live 1) there is nobody to take: Kafka's rate from the first byte.
    alone = SharedQuotas(CONFIG).rate(KEY)
    alone.record(100_000, 5_000.0)
    assert alone.ratio == 0.0 and alone.measure(5_000.0) == 100_000 / 10.0


def test_replicas_coming_back_to_an_idle_window_take_each_other_to_send_as_they_do() -> None:
    # Three replicas' clients sent for 2 s, then shared a throttle: 11.5 s later the window is
    # empty, the stats still kept. Taking the others to go on sending nothing (ratio 0) let each
    # take the whole window before the next read (10 replicas, 1 MiB fetches: up to 9x the quota).
    fleet = _run_replicas([300.0, 300.0, 300.0], seconds=1.99)
    sums = Sums()
    for q in fleet:
        q.live_replicas = 3
    for now in range(2_000, 13_501, 100):
        for i, q in enumerate(fleet):
            sums.sync(q, f"idle{i}", float(now))
    assert [q.rate(KEY).window_bytes(13_500.0) for q in fleet] == [(0, 0)] * 3
    assert [len(q) for q in fleet] == [1, 1, 1]
    assert [q.rate(KEY).ratio for q in fleet] == [2.0, 2.0, 2.0]
    # One that sent alone lately is alone: nothing predicted for the others.
    lone = _run_replicas([500.0, 0.0], seconds=12)
    for q in lone:
        q.live_replicas = 2
    sums = Sums()
    for i, q in enumerate(lone):
        sums.sync(q, f"lone{i}", 12_000)
    assert lone[0].rate(KEY).ratio == 0.0
    assert lone[1].rate(KEY).ratio == 1.0  # sent nothing: the other may send as it will


MIB = 1024 * 1024


class Draws:
    """A stand-in for the registry's random draws: the values given, in turn."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def _consumer_fleet(bps: list[float], live: int = 10,
                    seconds: int = 12) -> tuple[list[ClientQuotaManager], list[SharedQuotas], Sums]:
    """One fetch manager per replica under one 1 MiB/s consumer quota, each replica's client
    fetching at `bps` (0: connected, idle) for `seconds`, synced every 100 ms through the
    `Sums` returned."""
    fleet = [SharedQuotas(CONFIG, clock=StoreClock()) for _ in bps]
    quotas = QuotaStore({QuotaEntity(client_id="t"): {QuotaKey.CONSUMER_BYTE_RATE: MIB}})
    managers = [ClientQuotaManager(QuotaKey.CONSUMER_BYTE_RATE, quotas, CONFIG, LocalSensors(CONFIG),
                                   ScopedShared(q, "fetch", "cluster"))
                for q in fleet]
    for q in fleet:
        q.live_replicas = live
    for m in managers:
        m.record_no_throttle("", "t", 0, 0.0)
    sums = Sums()
    for now in range(100, seconds * 1000 + 1, 100):
        for m, rate in zip(managers, bps, strict=True):
            if rate:
                m.record_no_throttle("", "t", rate / 10, float(now))
        for i, q in enumerate(fleet):
            sums.sync(q, f"r{i}", float(now))
    return managers, fleet, sums


def _fetch_rate(quotas: SharedQuotas) -> SharedFetchRate:
    (rate,) = [s for s in quotas._stats.values() if isinstance(s, SharedFetchRate)]
    return rate


def test_a_consumer_quota_splits_the_headroom_by_the_replicas_fetching_not_by_their_bytes() -> None:
    # Replica 0's client was the one served; the clients of replicas 1 and 2 fetched too but were
    # refused, so the bytes show them as wanting nothing. By the bytes replica 0 took the whole
    # headroom while the others took their parts (3 replicas: 11 s windows of 2.1x).
    managers, fleet, sums = _consumer_fleet([MIB / 2, 0, 0], live=3)
    now = 12_000.0
    for m in managers[1:]:  # refused: recorded, then taken back, as the proxy does
        m.record_no_throttle("", "t", MIB, now)
        m.unrecord("", "t", MIB, now)
    for later in (now + 100, now + 200):  # replica 0 syncs first: it sees them the next time
        for i, q in enumerate(fleet):
            sums.sync(q, f"r{i}", later)
    rate = _fetch_rate(fleet[0])
    mine, total = rate.window_bytes(now + 200)
    assert mine == total > 0  # by the bytes, replica 0 is alone
    assert rate.ratio == 2.0  # by the fetching, it is one of three
    # An idle replica is not counted, and the count is capped at N_live - 1.
    assert _fetch_rate(_consumer_fleet([MIB / 2, 0, 0], live=3)[1][0]).ratio == 0.0
    _, capped, _ = _consumer_fleet([MIB / 4] * 4, live=3)
    assert _fetch_rate(capped[0]).ratio == 2.0


def test_a_fetch_over_the_quota_only_by_the_predicted_bytes_gets_its_part_of_the_headroom_by_chance() -> None:
    # Two replicas' clients fetched 0.25 MiB/s each for 12 s: the window holds about half the
    # quota, and each replica's part of the headroom until the next read is a half.
    managers, fleet, _ = _consumer_fleet([MIB / 4, MIB / 4], live=2)
    fetch, quotas = managers[0], fleet[0]
    rate = _fetch_rate(quotas)
    assert rate.ratio == 1.0
    now = 12_040.0  # the last read was at 12,000
    theirs, span_s = rate._others_in_window(now)
    own_before = Rate.measure(rate, now)
    size = 4 * MIB
    headroom = (MIB - own_before - theirs / span_s) * span_s - size  # after this fetch
    chance = 1 + (headroom - size) / (2 * size)  # its part of the headroom (a half) / its size
    assert 0.3 < chance < 0.9
    assert chance == pytest.approx((MIB - own_before - theirs / span_s) * span_s / 2 / size, rel=1e-9)
    quotas.rng = Draws(chance - 0.01)  # type: ignore[assignment]
    assert fetch.record_and_get_throttle_ms("", "t", size, now) == 0
    fetch.unrecord("", "t", size, now)
    # Refused by the draw: it waits for the next read (due at 12,100), not for a throttle worked
    # out from bytes that were only predicted.
    quotas.rng = Draws(chance + 0.01)  # type: ignore[assignment]
    assert fetch.record_and_get_throttle_ms("", "t", size, now) == 60
    fetch.unrecord("", "t", size, now)
    # One that fits in its part whole is delivered without a draw.
    quotas.rng = Draws()  # type: ignore[assignment]
    assert fetch.record_and_get_throttle_ms("", "t", MIB / 2, now) == 0


def test_on_average_the_replicas_take_the_headroom_once_not_once_each() -> None:
    # Ten replicas' clients fetch 1 MiB each at once, right after a read that left a few MiB of
    # headroom: each delivers with the chance of its tenth of it, so on average they take it
    # about once between them, not ten times (10 MiB).
    delivered = []
    headroom = 0.0
    for seed in range(40):
        managers, fleet, _ = _consumer_fleet([MIB * 0.078] * 10, live=10, seconds=12)
        if seed == 0:
            rate = _fetch_rate(fleet[0])
            theirs, span_s = rate._others_in_window(12_010.0)
            headroom = (MIB - Rate.measure(rate, 12_010.0) - theirs / span_s) * span_s
            assert 2 * MIB < headroom < 4 * MIB
        taken = 0
        for i, (m, q) in enumerate(zip(managers, fleet, strict=True)):
            q.rng = random.Random(seed * 100 + i)
            if m.record_and_get_throttle_ms("", "t", MIB, 12_010.0) == 0:
                taken += MIB
            else:
                m.unrecord("", "t", MIB, 12_010.0)
        delivered.append(taken)
    assert 0.7 * headroom < sum(delivered) / len(delivered) < 1.3 * headroom
    assert max(delivered) <= 7 * MIB


def test_a_fetch_over_the_quota_by_the_counted_bytes_alone_is_refused_as_on_kafka() -> None:
    managers, fleet, _ = _consumer_fleet([0, MIB], live=2)  # the other replica used the whole quota
    fetch, rate = managers[0], _fetch_rate(fleet[0])
    now = 12_010.0
    throttle = fetch.record_and_get_throttle_ms("", "t", 64 * 1024, now)
    theirs, span_s = rate._others_in_window(now)
    known = Rate.measure(rate, now) + theirs / span_s  # no predicted bytes in the throttle
    assert throttle == rate_throttle_time_ms(rate, known, MIB, now) > 0


def test_a_refused_fetch_waits_for_the_next_read() -> None:
    quotas = SharedQuotas(CONFIG)
    quotas.read_every_ms = 100.0
    assert quotas.until_next_read_ms(5_000.0) == 100  # never read: a whole interval
    quotas.read_ms = 5_000.0
    assert quotas.until_next_read_ms(5_000.0) == 100
    assert quotas.until_next_read_ms(5_030.5) == 70
    assert quotas.until_next_read_ms(5_099.5) == 100  # due within the ms: the next one
    assert quotas.until_next_read_ms(5_250.0) == 100  # late: another interval, not a retry at once


def test_a_degraded_share_is_the_replicas_part_over_the_last_reads_not_one_windows_swing() -> None:
    # Three replicas with even traffic in Kafka's burst-then-throttle rhythm: each sends 6,000
    # bytes in one second, then nothing for 11, a third of that apart. One window's part swings
    # with the bursts; enforcing it when the store failed put three replicas at 1.57x the quota.
    sums = Sums()
    fleet = [SharedQuotas(CONFIG) for _ in range(3)]
    for q in fleet:
        q.live_replicas = 3
    stats = [q.rate(KEY) for q in fleet]
    now = 0
    while now < 60_000:
        now += 10
        for i, stat in enumerate(stats):
            if (now - i * 4_000) % 12_000 < 1_000:
                stat.record(60, float(now))
        if now % 100 == 0:
            for i, q in enumerate(fleet):
                sums.sync(q, f"b{i}", float(now))
    window_parts = [m / t for m, t in (stat.window_bytes(60_000.0) for stat in stats)]
    assert sum(max(p, 1 / 3) for p in window_parts) > 1.2  # what one window's part gave
    for q in fleet:
        q.degrade(60_000.0)
    shares = [stat.degraded.share for stat in stats if stat.degraded is not None]
    assert len(shares) == 3 and sum(shares) < 1.06
    assert all(abs(s - 1 / 3) < 0.04 for s in shares)


def test_when_the_sync_moves_the_clock_counts_land_in_the_sample_of_the_new_offset() -> None:
    # The request path keeps the open sample's bounds in now_ms terms; the offset they were
    # worked out under moves when the sync reads the store's clock, and so must they.
    quotas = SharedQuotas(CONFIG, clock=StoreClock(offset_ms=0.0))
    rate = quotas.rate(KEY)
    rate.record(100, 5_500)  # sample 5
    quotas.clock.offset_ms = 700.0  # 5_600 is now 6_300 in the store's time
    quotas.clock_moved()
    rate.record(10, 5_600)
    rate.record(1, 5_650)
    assert rate.unsynced(0) == {5: 100, 6: 11}
    rate.record(1000, 6_300)  # 7_000: sample 7
    assert rate.unsynced(0) == {5: 100, 6: 11, 7: 1000}


# -- topic quotas through the store ------------------------------------------------------------------
#
# A topic quota's rate is a SharedRate of its own kind (`topic-produce`, `topic-fetch`), made by
# ScopedShared as the client quotas' are: two replicas' TopicQuotaManagers on one store hold the
# topic to one budget (docs/topic-quotas.md, "One budget"). Kafka's rate lets a topic held by
# refusals burst when its first burst's sample ages out, then refuses for most of a window, so
# what a topic is taken for is measured over four whole windows.

TOPIC_Q = 128 * 1024.0
STEADY_MS = (15_000, 59_000)  # four 11 s windows, after the first burst is paid back


def _topic_fleet(offered: list[dict[str, float]], scope: str = "cluster", shared: bool = True,
                 leadership: Leadership | None = None, seconds: int = 60) -> list[dict[str, float]]:
    """One replica per entry of `offered`, its clients offering {broker: bytes/s} of the topic
    "hot" (broker "" for scopes proxy and cluster), each 10 ms a Produce per broker, through
    `admit` as the Produce stage does (a refused request is dropped; a real client retries it,
    which here is the next tick's bytes). The replicas sync every 100 ms through one `Sums`.
    Returns what each replica took per broker over STEADY_MS, in bytes/s."""
    store = QuotaStore({QuotaEntity(topic="hot"): {QuotaKey.PRODUCER_BYTE_RATE: TOPIC_Q}})
    split = leadership or Leadership()
    fleet = [SharedQuotas(CONFIG, clock=StoreClock()) for _ in offered]
    for q in fleet:
        q.live_replicas = len(offered)

    def manager(q: SharedQuotas, broker: str) -> TopicQuotaManager:
        stats = ScopedShared(q, "topic-produce", broker or scope) if shared else None
        return TopicQuotaManager(QuotaKey.PRODUCER_BYTE_RATE, store, CONFIG, LocalSensors(CONFIG), split,
                                 broker or None, brokers=lambda: 2, stats=stats)

    managers = [{broker: manager(q, broker) for broker in wants}
                for q, wants in zip(fleet, offered, strict=True)]
    taken = [dict.fromkeys(wants, 0.0) for wants in offered]
    sums = Sums()
    for now in range(10, seconds * 1000 + 1, 10):
        for wants, ms, took in zip(offered, managers, taken, strict=True):
            for broker, bps in wants.items():
                size = bps / 100
                taken_now = ms[broker].admit("hot", size, float(now)).throttle_ms == 0
                if taken_now and STEADY_MS[0] <= now < STEADY_MS[1]:
                    took[broker] += size
        if shared and now % 100 == 0:
            for i, q in enumerate(fleet):
                sums.sync(q, f"r{i}", float(now))
    span_s = (STEADY_MS[1] - STEADY_MS[0]) / 1000
    return [{broker: b / span_s for broker, b in took.items()} for took in taken]


def test_two_replicas_sharing_a_store_hold_a_topic_to_one_budget_not_two() -> None:
    # Each replica's clients offer the hot topic 1.4 Q: on its own each replica holds it to Q, so
    # two take 2 Q; sharing one store, the two take Q between them.
    offered = [{"": 1.4 * TOPIC_Q}, {"": 1.4 * TOPIC_Q}]
    alone = sum(t[""] for t in _topic_fleet(offered, shared=False))
    together = _topic_fleet(offered)
    total = sum(t[""] for t in together)
    assert 1.85 * TOPIC_Q < alone <= 2.0 * TOPIC_Q  # Kafka's formula holds each a little under Q
    assert 0.8 * TOPIC_Q < total < 1.05 * TOPIC_Q
    assert all(t[""] > 0.3 * TOPIC_Q for t in together)  # neither replica's clients starved
    # Uneven: one replica's clients offer 2 Q, the other's 0.3 Q; still one budget.
    skewed = _topic_fleet([{"": 2.0 * TOPIC_Q}, {"": 0.3 * TOPIC_Q}])
    assert 0.8 * TOPIC_Q < sum(t[""] for t in skewed) < 1.05 * TOPIC_Q


def test_with_scope_broker_each_brokers_part_of_a_topic_is_held_across_replicas() -> None:
    # The draft's split, with the store: broker a leads 3 of the topic's 4 partitions, b one, so
    # a allows the topic 3/4 Q and b 1/4 Q, for every replica together (the store keys a topic's
    # rate by the upstream broker, as a client's in scope broker).
    a, b = "10.0.0.1:9092", "10.0.0.2:9092"
    leadership = Leadership()
    leadership.observe("hot", [a, a, a, b])
    offered = [{a: 1.4 * TOPIC_Q, b: 1.4 * TOPIC_Q}] * 2
    together = _topic_fleet(offered, scope="broker", leadership=leadership)
    at_a, at_b = (sum(t[broker] for t in together) for broker in (a, b))
    assert 0.8 * 0.75 * TOPIC_Q < at_a < 1.05 * 0.75 * TOPIC_Q
    assert 0.8 * 0.25 * TOPIC_Q < at_b < 1.05 * 0.25 * TOPIC_Q
    alone = _topic_fleet(offered, scope="broker", leadership=leadership, shared=False)
    assert sum(t[a] for t in alone) > 1.85 * 0.75 * TOPIC_Q


def test_a_topics_rate_is_stored_apart_from_a_client_of_the_same_name() -> None:
    # A topic named as a client-id (or a user) is another entity: its bytes never count for the
    # client's quota, nor the client's for the topic's, at any replica.
    q = SharedQuotas(CONFIG)
    topic = ScopedShared(q, "topic-produce", "cluster").rate(("TopicProduce", "app"))
    client = ScopedShared(q, "produce", "cluster").rate(("Produce", "", "app"))
    fetched = ScopedShared(q, "topic-fetch", "cluster").rate(("TopicFetch", "app"))
    assert len({id(topic), id(client), id(fetched)}) == 3
    assert isinstance(fetched, SharedRate) and not isinstance(fetched, SharedFetchRate)
    assert sorted(s.key.split("\x1f")[0] for s in q._stats.values()) == ["produce", "topic-fetch",
                                                                          "topic-produce"]


@pytest.mark.parametrize(("scope", "shared"), [("cluster", True), ("broker", True), ("proxy", False)])
def test_the_engine_shares_topic_quotas_in_scopes_broker_and_cluster_not_proxy(scope: str,
                                                                                shared: bool) -> None:
    # Scope proxy is each process's own budget, for topic quotas as for client quotas
    # (docs/cluster-quotas.md): only the workers of one --workers proxy share it.
    quotas = QuotaStore({QuotaEntity(topic="hot"): {QuotaKey.PRODUCER_BYTE_RATE: 1e9}})
    engines = [QuotaEngine(QuotaSettings(scope=scope), quotas, clock=lambda: 5_000, shared_buckets=4)
               for _ in range(2)]
    sums = Sums()
    broker = "10.0.0.1:9092"
    for i, engine in enumerate(engines):
        engine.leadership.observe("hot", [broker])
        topic_produce(engine.scope(broker)).admit("hot", 10_000 if i == 0 else 1, 5_000.0)
    for _ in range(2):  # the second round brings the second replica's bytes to the first
        for i, engine in enumerate(engines):
            assert engine.shared is not None
            sums.sync(engine.shared, f"r{i}", 5_000.0)
    seen = [topic_produce(e.scope(broker)).measure("hot", 5_000.0) for e in engines]
    assert seen == ([1_000.1, 1_000.1] if shared else [1_000.0, 0.1])


def test_replicas_pace_a_delivery_over_quota_at_their_part_of_it() -> None:
    """`SharedPacer.pace_ms` spaces a replica's deliveries at its part of the quota (its part of
    the fleet's bytes lately), so that replicas pacing the same client add up to the quota, not N
    times it; before its first read, an even part of the live replicas'; degraded, its degraded
    share."""
    fleet = _run_replicas([750.0, 250.0], seconds=30)
    hot, cold = SharedPacer.of(fleet[0].rate(KEY)), SharedPacer.of(fleet[1].rate(KEY))
    assert hot.quota_share() == pytest.approx(0.75, abs=0.01)
    assert cold.quota_share() == pytest.approx(0.25, abs=0.01)
    now = 30_000.0
    assert hot.pace_ms(300, 1000.0, now) == pytest.approx(300 / (1000.0 * hot.quota_share()) * 1000)
    assert cold.pace_ms(100, 1000.0, now) == pytest.approx(100 / (1000.0 * cold.quota_share()) * 1000)
    fresh = SharedQuotas(CONFIG, clock=StoreClock())
    fresh.live_replicas = 4
    assert SharedPacer.of(fresh.rate(KEY)).quota_share() == 0.25
    fleet[0].live_replicas = 2
    fleet[0].degrade(now, "closed")
    assert hot.quota_share() == 0.5
