"""A tiny run of bench.store_latency: the proxy answers every Produce with the store near and
100 ms away, no sync fails, and the report has its rows. The numbers are `make bench`'s."""

from __future__ import annotations

import pytest

from bench import store_latency

pytestmark = pytest.mark.integration


def test_both_phases_run_and_no_sync_fails() -> None:
    r = store_latency.measure(phases=1, seconds=1.0)
    assert r["near_p99"] > 0 and r["far_p99"] > 0
    assert r["failed_syncs"] == 0 and r["degradations"] == 0
    assert r["syncs"] >= 3
    assert [name for name, _ in store_latency.rows(r)][:3] == [
        "Produce p50 / p99, store near", "Produce p50 / p99, store 100 ms away", "p99 far / near"]
