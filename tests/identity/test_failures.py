"""FailureBackoff: exact delays per source address, with a fake clock."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.identity.failures import FailureBackoff

A, B = "203.0.113.1", "2001:db8::2"


def test_free_failures_then_doubling_from_250_ms_up_to_the_cap() -> None:
    backoff = FailureBackoff()
    delays = [backoff.on_failure(A, now_ms=1000 * i) for i in range(10)]
    assert delays == [0, 0, 0, 250, 500, 1000, 2000, 4000, 5000, 5000]
    assert backoff.failures(A, now_ms=9000) == 10


def test_the_cap_holds_for_long_runs() -> None:
    backoff = FailureBackoff(max_delay_ms=5000)
    delays = [backoff.on_failure(A, now_ms=i) for i in range(200)]
    assert delays[-1] == 5000 and max(delays) == 5000


def test_addresses_are_independent() -> None:
    backoff = FailureBackoff()
    for i in range(5):
        backoff.on_failure(A, now_ms=i)
    assert backoff.on_failure(B, now_ms=10) == 0
    assert backoff.on_failure(A, now_ms=11) == 1000
    assert len(backoff) == 2


def test_success_forgives() -> None:
    backoff = FailureBackoff()
    for i in range(6):
        backoff.on_failure(A, now_ms=i)
    backoff.on_success(A)
    assert backoff.failures(A, now_ms=10) == 0
    assert [backoff.on_failure(A, now_ms=20 + i) for i in range(4)] == [0, 0, 0, 250]
    backoff.on_success("198.51.100.9")  # never failed: nothing to do
    assert len(backoff) == 1


def test_forgotten_after_idle_time() -> None:
    backoff = FailureBackoff(forget_after_ms=600_000)
    for i in range(5):
        backoff.on_failure(A, now_ms=i * 1000)  # last failure at 4000
    assert backoff.failures(A, now_ms=4000 + 599_999) == 5
    # One millisecond short of the idle limit still counts...
    assert backoff.on_failure(A, now_ms=4000 + 599_999) == 1000
    # ...and exactly forget_after_ms of silence starts over.
    assert backoff.failures(A, now_ms=603_999 + 600_000) == 0
    assert backoff.on_failure(A, now_ms=603_999 + 600_000) == 0
    assert backoff.failures(A, now_ms=603_999 + 600_000) == 1


def test_idle_entries_are_dropped_from_memory() -> None:
    backoff = FailureBackoff(forget_after_ms=100)
    backoff.on_failure(A, now_ms=0)
    backoff.on_failure(B, now_ms=50)
    assert len(backoff) == 2
    backoff.on_failure("192.0.2.3", now_ms=120)  # A is 120 ms idle: gone; B is 70 ms idle: kept
    assert len(backoff) == 2 and backoff.failures(B, now_ms=120) == 1
    backoff.on_failure("192.0.2.3", now_ms=1000)
    assert len(backoff) == 1


def test_bounded_size_drops_the_least_recently_failed() -> None:
    backoff = FailureBackoff(max_entries=3)
    for i, addr in enumerate(["a", "b", "c"]):
        backoff.on_failure(addr, now_ms=i)
    backoff.on_failure("a", now_ms=10)  # "a" is now the most recent; "b" the oldest
    backoff.on_failure("d", now_ms=11)
    assert len(backoff) == 3
    assert backoff.failures("b", now_ms=12) == 0
    assert [backoff.failures(x, now_ms=12) for x in ("a", "c", "d")] == [2, 1, 1]


def test_default_bound_is_100_000_addresses() -> None:
    assert FailureBackoff().max_entries == 100_000


def test_custom_settings() -> None:
    backoff = FailureBackoff(max_delay_ms=1000, free_failures=0, initial_delay_ms=100)
    assert [backoff.on_failure(A, now_ms=i) for i in range(6)] == [100, 200, 400, 800, 1000, 1000]
    no_delay = FailureBackoff(max_delay_ms=0)
    assert {no_delay.on_failure(A, now_ms=i) for i in range(10)} == {0}


@pytest.mark.parametrize("kwargs", [
    {"max_delay_ms": -1}, {"free_failures": -1}, {"forget_after_ms": 0}, {"max_entries": 0},
    {"initial_delay_ms": -1},
])
def test_invalid_settings(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        FailureBackoff(**kwargs)
