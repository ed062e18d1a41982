"""`analyze`: usage log in, report out.

read (reading.py) -> report (stats.py) -> advise (recommend.py) -> replay (whatif.py, replay.py)
-> show (report_html.py, plots.py). Each stage writes its tables and the next reads them back;
only bounded results reach the driver. The stages and their outputs: docs/analytics.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kafka_quota_proxy.analytics import report_html, stats, topics, whatif
from kafka_quota_proxy.analytics.measures import CLIENT_MEASURES, USER_MEASURES
from kafka_quota_proxy.analytics.quota_file import QuotaFile, Quotas, load_quota_file
from kafka_quota_proxy.analytics.reading import UsageInputError, ingest, topic_rows
from kafka_quota_proxy.analytics.recommend import (
    DEFAULT_HEADROOM,
    DEFAULT_PERCENTILE,
    Recommendations,
    TenantDemand,
    TopicDemand,
    UserDemand,
    recommend,
)
from kafka_quota_proxy.analytics.stats import to_pandas
from kafka_quota_proxy.analytics.summary import Summary
from kafka_quota_proxy.quota.rate import MetricConfig

CURRENT, CANDIDATE = "current", "candidate"


@dataclass(frozen=True, slots=True)
class Options:
    """The `analyze` command's options."""

    usage: str
    out: str
    quotas: str | None = None
    candidate: str | None = None
    percentile: float = DEFAULT_PERCENTILE
    headroom: float = DEFAULT_HEADROOM
    top: int = 10
    window_num: int | None = None
    window_size_seconds: int | None = None


class Run:
    """One analysis: its options, its output directory and the timings of its stages."""

    def __init__(self, spark: SparkSession, options: Options) -> None:
        self.spark = spark
        self.options = options
        self.out = Path(options.out)
        self.summary = Summary(options.usage, options.out)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        yield
        self.summary.seconds[name] = round(time.perf_counter() - began, 3)

    def path(self, name: str) -> str:
        return str(self.out / name)

    def write_table(self, frame: DataFrame, name: str) -> DataFrame:
        """Parquet (as Spark writes it), then one CSV file's directory from that; the Parquet read back."""
        frame.write.mode("overwrite").parquet(self.path(f"{name}.parquet"))
        saved = self.spark.read.parquet(self.path(f"{name}.parquet"))
        saved.coalesce(1).write.mode("overwrite").option("header", True).csv(self.path(f"{name}.csv"))
        return saved

    def write_small(self, frame: pd.DataFrame, name: str) -> None:
        frame.to_parquet(self.path(f"{name}.parquet"), index=False)
        frame.to_csv(self.path(f"{name}.csv"), index=False)


def metric_config(options: Options, *files: QuotaFile | None) -> MetricConfig:
    """The proxy's window: flags, else the first file's `quota:` section that sets it, else 11 x 1 s."""
    num = options.window_num or next((f.window_num for f in files if f and f.window_num), None) or 11
    size = (options.window_size_seconds
            or next((f.window_size_seconds for f in files if f and f.window_size_seconds), None) or 1)
    return MetricConfig(samples=num, window_ms=size * 1000)


def analyze(spark: SparkSession, options: Options) -> Summary:
    run = Run(spark, options)
    current = load_quota_file(options.quotas) if options.quotas else None
    candidate = load_quota_file(options.candidate) if options.candidate else None
    config = metric_config(options, current, candidate)
    s = run.summary
    s.window_num, s.window_size_seconds = config.samples, config.window_ms // 1000
    if current:
        s.current = current.path
    if candidate:
        s.candidate = candidate.path
    run.out.mkdir(parents=True, exist_ok=True)

    with run.stage("read"):
        records = _read(run)
    with run.stage("report"):
        report = _report(run, records)
    with run.stage("topics"):
        topic_table = _topics(run, records)
    with run.stage("recommend"):
        recs = _recommend(run, report.tenants, report.users, topic_table)
    with run.stage("replay"):
        scenarios = {CURRENT: current.quotas if current else None,
                     CANDIDATE: candidate.quotas if candidate else recs.quotas}
        replayed = _replay(run, records, scenarios, config)
    with run.stage("html"):
        report_html.write(run.out, report_html.Inputs(
            summary=s, tenants=report.tenants, hours=report.hours, hour_of_day=report.hour_of_day,
            outliers=report.outliers, recommendations=recs, replayed=replayed, scenarios=scenarios,
            top=options.top, topics=topic_table))
    (run.out / "summary.json").write_text(s.to_json())
    return s


def _read(run: Run) -> DataFrame:
    ingested = ingest(run.spark, run.options.usage)
    ingested.records.write.mode("overwrite").parquet(run.path("records.parquet"))
    s = run.summary
    s.lines, s.bad_lines = ingested.counts()
    s.records = s.lines - s.bad_lines
    if s.records == 0:
        raise UsageInputError(f"no valid usage records under {run.options.usage} "
                              f"({s.bad_lines} bad lines skipped)")
    return run.spark.read.parquet(run.path("records.parquet"))


@dataclass(frozen=True)
class Report:
    """The report stage's tables, as written (Spark reads them back) or collected (small ones)."""

    tenants: DataFrame
    hours: DataFrame
    hour_of_day: DataFrame
    users: pd.DataFrame
    outliers: pd.DataFrame


def _report(run: Run, records: DataFrame) -> Report:
    # Read twice (report, hourly); on disk, as memory would hold every record twice over.
    intervals = stats.tenant_intervals(records).persist(StorageLevel.DISK_ONLY)
    try:
        tenants = run.write_table(stats.tenant_report(intervals, records).select(
            "*", F.timestamp_millis("first_ms").alias("first"), F.timestamp_millis("end_ms").alias("end")),
            "tenants")
        hours = run.write_table(stats.hourly(intervals), "hourly")
    finally:
        intervals.unpersist()
    s = run.summary
    span = tenants.agg(F.min("first_ms"), F.max("end_ms"), F.count(F.lit(1)), F.countDistinct("user")).first()
    assert span is not None
    s.first_ms, s.end_ms, s.tenants, s.users = (int(v) for v in span)
    by_hour_of_day = run.write_table(stats.hour_of_day(run.spark, hours, s.first_ms, s.end_ms), "hour_of_day")
    users = to_pandas(stats.user_rates(hours))
    run.write_small(users, "users")
    outliers = stats.outliers(tenants, users, run.options.top)
    run.write_small(outliers, "outliers")
    return Report(tenants, hours, by_hour_of_day, users, outliers)


def _topics(run: Run, records: DataFrame) -> DataFrame:
    """The per-topic report (topics.csv / topics.parquet): empty when the log has no bytes per
    topic (version-1 records, or usage_log.topics off)."""
    table = run.write_table(topics.topic_report(topic_rows(records)).select(
        "*", F.timestamp_millis("first_ms").alias("first"), F.timestamp_millis("end_ms").alias("end")),
        "topics")
    run.summary.topics = table.count()
    return table


def _recommend(run: Run, tenants: DataFrame, users: pd.DataFrame, topic_table: DataFrame) -> Recommendations:
    columns = [f"demand_{m.name}_p99" for m in CLIENT_MEASURES]
    demand = to_pandas(tenants.select("user", "client_id", *columns))
    per_tenant = [TenantDemand(row.user, row.client_id, {m.name: float(getattr(row, f"demand_{m.name}_p99"))
                                                         for m in CLIENT_MEASURES})
                  for row in demand.itertuples(index=False)]
    per_user = [UserDemand(row.user, {m.name: float(getattr(row, f"{m.name}_p99")) for m in USER_MEASURES})
                for row in users.itertuples(index=False)]
    directions = [d for d, _, _ in topics.DIRECTIONS]
    hot = to_pandas(topic_table.select("topic", *(f"{d}_{c}" for d in directions
                                                  for c in ("p99", "refused_interval_share"))))
    per_topic = [TopicDemand(row.topic, {d: float(getattr(row, f"{d}_p99")) for d in directions},
                             {d: float(getattr(row, f"{d}_refused_interval_share")) for d in directions})
                 for row in hot.itertuples(index=False)]
    recs = recommend(per_tenant, per_user, run.options.percentile, run.options.headroom, per_topic)
    (run.out / "recommended-quotas.yaml").write_text(recs.to_yaml(run.options.usage))
    sh = run.out / "recommended-quotas.sh"
    sh.write_text(recs.to_kafka_configs())
    sh.chmod(0o755)
    run.write_small(recommendations_table(recs), "recommendations")
    return recs


def recommendations_table(recs: Recommendations) -> pd.DataFrame:
    rows = [{"key": r.measure.key.value, "kind": r.kind, "entity_user": r.entity.user,
             "entity_client_id": r.entity.client_id, "entity_topic": r.entity.topic, "value": r.value,
             "unit": r.measure.unit, "basis_p99": r.basis, "percentile": recs.percentile,
             "headroom": recs.headroom}
            for r in recs.items]
    return pd.DataFrame(rows, columns=["key", "kind", "entity_user", "entity_client_id", "entity_topic",
                                       "value", "unit", "basis_p99", "percentile", "headroom"])


def _replay(run: Run, records: DataFrame, scenarios: dict[str, Quotas | None],
            config: MetricConfig) -> DataFrame:
    results = whatif.replay(records, scenarios, config, run.summary.end_ms)
    saved = run.write_table(results, "replay")
    totals = saved.agg(*(F.sum(c).alias(c) for c in ("simulated_intervals", "fast_intervals",
                                                     "skipped_intervals"))).first()
    assert totals is not None
    run.summary.replay = {k: int(v or 0) for k, v in totals.asDict().items()}
    return saved
