"""A tiny run of bench.tansu_perf: `tansu perf produce` (acks=0, and it waits for Tansu's answer
to each request) runs on every path, and each run's records are at the broker. The figures
themselves are `make bench`'s business, never a test's."""

from __future__ import annotations

import pytest

from bench import tansu_perf
from bench.throughput_setup import DIRECT, OURS, TANSU

pytestmark = pytest.mark.integration


def test_every_load_runs_on_every_path_and_reaches_the_broker() -> None:
    results = tansu_perf.measure(tansu_perf.Sizes(rounds=1, seconds=1), log=lambda _: None)
    assert list(results["loads"]) == [load.name for load in tansu_perf.LOADS]
    for name, load in results["loads"].items():
        assert set(load["runs"]) == {DIRECT, OURS, TANSU}, name
        for path, runs in load["runs"].items():
            (run,) = runs
            assert run["exit"] == 0, (name, path, run.get("stderr"))
            assert run["records"] > 0, (name, path)
    rows = tansu_perf.rows(results)
    assert len(rows) == len(tansu_perf.LOADS) * 3
    assert all("failed" not in text for _, text in rows)
