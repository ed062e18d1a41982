"""bench.shared_sim drives the proxy's own quota engines: deterministic for a seed, so what it
shows about the arithmetic is checked exactly here (no clock, no processes)."""

from __future__ import annotations

import pytest

from bench.shared_sim import run, simulate


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_replica_whose_client_becomes_the_busy_one_does_not_burst_past_the_shared_quota(
        seed: int) -> None:
    # Before a new stat took the others to send as much as it does until its first read, the
    # fullest 11 s window of 10 replicas with shifting traffic was 1.44x-1.61x the quota here.
    _, window = simulate(10, "shifting", seconds=40, warm_up=10, seed=seed)
    assert window < 1.2


def test_the_same_seed_gives_the_same_run() -> None:
    assert simulate(3, "even", seconds=5, warm_up=2, seed=7) == simulate(3, "even", seconds=5,
                                                                          warm_up=2, seed=7)
    assert [name for name, _ in run([1], seeds=1)] == [
        "produce, 1 replicas, even: aggregate, 1 seeds", "produce, 1 replicas, even: fullest 11 s window",
        "consume, 1 replicas, even: aggregate, 1 seeds", "consume, 1 replicas, even: fullest 11 s window"]


def test_a_throttled_fetch_delivers_nothing() -> None:
    # Alone, a flat-out consumer gets what a producer does, less the fetches answered empty.
    produced, _ = simulate(1, "even", seconds=20, warm_up=5, kind="produce")
    consumed, _ = simulate(1, "even", seconds=20, warm_up=5, kind="consume")
    assert 0.8 < consumed < produced
