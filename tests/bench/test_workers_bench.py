"""A tiny run of bench.workers: both proxies serve both workloads through the sink broker with no
error, and the report has its ratios. The numbers themselves are `make bench`'s business."""

from __future__ import annotations

import pytest

from bench import workers

pytestmark = pytest.mark.integration


def test_both_workloads_run_through_one_and_two_workers() -> None:
    report = workers.measure(1, 0.3, 0.7, log=lambda line: None)
    assert set(report["workloads"]) == {w.name for w in workers.WORKLOADS}
    for w in report["workloads"].values():
        for n in (1, 2):
            assert w[f"workers_{n}"]["errors"] == 0
            assert w[f"workers_{n}"]["requests_per_second"] > 0
        assert sum(w["workers_2"]["spread"][0]) > 0
        assert w["ratio"] > 0
    assert dict(workers.rows(report))
