"""`quota.byte_rate_enforcement: paced` on a fake clock: `Pacer.pace` (a virtual scheduling token
bucket after Kafka's first allowance), the ShareFetch deliveries' `Pacer.pace_ms`, the managers'
paced throttle and wait, and a pace shared by replicas (`SharedPacer`): every replica's pace
counts the fleet's bytes."""

from __future__ import annotations

import math

import pytest

from kafka_quota_proxy.quota.aligned import StoreClock
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.managers import ClientQuotaManager
from kafka_quota_proxy.quota.pacer import Pacer
from kafka_quota_proxy.quota.rate import MetricConfig, Rate
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.sensors import LocalSensors
from kafka_quota_proxy.quota.shared import ScopedShared, SharedQuotas, sensor_key_text
from kafka_quota_proxy.quota.shared_pacer import SharedPacer
from tests.quota.test_shared import Sums

CONFIG = MetricConfig(samples=11, window_ms=1000)  # Kafka's: (N-1) W = 10 s of first allowance
KEY = sensor_key_text("produce", "cluster", ("Produce", "", "bulk"))
P = QuotaKey.PRODUCER_BYTE_RATE


def test_a_fresh_client_gets_kafkas_first_allowance_then_is_paced_at_the_quota() -> None:
    r = Pacer(CONFIG)
    assert r.paced_wait_ms(50_000) < 0  # never paced: let in at once
    # 10 s of quota at once: paid for from 40,000 (now less the credit) to 50,000.
    assert r.pace(10_000, 1000.0, 50_000) == 50_000
    assert r.paced_wait_ms(50_000) == 0
    assert r.pace(500, 1000.0, 50_000) == 50_500  # 500 B at 1000 B/s
    assert r.paced_wait_ms(50_100) == 400
    # Let in 200 ms after its turn (a round trip): paced from its turn, not from now.
    assert r.pace(500, 1000.0, 50_700) == 51_000
    # At the quota it is given now: 500 B at 2000 B/s.
    assert r.pace(500, 2000.0, 51_000) == 51_250
    # Idle for a while: the credit comes back, but never more than (N-1) W of it.
    assert r.pace(1000, 1000.0, 100_000) == 91_000
    assert r.paced_wait_ms(100_000) == -9_000
    # Kafka's own rate is a stat of its own beside the pace, measured as ever.
    rate = Rate(CONFIG)
    rate.record(10_000, 0)
    assert rate.measure(0) == 1000.0


def test_pace_ms_spaces_deliveries_at_the_quota_from_the_last_paced_time() -> None:
    r = Pacer(CONFIG)
    assert r.quota_share() == 1.0
    assert r.pace_ms(500, 1000.0, 10_000) == 500  # 500 B at 1000 B/s
    assert r.pace_ms(500, 1000.0, 10_100) == 900  # spaced after the first: paced until 11,000
    assert r.pace_ms(250, 1000.0, 11_999) == 250 - 999  # up to W late: still from 11,000
    assert r.pace_ms(250, 1000.0, 12_250) == 250  # a whole W after 11,250: starts anew
    assert r.pace_ms(2000, 4000.0, 12_400) == 100 + 500  # at the bound given, 4000 B/s
    assert r.paced_wait_ms(12_400) < 0  # the deliveries' pace is not `pace`'s


@pytest.mark.parametrize("connections", [1, 3, 10])
def test_connections_of_one_client_together_get_the_quota_after_the_allowance(connections: int) -> None:
    """Each connection sends a 100 KB request as soon as its turn has come (a request read
    before waits for it, QuotaCharge.hold_ms), and the next 1 ms after: whatever the number of
    connections, 60 s let in Kafka's allowance (10 s of quota) and 60 s of quota, to one request."""
    r = Pacer(CONFIG)
    quota, size = 100_000.0, 100_000
    next_try = [0] * connections
    admitted = 0
    while True:
        i = min(range(connections), key=lambda c: next_try[c])
        now = next_try[i]
        if now > 60_000:
            break
        wait = r.paced_wait_ms(now)
        if wait > 0:
            next_try[i] = now + math.ceil(wait)
            continue
        r.pace(size, quota, now)
        admitted += size
        next_try[i] = now + 1
    assert 70 * quota <= admitted <= 70 * quota + size


def test_the_paced_throttle_is_the_time_to_the_clients_next_turn() -> None:
    m = ClientQuotaManager(P, QuotaStore({QuotaEntity(client_id="c"): {P: 1000.0}}), CONFIG,
                           LocalSensors(CONFIG))
    assert m.paced_wait_ms("u", "c", 50_000) == 0  # no sensor yet: nothing to wait for
    # Kafka would throttle 10,500 B over a fresh 10 s window by 500 ms; paced, the first 10 s
    # of quota come at once and the rest at the quota.
    assert m.record_and_get_throttle_ms("u", "c", 10_000, 50_000, paced=True) == 0
    assert m.record_and_get_throttle_ms("u", "c", 500, 50_000, paced=True) == 500
    assert m.paced_wait_ms("u", "c", 50_100) == 400
    assert m.paced_wait_ms("u", "c", 50_100, admit=True) == 400
    assert m.measure("u", "c", 50_000) == 1050.0  # Kafka's rate, for the metrics
    # No quota for this client: measured, never paced.
    assert m.record_and_get_throttle_ms("u", "other", 10**9, 50_000, paced=True) == 0
    assert m.paced_wait_ms("u", "other", 50_000) == 0
    # Kafka's throttle where not paced, from the same sensor.
    assert m.record_and_get_throttle_ms("u", "c", 500, 50_000) == 1000


def test_a_sensors_pacer_is_made_beside_its_rate_the_first_time_it_is_paced() -> None:
    sensors = LocalSensors(CONFIG)
    m = ClientQuotaManager(P, QuotaStore({QuotaEntity(client_id="c"): {P: 1000.0}}), CONFIG, sensors)
    m.record_and_get_throttle_ms("u", "c", 10_000, 50_000)
    handle = sensors.found(("Produce", "", "c"), 50_000)
    assert handle is not None and handle.pacer is None  # Kafka's throttle: nothing paced
    m.record_and_get_throttle_ms("u", "c", 500, 50_000, paced=True)
    assert type(handle.pacer) is Pacer and handle.pacer.paced_wait_ms(50_000) == -9_500
    assert isinstance(handle.stat, Rate) and handle.stat.measure(50_000) == 1050.0


def test_a_shared_rates_pacer_lives_as_long_as_the_shared_stat() -> None:
    """The store's reads re-make a shared rate's pace: a sensor expired and made again finds the
    shared stat, and with it its pacer, as it was."""
    (quotas,) = _fleet(1)
    stats = ScopedShared(quotas, "produce", "cluster")
    rate = stats.rate(("Produce", "", "bulk"))
    pacer = stats.pacer(rate)
    assert isinstance(pacer, SharedPacer) and rate.pacer is pacer
    assert stats.pacer(stats.rate(("Produce", "", "bulk"))) is pacer


def _fleet(replicas: int) -> list[SharedQuotas]:
    fleet = []
    for _ in range(replicas):
        quotas = SharedQuotas(CONFIG, clock=StoreClock())
        quotas.live_replicas = replicas
        fleet.append(quotas)
    return fleet


def test_every_replicas_pace_counts_the_fleets_bytes() -> None:
    """Two replicas, credit (N-1) W / 2 = 5 s each. Until a read each takes the other to send as
    much as it does (`ratio` 1 for a new stat): its own bytes are paced at half the quota. The
    read puts the other's real bytes in place of that guess, and both end at the fleet's pace:
    3000 B let in with 5 s of credit, paid for 2 s before now."""
    a, b = _fleet(2)
    sums = Sums()
    now = 20_500.0
    ra, rb = a.rate(KEY), b.rate(KEY)
    pa, pb = SharedPacer.of(ra), SharedPacer.of(rb)
    ra.record(2000, now)
    # Own 2000 B at half of 1000 B/s from now - 5000: 4 s; told its turn is 3 s before now.
    assert pa.pace(2000, 1000.0, now) == now - 3000
    assert pa.paced_wait_ms(now) == -1000
    rb.record(1000, now)
    assert pb.pace(1000, 1000.0, now) == now - 4000
    sums.sync(a, "a", now)  # a reads only its own bytes
    sums.sync(b, "b", now)  # b reads a's 2000 B in place of the 1000 B it guessed
    assert pb.paced_wait_ms(now) == -2000
    sums.sync(a, "a", now)  # a reads b's 1000 B in place of the 2000 B it guessed
    assert pa.paced_wait_ms(now) == -2000


def test_a_replica_read_for_the_first_time_paces_the_others_past_bytes_where_they_fell() -> None:
    """A replica whose client comes along while another has been sending at the quota for a
    while learns, at its first read, where the fleet's pace is: the others' bytes of each past
    aligned sample are paced where that sample ended, so what is older than the credit is paid
    for, and only the last sample's bytes weigh on now."""
    busy, fresh = _fleet(2)
    sums = Sums()
    rate = busy.rate(KEY)
    pacer = SharedPacer.of(rate)
    for t in range(10_000, 30_000, 100):  # 100 B every 100 ms: at the quota of 1000 B/s
        rate.record(100, t)
        pacer.pace(100, 1000.0, t)
        sums.sync(busy, "busy", t)
    now = 30_050.0
    newcomer_rate = fresh.rate(KEY)
    newcomer = SharedPacer.of(newcomer_rate)
    newcomer_rate.record(100, now)
    newcomer.pace(100, 1000.0, now)
    sums.sync(fresh, "fresh", now)
    # The other's 1000 B of each second: paid for one after the other from where each second
    # ended less the credit (5 s), so that the last ends at 30,000 - 5000 + 1000 = 26,000; then
    # its own 100 B: 3.95 s of credit left. (The busy replica, which never used its credit, has
    # all 5 s of it: a little more, as it knows when within the last second its bytes came.)
    assert newcomer.paced_wait_ms(now) == 26_100 - now == -3950
    assert pacer.paced_wait_ms(now) == -5050


class Draw:
    """A stand-in for `SharedQuotas.rng`: every draw gives `value`."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_a_due_replica_takes_its_turn_with_the_chance_of_its_part() -> None:
    """Due at once on every replica, each would let a request in before it sees the others' at
    its next read: a due replica goes now with the chance 1 / (1 + ratio), else at that read."""
    (quotas,) = _fleet(1)
    quotas.live_replicas = 4
    rate = quotas.rate(KEY)  # a new stat: ratio 3, the others taken to send as much as it does
    quotas.read_every_ms = 100.0
    quotas.read_ms = 9_960.0
    assert rate.ratio == 3.0
    pacer = SharedPacer.of(rate)
    quotas.rng = Draw(0.2)  # type: ignore[assignment]
    assert pacer.admit_wait_ms(10_000) < 0  # 0.2 < 1/4: now
    quotas.rng = Draw(0.3)  # type: ignore[assignment]
    assert pacer.admit_wait_ms(10_000) == 60  # at the next read
    assert pacer.paced_wait_ms(10_000) < 0  # a fetch's answer is judged without the chance
    pacer.pace(4000, 1000.0, 10_000)  # its own bytes at 1/4 of the quota: 16 s
    assert pacer.admit_wait_ms(10_000) == pacer.paced_wait_ms(10_000) == 16_000 - 10_000 / 4


def test_a_degraded_replica_paces_its_own_bytes_at_its_share() -> None:
    (quotas,) = _fleet(1)
    quotas.live_replicas = 2
    pacer = SharedPacer.of(quotas.rate(KEY))
    quotas.degrade(0.0, "closed")  # half of the quota each
    pacer.pace(1000, 1000.0, 50_000)
    assert pacer.paced_wait_ms(50_000) == -5_000 + 2_000
