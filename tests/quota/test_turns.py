"""Turns on a paced quota shared by a fleet (quota/turns.py): the claims a replica makes and
gives up, and what a `SharedPacer` (and a `SharedFetchRate`) does with the store's queue as read.
Fake clock throughout; the store's answers are given by hand (`Turns.answered`), as the sync
hands them over."""

from __future__ import annotations

from kafka_quota_proxy.quota.aligned import StoreClock
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.managers import ClientQuotaManager
from kafka_quota_proxy.quota.rate import MetricConfig
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.sensors import LocalSensors
from kafka_quota_proxy.quota.shared import ScopedShared, SharedQuotas, sensor_key_text
from kafka_quota_proxy.quota.shared_fetch import SharedFetchRate
from kafka_quota_proxy.quota.shared_pacer import SharedPacer
from kafka_quota_proxy.quota.shared_rate import SharedRate
from kafka_quota_proxy.quota.throttle import rate_throttle_time_ms
from kafka_quota_proxy.quota.turns import GRACE_READS, TURN_READS, Turns
from tests.quota.test_shared import Sums

CONFIG = MetricConfig(samples=11, window_ms=1000)  # (N-1) W = 10 s of first allowance
KEY = sensor_key_text("consume", "cluster", ("Fetch", "", "bulk"))
EVERY = 100.0  # the sync's interval
KEY_BULK = sensor_key_text("fetch", "cluster", ("Fetch", "", "bulk"))  # (as ScopedShared makes it)


# -- the claims -------------------------------------------------------------------------------------

def test_a_waiting_client_is_claimed_at_every_sync_until_its_wait_and_the_grace_are_over() -> None:
    t = Turns(EVERY)
    t.wait("k", 1_000)
    assert t.claims(900) == ([], ["k"])
    assert t.claims(1_000 + GRACE_READS * EVERY) == ([], ["k"])  # a client back a little late
    assert t.claims(1_001 + GRACE_READS * EVERY) == (["k"], [])  # gone: taken off the queue
    assert t.claims(1_500) == ([], [])
    assert len(t) == 0


def test_a_longer_wait_is_kept_and_a_shorter_one_does_not_cut_it() -> None:
    t = Turns(EVERY)
    t.wait("k", 5_000)
    t.wait("k", 1_000)
    assert t.claims(5_000) == ([], ["k"])


def test_only_a_claim_still_made_heads_a_queue() -> None:
    t = Turns(EVERY)
    t.wait("a", 1_000)
    t.answered({"a", "b"}, {"a"})  # b: a claim given up after this sync sent it
    assert (t.heads, t.crowded) == ({"a"}, {"a"})


def test_the_head_keeps_its_turn_while_nobody_else_waits() -> None:
    t = Turns(EVERY)
    t.wait("k", 0)
    t.answered({"k"}, set())
    t.paid("k", 0, 10_000)  # ten seconds of the quota, alone
    assert "k" in t.heads
    assert t.claims(10_000) == ([], ["k"])  # kept until the client is due again


def test_the_head_gives_its_turn_up_after_three_intervals_when_another_replica_waits() -> None:
    t = Turns(EVERY)
    t.wait("k", 0)
    t.answered({"k"}, {"k"})
    t.paid("k", 0, TURN_READS * EVERY - 1)  # short of a whole turn: kept
    assert "k" in t.heads
    t.paid("k", TURN_READS * EVERY - 1, TURN_READS * EVERY)
    assert "k" not in t.heads
    t.wait("k", 400)  # its client still waits: it asks again, at the back
    assert t.claims(350) == (["k"], ["k"])  # taken off first, then claimed anew
    assert t.claims(450) == ([], ["k"])


def test_a_turn_is_counted_from_where_its_first_request_was_paid() -> None:
    t = Turns(EVERY)
    t.wait("k", 0)
    t.answered({"k"}, {"k"})
    t.paid("k", 5_000, 5_100)
    t.paid("k", 5_100, 5_200)
    assert "k" in t.heads
    t.paid("k", 5_200, 5_000 + TURN_READS * EVERY)
    assert "k" not in t.heads


# -- a shared rate with turns -----------------------------------------------------------------------

def _replica(replicas: int = 3) -> SharedQuotas:
    quotas = SharedQuotas(CONFIG, clock=StoreClock())
    quotas.live_replicas = replicas
    quotas.read_every_ms = EVERY
    quotas.read_ms = 9_960.0
    quotas.turns = Turns(EVERY)
    return quotas


def test_a_due_replica_goes_when_its_claim_heads_the_queue_else_at_the_next_read() -> None:
    quotas = _replica()
    pacer = SharedPacer.of(quotas.rate(KEY))
    pacer.paced_at(1000.0)
    assert pacer.admit_wait_ms(10_000) == 60  # due, not yet at the head: at the next read
    assert quotas.turns is not None and quotas.turns.claims(10_000) == ([], [KEY])
    quotas.turns.answered({KEY}, {KEY})
    assert pacer.admit_wait_ms(10_000) < 0  # at the head: now


def test_the_head_paces_its_bytes_at_the_whole_quota() -> None:
    """No guess of the others' bytes: they wait for their turn. Without turns, 3 replicas'
    `ratio` of 2 would pace these 1000 B over 3 s."""
    quotas = _replica()
    rate = quotas.rate(KEY)
    assert rate.ratio == 2.0
    assert quotas.turns is not None
    quotas.turns.answered({KEY}, set())
    rate.record(1000, 20_000)
    # From 20,000 less its part of the credit, (N-1) W / 3: paid 1 s later.
    assert SharedPacer.of(rate).pace(1000, 1000.0, 20_000) == 20_000 - 10_000 / 3 + 1000


def test_a_replica_told_its_quota_paces_the_others_bytes_before_its_own_first_pace() -> None:
    """A replica whose client waits for its first turn paces the others' bytes from its first
    read on; not told (`paced_at`), it knew no quota to pace them at until its own first bytes,
    and let its client in as if the fleet had sent nothing."""
    a, b, c = _replica(2), _replica(2), _replica(2)
    sums = Sums()
    ra = a.rate(KEY)
    pa, pb, pc = SharedPacer.of(ra), SharedPacer.of(b.rate(KEY)), SharedPacer.of(c.rate(KEY))
    ra.record(2000, 20_000)
    pa.pace(2000, 1000.0, 20_000)
    sums.sync(a, "a", 20_050)
    pb.paced_at(1000.0)
    pb.admit_wait_ms(20_100)  # the clients wait: their stats are read at the next sync
    pc.admit_wait_ms(20_100)
    sums.sync(b, "b", 20_100)
    sums.sync(c, "c", 20_100)
    # a's 2000 B paced from the read less b's credit, (N-1) W / 2: 20,100 - 5000 + 2000.
    assert pb.paced_wait_ms(20_100) == 17_100 - 20_100
    assert pc.paced_wait_ms(20_100) == float("-inf")


def test_a_stat_let_go_while_its_client_was_muted_is_read_again_when_the_client_waits() -> None:
    quotas = _replica()
    sums = Sums()
    rate = quotas.rate(KEY)
    rate.record(1000, 10_000)
    for t in (10_000, 30_000, 40_000):  # idle for longer than the retained samples: let go
        sums.sync(quotas, "r", t)
    assert not rate.listed and len(quotas) == 0
    SharedPacer.of(rate).admit_wait_ms(40_000)
    assert rate.listed and len(quotas) == 1


def test_a_degraded_replica_does_not_wait_for_a_turn() -> None:
    quotas = _replica()
    pacer = SharedPacer.of(quotas.rate(KEY))
    quotas.degrade(0.0, "closed")
    assert pacer.admit_wait_ms(10_000) < 0
    assert quotas.turns is not None and len(quotas.turns) == 0


def test_a_clients_first_request_makes_its_sensor_and_tells_it_the_quota() -> None:
    """So that a fleet's replicas ask for a turn for their first request too, and pace the
    others' bytes from their first read (each of 10 replicas let its first 2 MB in at once)."""
    quotas = _replica()
    store = QuotaStore({QuotaEntity(client_id="bulk"): {QuotaKey.CONSUMER_BYTE_RATE: 1000.0}})
    m = ClientQuotaManager(QuotaKey.CONSUMER_BYTE_RATE, store, CONFIG, LocalSensors(CONFIG),
                           stats=_Stats(quotas))
    assert m.paced_wait_ms("", "bulk", 10_000) == 0  # not about to be read: nothing made
    assert len(quotas) == 0
    assert m.paced_wait_ms("", "bulk", 10_000, admit=True) == 60  # at the next read
    assert len(quotas) == 1
    assert m.paced_wait_ms("", "other", 10_000, admit=True) == 0  # no quota: nothing made
    assert len(quotas) == 1


class _Stats:
    """The manager's stat factory, making the replica's shared rates."""

    def __init__(self, quotas: SharedQuotas) -> None:
        self.quotas = quotas

    def rate(self, key: object) -> object:
        return self.quotas.rate(sensor_key_text("consume", "cluster", key))

    def pacer(self, rate: SharedRate) -> SharedPacer:
        return SharedPacer.of(rate)


# -- Kafka's rule on a fleet: fetches take turns -----------------------------------------------------

def test_a_muted_client_is_claimed_a_read_and_a_half_before_it_is_back() -> None:
    """So that the claims queue in the order the clients come back, and a muted client holds
    no turn meanwhile."""
    t = Turns(EVERY)
    t.due("k", 2_000)
    t.due("k", 1_000)  # the earlier one counts
    t.due("k", 1_500)
    assert t.claims(849) == ([], [])
    assert t.claims(850) == ([], ["k"])  # 1,000 - 1.5 x 100
    assert t.claims(1_000 + GRACE_READS * EVERY) == ([], ["k"])
    assert t.claims(1_001 + GRACE_READS * EVERY) == (["k"], [])


def test_a_claim_due_again_before_the_sync_is_not_taken_off() -> None:
    t = Turns(EVERY)
    t.wait("k", 0)
    t.leave("k")
    t.due("k", 100)
    assert t.claims(0) == ([], ["k"])


def _fetches(replicas: int = 3) -> tuple[ClientQuotaManager, SharedQuotas]:
    """A replica's fetch manager under a 1,000 B/s consumer quota for client-id `bulk`, its
    store keeping turns, its last read at 9,960 ms."""
    quotas = _replica(replicas)
    store = QuotaStore({QuotaEntity(client_id="bulk"): {QuotaKey.CONSUMER_BYTE_RATE: 1000.0}})
    return ClientQuotaManager(QuotaKey.CONSUMER_BYTE_RATE, store, CONFIG, LocalSensors(CONFIG),
                              ScopedShared(quotas, "fetch", "cluster")), quotas


def _fetch_rate(quotas: SharedQuotas) -> SharedFetchRate:
    (rate,) = [s for s in quotas._stats.values() if isinstance(s, SharedFetchRate)]
    return rate


def test_a_fetch_takes_turns_only_on_a_fleet_whose_store_keeps_them() -> None:
    fetch, quotas = _fetches()
    fetch.record_no_throttle("", "bulk", 0, 10_000)
    rate = _fetch_rate(quotas)
    assert rate.takes_turns()
    quotas.live_replicas = 1  # alone: Kafka's rule as on one broker
    assert not rate.takes_turns()
    quotas.live_replicas = 3
    quotas.degrade(0.0, "closed")  # the store out of reach: its share of the quota
    assert not rate.takes_turns()
    alone_quotas = SharedQuotas(CONFIG, clock=StoreClock())
    alone_quotas.live_replicas = 3
    assert alone_quotas.turns is None
    assert not alone_quotas.fetch_rate("k", "p").takes_turns()


def test_a_fetch_within_the_quota_is_delivered_where_the_replica_heads_the_queue() -> None:
    fetch, quotas = _fetches()
    turns = quotas.turns
    assert turns is not None
    # Not at the head: refused until the next read (due at 10,060), and a turn asked for.
    assert fetch.record_and_get_throttle_ms("", "bulk", 200, 10_000) == 60
    fetch.unrecord("", "bulk", 200, 10_000)
    assert turns.claims(10_060) == ([], [KEY_BULK])
    turns.answered({KEY_BULK}, {KEY_BULK})
    # At the head: delivered, and the turn kept while it is short of three sync intervals.
    assert fetch.record_and_get_throttle_ms("", "bulk", 200, 10_060) == 0
    assert KEY_BULK in turns.heads
    # A fetch of three sync intervals of the quota or more hands the turn on.
    assert fetch.record_and_get_throttle_ms("", "bulk", 300, 10_070) == 0
    assert KEY_BULK not in turns.heads
    assert turns.claims(10_160) == ([KEY_BULK], [])


def test_a_fetch_over_the_quota_on_what_is_known_gets_kafkas_throttle_and_claims_before_it_ends() -> None:
    fetch, quotas = _fetches()
    turns = quotas.turns
    assert turns is not None
    turns.wait(KEY_BULK, 10_000)
    turns.answered({KEY_BULK}, set())
    assert fetch.record_and_get_throttle_ms("", "bulk", 10_000, 10_000) == 0  # its first allowance
    rate = _fetch_rate(quotas)
    now = 10_500.0
    fetch.record_no_throttle("", "bulk", 0, now)  # (the stat's clock at `now`)
    rate.record(2_000, now)
    expected = rate_throttle_time_ms(rate, rate.measure(now), 1000.0, now)
    rate.record(-2_000, now)
    throttle = fetch.record_and_get_throttle_ms("", "bulk", 2_000, now)
    assert throttle == expected > 2 * EVERY
    # Muted for longer than two reads: the turn is handed on, and asked for again a read and a
    # half before the client is back.
    assert KEY_BULK not in turns.heads
    assert turns.claims(now + throttle - 151) == ([KEY_BULK], [])
    assert turns.claims(now + throttle - 150) == ([], [KEY_BULK])
