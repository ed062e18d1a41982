"""The synthetic usage log: quota/usage.py's record exactly, the proxy's file layout, the quotas
resolved as the proxy would, throttles consistent with them, known outliers, determinism."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from kafka_quota_proxy.analytics.generate import (
    MANIFEST,
    GenerateError,
    generate,
    hour_lines,
    make_plan,
)
from kafka_quota_proxy.quota import usage


def shape(record: dict[str, Any]) -> list[tuple[str, Any]]:
    """Keys in order, nested keys in order."""
    return [(k, shape(v) if isinstance(v, dict) else None) for k, v in record.items()]


REFERENCE = usage.record(0, 10, "i", "u", "c", {}, {}, {}, {}, {})


def test_every_line_is_a_version_2_record_with_every_key_in_order() -> None:
    plan = make_plan(tenants=12, days=1, interval_s=30, outliers=2, seed=5)
    lines = hour_lines(plan, 0)
    assert len(lines) == 12 * 120
    for line in lines:
        record = json.loads(line)
        topics = record.pop("topics")
        assert shape(record) == [kv for kv in shape(REFERENCE) if kv[0] != "topics"]
        assert len(topics) == 2 and all(name.startswith("events-0") for name in topics)
        for counts in topics.values():
            assert list(counts) == list(usage.TOPIC_COUNTERS)
            assert all(isinstance(v, int) and v >= 0 for v in counts.values())
        assert record["v"] == usage.VERSION and record["interval_s"] == 30 and record["instance"] == "proxy-a"
        assert record["start_ms"] % 30_000 == 0
        for key in usage.counter_names():
            assert isinstance(record[key], float if key == "request_time_ms" else int)
        for group in ("requests", "throttle_ms", "throttled"):
            assert all(isinstance(v, int) and v >= 0 for v in record[group].values())
        assert all(v is None or isinstance(v, float) for v in record["quotas"].values())


@pytest.mark.slow  # seconds of CPU: make test, not make check
def test_quotas_in_force_are_resolved_and_throttles_consistent_with_them() -> None:
    plan = make_plan(tenants=12, days=1, interval_s=10, outliers=3, seed=11)
    records = [json.loads(line) for hour in range(24) for line in hour_lines(plan, hour)]
    throttled = 0
    for r in records:
        q = r["quotas"]
        assert q == {"producer_byte_rate": 2097152.0, "consumer_byte_rate": 4194304.0,
                     "request_percentage": None, "controller_mutation_rate": None, "producer_ids_rate": 0.1}
        for kind, key, amount in (("produce", "producer_byte_rate", "produce_bytes"),
                                  ("fetch", "consumer_byte_rate", "fetch_bytes")):
            allowed = q[key] * r["interval_s"]
            if r["throttle_ms"][kind]:
                throttled += 1
                # Held to the quota: the quota's worth went through, the rest was throttle.
                assert r[amount] == int(allowed)
                assert 0 < r["throttle_ms"][kind] <= r["interval_s"] * 1000
                assert r["throttled"][kind] >= 1
            else:
                assert r[amount] <= allowed and r["throttled"][kind] == 0
    assert throttled > 0  # the outliers did go over


def test_the_files_are_the_proxys_layout(tmp_path: Path) -> None:
    plan = make_plan(tenants=3, days=1, interval_s=60, outliers=1, seed=2, start="2026-03-07")
    result = generate(tmp_path, plan)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("usage-*"))
    assert files[0] == "dt=2026-03-07/hour=00/usage-proxy-a.jsonl.gz"
    assert files[-1] == "dt=2026-03-07/hour=23/usage-proxy-a.jsonl"  # the current hour: not gzipped
    assert len(files) == 24 and all(f.endswith(".jsonl.gz") for f in files[:-1])
    with gzip.open(tmp_path / files[0], "rt") as f:
        first = [json.loads(line) for line in f]
    assert len(first) == 3 * 60 and first[0]["start_ms"] == 1772841600000  # 2026-03-07T00:00Z
    assert result["records"] == 24 * 60 * 3
    assert json.loads((tmp_path / MANIFEST).read_text()) == result


def test_outliers_are_listed_and_several_times_the_median(tmp_path: Path) -> None:
    plan = make_plan(tenants=30, days=1, interval_s=60, outliers=4, seed=9)
    listed = generate(tmp_path, plan)["outliers"]
    assert [(o["user"], o["client_id"]) for o in listed] == [(t.user, t.client_id) for t in plan.tenants
                                                             if t.outlier]
    assert len(listed) == 4
    for o in listed:
        assert 1 <= len(o["measures"]) <= 2
        assert all(6 <= f <= 10 for f in o["measures"].values())
        if "producer_ids" in o["measures"]:
            assert o["user"] != "ANONYMOUS"
    users = {t.user for t in plan.tenants}
    assert "ANONYMOUS" in users and any(u.startswith("svc-") for u in users)


def test_same_seed_same_log_however_many_workers(tmp_path: Path) -> None:
    plan = make_plan(tenants=5, days=1, interval_s=60, outliers=1, seed=4)
    generate(tmp_path / "one", plan, workers=1)
    generate(tmp_path / "two", plan, workers=2)
    for path in sorted((tmp_path / "one").rglob("usage-*")):
        twin = tmp_path / "two" / path.relative_to(tmp_path / "one")
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as a, opener(twin, "rb") as b:
            assert a.read() == b.read()
    same = {"tenants": 5, "days": 1, "interval_s": 60, "outliers": 1}
    assert hour_lines(plan, 3) == hour_lines(make_plan(**same, seed=4), 3)
    assert hour_lines(plan, 3) != hour_lines(make_plan(**same, seed=5), 3)


def test_weekends_are_quieter() -> None:
    plan = make_plan(tenants=4, days=7, interval_s=60, outliers=0, seed=1)  # starts on a Monday

    def produced(day: int) -> int:
        return sum(json.loads(line)["produce_bytes"]
                   for h in range(24) for line in hour_lines(plan, day * 24 + h))
    assert produced(5) < 0.6 * produced(0) and produced(6) < 0.6 * produced(1)


@pytest.mark.parametrize("kwargs, message", [
    ({"tenants": 0}, "--tenants: expected at least 1, got 0"),
    ({"days": 0}, "--days: expected at least 1, got 0"),
    ({"interval_s": 7}, "--interval-seconds: must divide an hour"),
    ({"tenants": 2, "outliers": 3}, "--outliers: expected 0 to 2, got 3"),
    ({"start": "05/01/2026"}, "--start: expected YYYY-MM-DD, got '05/01/2026'"),
    ({"instance": "a/b"}, "--instance: expected a name without '/'"),
])
def test_bad_parameters_are_one_line(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(GenerateError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        make_plan(**kwargs)
