"""The what-if replay (no Spark): Kafka's throttle numbers by hand, the demand model, Fetch's
un-record and retry, shared sensors, and the fast paths giving exactly the slow path's results."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from kafka_quota_proxy.analytics.generate import hour_lines, make_plan
from kafka_quota_proxy.analytics.replay import demand_bytes, replay_unit, spread
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.rate import MetricConfig

P = QuotaKey.PRODUCER_BYTE_RATE
F = QuotaKey.CONSUMER_BYTE_RATE
NAN = math.nan
KAFKA = MetricConfig()  # N = 11, W = 1 s
OUTCOME = ["demand_bytes", "sent_bytes", "throttle_ms", "throttled_requests", "delayed_bytes",
           "backlog_bytes"]


def rows(*records: tuple[str, str, int, int, int, int, int, float | None]) -> pd.DataFrame:
    """(user, client_id, start_ms, interval_s, bytes, requests, throttle_ms, recorded quota)"""
    return pd.DataFrame(records, columns=["user", "client_id", "start_ms", "interval_s", "bytes", "requests",
                                          "throttle_ms", "recorded_quota"])


def outcome(frame: pd.DataFrame) -> dict[str, int]:
    assert len(frame) == 1
    return {k: int(frame[k].iloc[0]) for k in OUTCOME}


def test_one_request_over_a_fresh_window_gets_kafkas_throttle() -> None:
    # Reference 11.1: 6000 B at t0, Q = 500 B/s: 6000 / 10 s = 600, (600 - 500) / 500 * 10000 = 2000 ms.
    log = rows(("alice", "app", 0, 10, 6000, 1, 0, NAN))
    out = replay_unit(log, "produce", {QuotaEntity(user="alice"): {P: 500.0}}, KAFKA, 10_000)
    assert outcome(out) == {"demand_bytes": 6000, "sent_bytes": 6000, "throttle_ms": 2000,
                            "throttled_requests": 1, "delayed_bytes": 0, "backlog_bytes": 0}


@pytest.mark.parametrize("samples, quota, throttle, throttled", [
    # N = 11: 2000, then 11000 B over 10 s = 1100: (1100 - 500) / 500 * 10000 = 12000.
    (11, 500.0, 14000, 2),
    # Q = 600: 600 is not over; then (1100 - 600) / 600 * 10000 = 8333.3 -> 8333.
    (11, 600.0, 8333, 1),
    # N = 6: the fresh window is 5 s: 1200 -> 7000; at 10 s the first sample is purged:
    # 5000 / 5 s = 1000 -> (1000 - 500) / 500 * 5000 = 5000.
    (6, 500.0, 12000, 2),
    # N = 6, Q = 600: (1200 - 600) / 600 * 5000 = 5000, then (1000 - 600) / 600 * 5000 = 3333.3.
    (6, 600.0, 8333, 2),
])
def test_two_intervals_follow_the_throttle_formula(samples: int, quota: float, throttle: int,
                                                   throttled: int) -> None:
    log = rows(("alice", "app", 0, 10, 6000, 1, 0, NAN), ("alice", "app", 10_000, 10, 5000, 1, 0, NAN))
    out = replay_unit(log, "produce", {QuotaEntity(user="alice"): {P: quota}}, MetricConfig(samples, 1000),
                      20_000)
    assert outcome(out) == {"demand_bytes": 11000, "sent_bytes": 11000, "throttle_ms": throttle,
                            "throttled_requests": throttled, "delayed_bytes": 0, "backlog_bytes": 0}


def test_the_recorded_throttle_adds_to_demand_and_waits_carry_over() -> None:
    # Demand = 10000 + 5000 ms * 1000 B/s = 15000, in 10 requests of 1500 B at 0, 1, ..., 9 s,
    # under the recorded quota of 1000 B/s. Seven go out: 10500 / 10 s = 1050 -> 500 ms at 6 s.
    # At 7 s: 12000 -> 1200 -> 2000 ms; at 9 s: 13500 -> 1350 -> 3500 ms, mute until 12.5 s: the
    # last request (due at 9 s) is still waiting at the end (10 s). The eighth went out on time,
    # the ninth (due 8 s) at 9 s.
    log = rows(("u", "c", 0, 10, 10000, 10, 5000, 1000.0))
    out = replay_unit(log, "produce", None, KAFKA, 10_000)
    assert outcome(out) == {"demand_bytes": 15000, "sent_bytes": 13500, "throttle_ms": 6000,
                            "throttled_requests": 3, "delayed_bytes": 1500, "backlog_bytes": 1500}
    assert int(out["recorded_throttle_ms"].iloc[0]) == 5000
    assert out["quota"].iloc[0] == 1000.0


def test_a_fetch_over_quota_is_taken_back_and_asked_again() -> None:
    # Q = 500 B/s: a fetch carries at most Q * W = 500 B, so 6000 B is 12 fetches at t0. Ten fit
    # (5000 / 10 s = 500, not over); the eleventh makes 550: 1000 ms, un-recorded. Each retry, a
    # second later, measures the same 550 until the first sample is purged at 11 s: 11 throttles.
    # Then the last two go out, both late.
    log = rows(("u", "c", 0, 10, 6000, 1, 0, NAN))
    quotas = {QuotaEntity(client_id=DEFAULT): {F: 500.0}}
    assert outcome(replay_unit(log, "fetch", quotas, KAFKA, 30_000)) == {
        "demand_bytes": 6000, "sent_bytes": 6000, "throttle_ms": 11000, "throttled_requests": 11,
        "delayed_bytes": 1000, "backlog_bytes": 0}
    # The same log ending at 10 s: the retry due at 10 s has not gone out.
    assert outcome(replay_unit(log, "fetch", quotas, KAFKA, 10_000)) == {
        "demand_bytes": 6000, "sent_bytes": 5000, "throttle_ms": 10000, "throttled_requests": 10,
        "delayed_bytes": 0, "backlog_bytes": 1000}


def test_produce_is_charged_even_when_it_throttles() -> None:
    # The same 6000 B as Produce: all charged at t0, one throttle of (6000/10 - 500)/500 * 10 s.
    log = rows(("u", "c", 0, 10, 6000, 1, 0, NAN))
    out = replay_unit(log, "produce", {QuotaEntity(client_id=DEFAULT): {P: 500.0}}, KAFKA, 10_000)
    assert outcome(out)["throttle_ms"] == 2000
    assert outcome(out)["sent_bytes"] == 6000


def test_clients_sharing_a_user_quota_share_its_sensor() -> None:
    # KIP-55: with only a user quota, alice's clients are measured together: 6000 + 6000 B over
    # 10 s = 1200 > 1000 -> the second request (b's) gets (1200 - 1000) / 1000 * 10000 = 2000 ms.
    log = rows(("alice", "a", 0, 10, 6000, 1, 0, NAN), ("alice", "b", 0, 10, 6000, 1, 0, NAN))
    shared = replay_unit(log, "produce", {QuotaEntity(user="alice"): {P: 1000.0}}, KAFKA, 10_000)
    assert dict(zip(shared["client_id"], shared["throttle_ms"], strict=True)) == {"a": 0, "b": 2000}
    # With a user + <default> client-id quota each client has its own sensor: 600 each, no throttle.
    apart = replay_unit(log, "produce", {QuotaEntity(user="alice", client_id=DEFAULT): {P: 1000.0}}, KAFKA,
                        10_000)
    assert dict(zip(apart["client_id"], apart["throttle_ms"], strict=True)) == {"a": 0, "b": 0}


def test_a_tenant_demanding_twice_its_quota_gets_exactly_its_quota_through() -> None:
    # 2000 B/s against 1000 B/s for 1000 s, in 10 requests per 10 s interval. Kafka's throttle
    # makes each window average Q (O * W / (W + X) = Q), so what goes out is Q per second plus at
    # most the first window's allowance, Q * (N-1) * W; the other half waits (backlog), and after
    # its first window the client is muted almost all the time.
    seconds, quota = 1000, 1000.0
    log = rows(*(("u", "c", k * 10_000, 10, 20_000, 10, 0, NAN) for k in range(seconds // 10)))
    out = outcome(replay_unit(log, "produce", {QuotaEntity(client_id=DEFAULT): {P: quota}}, KAFKA,
                              seconds * 1000))
    allowance = quota * (KAFKA.samples - 1) * KAFKA.window_s
    request = 2000  # the one that takes the client over is charged and sent too
    assert out["demand_bytes"] == 2 * quota * seconds
    assert quota * seconds <= out["sent_bytes"] <= quota * seconds + allowance
    assert out["backlog_bytes"] == out["demand_bytes"] - out["sent_bytes"]
    assert out["sent_bytes"] - allowance - request <= out["delayed_bytes"] <= out["sent_bytes"]
    assert (seconds - 10) * 1000 <= out["throttle_ms"] <= seconds * 1000


def test_no_quota_means_no_simulation_and_no_throttle() -> None:
    log = rows(("u", "c", 0, 10, 10**9, 10, 0, NAN))
    out = replay_unit(log, "produce", {QuotaEntity(client_id="other"): {P: 1.0}}, KAFKA, 10_000)
    assert outcome(out) == {"demand_bytes": 10**9, "sent_bytes": 10**9, "throttle_ms": 0,
                            "throttled_requests": 0, "delayed_bytes": 0, "backlog_bytes": 0}
    assert int(out["skipped_intervals"].iloc[0]) == 1
    assert math.isnan(out["quota"].iloc[0])


def test_quotas_read_straight_from_json_may_be_none() -> None:
    log = rows(("u", "c", 0, 10, 6000, 1, 0, None), ("u", "c", 10_000, 10, 6000, 1, 0, 500.0))
    # No quota in the first interval: nothing measured; then 6000 B over a fresh window: 2000 ms.
    assert outcome(replay_unit(log, "produce", None, KAFKA, 20_000))["throttle_ms"] == 2000


def test_demand_model_reads_the_throttle_backwards() -> None:
    got = demand_bytes(np.array([100, 100, 0]), np.array([0, 2500, 1000]), np.array([NAN, 1000.0, 500.0]))
    assert got.tolist() == [100, 2600, 500]


def test_spread_sends_evenly_at_most_ten_requests_never_more_than_bytes() -> None:
    due, size, row = spread(np.array([0, 60_000, 120_000]), np.array([60_000] * 3), np.array([1003, 3, 0]),
                            np.array([25, 7, 4]))
    assert due.tolist() == [k * 6000 for k in range(10)] + [60_000, 80_000, 100_000]
    assert size.tolist() == [101, 101, 101] + [100] * 7 + [1, 1, 1]
    assert row.tolist() == [0] * 10 + [1] * 3


def test_fast_paths_are_exact_when_the_recorded_quota_comes_and_goes() -> None:
    # The manager measures (and so purges the samples) only while a bound applies, and direct
    # recording does the same; intervals without a quota, between ones near it, change nothing.
    records = []
    for k in range(400):
        quota = NAN if k % 7 in (3, 4) else 1000.0
        demand = 2000 + (k * 7919) % 9000  # 0.2 to 1.1 times the quota over 10 s
        records.append(("u", "c", k * 10_000, 10, demand, 1 + k % 12, 0, quota))
    log = rows(*records)
    fast = replay_unit(log, "produce", None, KAFKA, 4_000_000, fast=True)
    slow = replay_unit(log, "produce", None, KAFKA, 4_000_000, fast=False)
    pd.testing.assert_frame_equal(fast[OUTCOME], slow[OUTCOME])
    assert int(fast["fast_intervals"].iloc[0]) > 0 and int(fast["simulated_intervals"].iloc[0]) > 0
    assert int(fast["throttle_ms"].iloc[0]) > 0


def _generated_rows(kind: str) -> pd.DataFrame:
    plan = make_plan(tenants=6, days=1, interval_s=10, outliers=2, seed=1)
    records = [json.loads(line) for hour in range(6) for line in hour_lines(plan, hour)]
    amount, key, quota = {"produce": ("produce_bytes", "produce", "producer_byte_rate"),
                          "fetch": ("fetch_bytes", "fetch", "consumer_byte_rate")}[kind]
    return rows(*((r["user"], r["client_id"], r["start_ms"], r["interval_s"], r[amount], r["requests"][key],
                   r["throttle_ms"][key], r["quotas"][quota] if r["quotas"][quota] is not None else NAN)
                  for r in records))


@pytest.mark.slow  # seconds of CPU: make test, not make check
@pytest.mark.parametrize("kind", ["produce", "fetch"])
@pytest.mark.parametrize("quotas", [None, {QuotaEntity(user=DEFAULT, client_id=DEFAULT): {P: 300 * 1024.0,
                                                                                           F: 700 * 1024.0}}])
def test_the_fast_paths_give_exactly_the_slow_paths_results(kind: str, quotas: dict | None) -> None:
    log = _generated_rows(kind)
    end = int(log["start_ms"].max()) + 10_000
    columns = ["user", "client_id", *OUTCOME, "recorded_throttle_ms"]
    used = {"throttle_ms": 0, "fast_intervals": 0, "simulated_intervals": 0, "skipped_intervals": 0}
    for (_, _), tenant in log.groupby(["user", "client_id"]):
        fast = replay_unit(tenant, kind, quotas, KAFKA, end, fast=True)
        slow = replay_unit(tenant, kind, quotas, KAFKA, end, fast=False)
        pd.testing.assert_frame_equal(fast[columns], slow[columns])
        for k in used:
            used[k] += int(fast[k].sum())
    # Both paths inside a simulation were taken. Under the recorded quotas most tenants are never
    # near them and are not simulated at all; the tight candidate quotas throttle.
    assert used["fast_intervals"] > 0 and used["simulated_intervals"] > 0
    if quotas is None:
        assert used["skipped_intervals"] > used["fast_intervals"] + used["simulated_intervals"]
    else:
        assert used["throttle_ms"] > 0
