"""The soak, short: 60 s of the mixed workload of `make soak` (devkit/soak) through one proxy
process in front of a real Tansu. Asserted: no ERROR or traceback in the proxy's log, no
descriptor growth between the two readings with the churn paused, every acknowledged record read
back by plain fetches at the end, every one of them returned by the two readers that ran
throughout unless passed over in a jump of their offsets (Tansu's answers: docs/reliability.md,
"Soak"), none twice in the log from an idempotent producer, and a clean exit on SIGTERM. The
memory bound needs a warm-up of minutes: `make soak` judges it."""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit.soak.run import run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]


def test_short_soak(tmp_path: Path) -> None:
    outcome = run(1.0, tmp_path, say=lambda line: None)
    print("\n".join(outcome.report()))
    assert outcome.log_problems == []
    assert outcome.failures == []
    assert outcome.exit_code == 0
    assert outcome.fds.ok, outcome.fds.lines()
    records = outcome.records
    assert (records.missing_log, records.duplicated_idempotent) == (0, 0)
    assert (records.group.unexplained, records.live.unexplained) == (0, 0), records.lines()
    assert records.acked > 10_000
    # the workload did what it says: quotas changed both ways, connections came and went, and
    # the throttled producer was throttled
    counts = outcome.counts
    assert counts["AlterClientQuotas"] >= 10
    # every rewrite reloaded, and the quota lift at the end (unless it fell in the same poll)
    assert counts["config rewrites"] >= 4
    assert counts["config rewrites"] <= counts["config reloads"] <= counts["config rewrites"] + 1
    assert counts["churn rounds"] >= 4 and counts["abrupt closes"] >= 3
    assert counts["throttled requests"] > 0
    assert counts["connections accepted"] > 20
    assert counts["protocol errors"] == 0
    assert counts["live readers' throttled fetches"] == 0
    assert (tmp_path / "samples.csv").stat().st_size > 0 and (tmp_path / "soak.png").stat().st_size > 0
