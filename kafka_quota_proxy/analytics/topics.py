"""Per-topic statistics, in Spark: the hottest topics, from the bytes per topic that the usage log
records with `usage_log.topics` (docs/usage-log.md; the rows come from reading.topic_rows).

A topic's rate in an interval is its bytes from every tenant and every proxy instance together,
over the interval's length: what a topic quota holds, which is the topic's budget however many
clients, brokers and proxies carry it (docs/topic-quotas.md). Percentiles are over the intervals
in which the topic had any bytes, as the tenants' are over their active intervals.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from kafka_quota_proxy.analytics.measures import TOPIC_MEASURES
from kafka_quota_proxy.analytics.stats import ACCURACY, PERCENTILES, TENANT
from kafka_quota_proxy.quota import usage

# (measure name, the bytes the topic took, the bytes its quota refused): produce, then fetch
DIRECTIONS = tuple((m.name, m.amount, f"{m.name}_refused_bytes") for m in TOPIC_MEASURES)
assert usage.TOPIC_COUNTERS == (*(took for _, took, _ in DIRECTIONS),
                                *(refused for _, _, refused in DIRECTIONS))


def topic_intervals(rows: DataFrame) -> DataFrame:
    """One row per topic and interval start: bytes summed over tenants and instances, and rates."""
    summed = rows.groupBy("topic", "start_ms").agg(
        F.max("interval_s").alias("interval_s"), *(F.sum(c).alias(c) for c in usage.TOPIC_COUNTERS))
    rates = []
    for name, took, refused in DIRECTIONS:
        rates += [(F.col(took) / F.col("interval_s")).alias(f"{name}_rate"),
                  (F.col(refused) > 0).cast("int").alias(f"{name}_refused_interval")]
    return summed.select("*", *rates)


def topic_report(rows: DataFrame) -> DataFrame:
    """Per topic: totals, rate percentiles (B/s), writers and readers, the share of intervals in
    which its quota refused bytes, and its top writer and reader by bytes."""
    intervals = topic_intervals(rows)
    aggs = [F.min("start_ms").alias("first_ms"),
            F.max(F.col("start_ms") + F.col("interval_s") * 1000).alias("end_ms"),
            F.count(F.lit(1)).alias("intervals"),
            *(F.sum(c).alias(c) for c in usage.TOPIC_COUNTERS)]
    for name, took, _ in DIRECTIONS:
        active = F.when(F.col(took) > 0, F.col(f"{name}_rate"))
        approx = F.percentile_approx(active, [p for _, p in PERCENTILES], ACCURACY)
        aggs += [F.coalesce(approx[i], F.lit(0.0)).alias(f"{name}_{label}")
                 for i, (label, _) in enumerate(PERCENTILES)]
        aggs += [F.max(f"{name}_rate").alias(f"{name}_max"),
                 F.avg(f"{name}_refused_interval").alias(f"{name}_refused_interval_share")]
    report = intervals.groupBy("topic").agg(*aggs)
    per_tenant = rows.groupBy("topic", *TENANT).agg(F.sum("produce_bytes").alias("written"),
                                                     F.sum("fetch_bytes").alias("read"))
    people = per_tenant.groupBy("topic").agg(
        F.sum((F.col("written") > 0).cast("int")).alias("writers"),
        F.sum((F.col("read") > 0).cast("int")).alias("readers"))
    report = report.join(people, "topic")
    for column, label in (("written", "top_writer"), ("read", "top_reader")):
        rank = F.row_number().over(Window.partitionBy("topic").orderBy(F.col(column).desc(), *TENANT))
        top = (per_tenant.filter(F.col(column) > 0).withColumn("_rank", rank).filter(F.col("_rank") == 1)
               .select("topic", F.concat_ws("/", *TENANT).alias(label),
                       F.col(column).alias(f"{label}_bytes")))
        report = report.join(top, "topic", "left")
    return report
