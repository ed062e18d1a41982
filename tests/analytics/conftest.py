"""Fixtures for the usage pipeline: one local Spark session for the whole run, a generated log
with known outliers (and a file of bad lines), and one analysis of it through the CLI.

The log is small so that the run stays short on two cores: 40 tenants, one day of 60 s
intervals (57,600 records), 3 outliers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the usage pipeline needs the spark extra")
pytest.importorskip("pandas", reason="the usage pipeline needs the spark extra")

from pyspark.sql import SparkSession  # noqa: E402

from kafka_quota_proxy.analytics.generate import generate, make_plan  # noqa: E402
from kafka_quota_proxy.analytics.session import start  # noqa: E402
from kafka_quota_proxy.quota import usage  # noqa: E402

PLAN = {"tenants": 40, "days": 1, "interval_s": 60, "outliers": 3, "seed": 7}


def bad_lines() -> list[str]:
    """One of each kind of line the reader must count and skip."""
    good = usage.record(1767571200000, 60, "proxy-b", "late", "app", {"produce_bytes": 10}, {}, {}, {}, {})
    wrong_type = {**good, "produce_bytes": "lots"}
    missing_start = {k: v for k, v in good.items() if k != "start_ms"}
    missing_user = {k: v for k, v in good.items() if k != "user"}
    wrong_version = {**good, "v": 3}
    nested_wrong_type = {**good, "requests": {**good["requests"], "fetch": "many"}}
    return [json.dumps(good)[:70], "not json at all", json.dumps(wrong_type), json.dumps(missing_start),
            json.dumps(missing_user), json.dumps(wrong_version), json.dumps(nested_wrong_type)]


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session, _ = start("local[2]", {"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@dataclass(frozen=True)
class Generated:
    dir: Path
    manifest: dict[str, Any]
    bad_lines: int


@pytest.fixture(scope="session")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    out = tmp_path_factory.mktemp("usage")
    manifest = generate(out, make_plan(**PLAN))
    broken = out / "dt=2026-01-05" / "hour=00" / "usage-broken.jsonl"
    lines = bad_lines()
    broken.write_text("\n".join(lines) + "\n")
    return Generated(out, manifest, len(lines))


@dataclass(frozen=True)
class Analyzed:
    out: Path
    summary: dict[str, Any]
    stdout: str


@pytest.fixture(scope="session")
def analyzed(spark: SparkSession, generated: Generated, tmp_path_factory: pytest.TempPathFactory) -> Analyzed:
    """`kafka-quota-proxy analyze` over the generated log, in the session's Spark."""
    from contextlib import redirect_stdout
    from io import StringIO

    from kafka_quota_proxy.analytics.cli import main

    out = tmp_path_factory.mktemp("report")
    buffer = StringIO()
    with redirect_stdout(buffer):
        code = main(["analyze", "--usage", str(generated.dir), "--out", str(out)])
    assert code == 0
    return Analyzed(out, json.loads((out / "summary.json").read_text()), buffer.getvalue())
