"""Per-tenant statistics, in Spark: one row per (user, client-id), hourly series, the hour-of-day
pattern, the users' producer-id rates and the top outliers.

Everything stays in Spark except what is bounded. How rates and demand are computed:
docs/analytics.md.
"""

from __future__ import annotations

from functools import reduce
from typing import cast

import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from kafka_quota_proxy.analytics.measures import CLIENT_MEASURES, MEASURES, USER_MEASURES, Measure, per_second
from kafka_quota_proxy.quota import usage

TENANT = ["user", "client_id"]
HOUR_MS = 3_600_000
PERCENTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
# percentile_approx's rank error is 1/ACCURACY of the count (0.1 %); a sketch is exact until it
# compresses (past 50,000 values in one task). Spark's default 10,000 keeps nearly every value of a
# week of 10 s intervals, for each tenant and measure at once: gigabytes.
ACCURACY = 1_000


def to_pandas(frame: DataFrame) -> pd.DataFrame:
    """The one way a table reaches the driver; only for small, aggregated frames."""
    return cast(pd.DataFrame, frame.toPandas())


def _demand_amount(m: Measure) -> Column:
    held = F.col(f"throttle_{m.throttle}_ms") / 1000.0 * F.coalesce(F.col(f"quota_{m.key.value}"), F.lit(0.0))
    return F.col(m.amount) + held / per_second(m)


def tenant_intervals(records: DataFrame) -> DataFrame:
    """One row per tenant and interval start: summed amounts, per-second rates and demand rates.

    The records are first clustered by tenant, so that this and every per-tenant aggregation
    after it need no other shuffle, and a task holds the percentile sketches of its own tenants
    only (no partial sketches of every tenant in every task)."""
    sums = [F.sum(c).alias(c) for c in usage.counter_names()]
    sums += [F.sum(f"requests_{g}").alias(f"requests_{g}") for g in usage.GROUPS]
    sums += [F.sum(f"throttle_{t}_ms").alias(f"throttle_{t}_ms") for t in usage.throttle_types()]
    sums += [F.sum(f"throttled_{t}").alias(f"throttled_{t}") for t in usage.throttle_types()]
    sums += [F.sum(_demand_amount(m)).alias(f"demand_{m.amount}") for m in MEASURES]
    quotas = [F.max(f"quota_{k.value}").alias(f"quota_{k.value}") for k in usage.quota_keys()]
    merged = (records.repartition(*TENANT).groupBy(*TENANT, "start_ms")
              .agg(F.max("interval_s").alias("interval_s"), *sums, *quotas))
    rates = []
    for m in MEASURES:
        rates += [(F.col(m.amount) * per_second(m) / F.col("interval_s")).alias(f"{m.name}_rate"),
                  (F.col(f"demand_{m.amount}") * per_second(m) / F.col("interval_s"))
                  .alias(f"demand_{m.name}_rate")]
    interval_ms = F.col("interval_s") * 1000
    worst = F.greatest(*(F.col(f"throttle_{t}_ms") for t in usage.throttle_types()))
    return merged.select(
        "*", *rates,
        F.least(worst, interval_ms).alias("throttled_ms"),
        (worst > 0).cast("int").alias("throttled_interval"),
        (F.col("start_ms") - F.col("start_ms") % HOUR_MS).alias("hour_ms"),
        ((F.col("start_ms") % (24 * HOUR_MS)) / HOUR_MS).cast("int").alias("hour_of_day"))


def _percentiles(column: str) -> list[Column]:
    approx = F.percentile_approx(column, [p for _, p in PERCENTILES], ACCURACY)
    stem = column.removesuffix("_rate")
    out = [approx[i].alias(f"{stem}_{name}") for i, (name, _) in enumerate(PERCENTILES)]
    return out + [F.max(column).alias(f"{stem}_max")]


def tenant_report(intervals: DataFrame, records: DataFrame) -> DataFrame:
    """The per-tenant report: totals, rate percentiles, demand p99, throttled shares, quotas."""
    totals = [F.sum(c).alias(c) for c in usage.counter_names()]
    totals.append(F.sum(sum((F.col(f"requests_{g}") for g in usage.GROUPS), F.lit(0))).alias("requests"))
    totals += [F.sum(f"requests_{g}").alias(f"requests_{g}") for g in usage.GROUPS]
    totals += [F.sum(f"throttle_{t}_ms").alias(f"throttle_{t}_ms") for t in usage.throttle_types()]
    stats: list[Column] = []
    for m in MEASURES:
        stats += _percentiles(f"{m.name}_rate")
        demand = F.percentile_approx(f"demand_{m.name}_rate", 0.99, ACCURACY)
        stats.append(demand.alias(f"demand_{m.name}_p99"))
    shares = [F.avg("throttled_interval").alias("throttled_interval_share"),
              (F.sum("throttled_ms") / F.sum(F.col("interval_s") * 1000)).alias("throttled_time_share")]
    quotas = [F.max_by(f"quota_{k.value}", "start_ms").alias(f"quota_{k.value}") for k in usage.quota_keys()]
    report = intervals.groupBy(*TENANT).agg(
        F.min("start_ms").alias("first_ms"),
        F.max(F.col("start_ms") + F.col("interval_s") * 1000).alias("end_ms"),
        F.count(F.lit(1)).alias("intervals"), *totals, *stats, *shares, *quotas)
    instances = records.groupBy(*TENANT).agg(F.countDistinct("instance").alias("instances"))
    return report.join(instances, TENANT)


def hourly(intervals: DataFrame) -> DataFrame:
    """Per tenant and UTC hour: amounts, mean and peak rates, throttle, the quotas in force."""
    aggs = [F.count(F.lit(1)).alias("intervals")]
    for m in MEASURES:
        aggs += [F.sum(m.amount).alias(m.amount), F.sum(f"demand_{m.amount}").alias(f"demand_{m.amount}"),
                 F.max(f"{m.name}_rate").alias(f"{m.name}_peak")]
    aggs += [F.sum(f"throttle_{t}_ms").alias(f"throttle_{t}_ms") for t in usage.throttle_types()]
    aggs += [F.max(f"quota_{k.value}").alias(f"quota_{k.value}") for k in usage.quota_keys()]
    out = intervals.groupBy(*TENANT, "hour_ms", "hour_of_day").agg(*aggs)
    means = [(F.col(m.amount) * per_second(m) / 3600).alias(f"{m.name}_mean") for m in MEASURES]
    return out.select("*", *means, F.timestamp_millis("hour_ms").alias("hour"))


def hours_by_hour_of_day(first_ms: int, end_ms: int) -> dict[int, int]:
    """How many hours of each hour-of-day the log's time range holds (for hour-of-day means)."""
    counts = dict.fromkeys(range(24), 0)
    for hour in range(first_ms // HOUR_MS, (end_ms - 1) // HOUR_MS + 1):
        counts[hour % 24] += 1
    return counts


def hour_of_day(spark: SparkSession, hours: DataFrame, first_ms: int, end_ms: int) -> DataFrame:
    """Per tenant and hour of day (UTC): the mean rate of each measure over the log's days."""
    counts = spark.createDataFrame(
        [(h, n) for h, n in hours_by_hour_of_day(first_ms, end_ms).items() if n],
        "hour_of_day int, hours long")
    summed = hours.groupBy(*TENANT, "hour_of_day").agg(*(F.sum(m.amount).alias(m.amount) for m in MEASURES))
    means = [(F.col(m.amount) * per_second(m) / (F.col("hours") * 3600)).alias(f"{m.name}_mean")
             for m in MEASURES]
    return summed.join(F.broadcast(counts), "hour_of_day").select(*TENANT, "hour_of_day", *means)


def user_rates(hours: DataFrame) -> DataFrame:
    """Per user, for each measure set per user alone (USER_MEASURES: new producer ids per second):
    the p99 and the max over its active hours of its hourly rate (demand), every client together,
    as KIP-936 measures a user, over hours as its window is (an hour, not 1 s)."""
    per_hour = hours.groupBy("user", "hour_ms").agg(
        *(F.sum(f"demand_{m.amount}").alias(m.name) for m in USER_MEASURES))
    rates = {m.name: F.col(m.name) * per_second(m) / 3600 for m in USER_MEASURES}
    return per_hour.groupBy("user").agg(
        *(F.percentile_approx(rate, 0.99, ACCURACY).alias(f"{name}_p99") for name, rate in rates.items()),
        *(F.max(rate).alias(f"{name}_max") for name, rate in rates.items()),
        F.count(F.lit(1)).alias("active_hours"))


def outliers(report: DataFrame, users: pd.DataFrame, k: int) -> pd.DataFrame:
    """The top k by each measure's p99 demand, with how far above the median (among those using
    the measure at all): tenants by their interval rates, and for a measure set per user alone
    (producer ids) users by their hourly rates (`users`, from user_rates), as the quota measures
    them."""
    measures = CLIENT_MEASURES
    medians = report.agg(*(F.percentile_approx(F.when(F.col(f"demand_{m.name}_p99") > 0,
                                                      F.col(f"demand_{m.name}_p99")), 0.5, ACCURACY)
                           .alias(m.name) for m in measures)).first()
    tops = [report.filter(F.col(f"demand_{m.name}_p99") > 0)
            .orderBy(F.col(f"demand_{m.name}_p99").desc(), *TENANT).limit(k)
            .select(F.lit(m.name).alias("measure"), F.lit(m.unit).alias("unit"), *TENANT,
                    F.col(f"demand_{m.name}_p99").alias("p99_demand"), F.col(f"{m.name}_p99").alias("p99"),
                    F.col(f"{m.name}_max").alias("max"))
            for m in measures]
    frames = [to_pandas(reduce(DataFrame.unionByName, tops))]
    median = {m.name: (medians[m.name] if medians is not None else None) for m in measures}
    for m in USER_MEASURES:
        active = users[users[f"{m.name}_p99"] > 0]
        by_user = pd.DataFrame({
            "measure": m.name, "unit": m.unit, "user": active["user"], "client_id": None,
            "p99_demand": active[f"{m.name}_p99"], "p99": active[f"{m.name}_p99"],
            "max": active[f"{m.name}_max"]})
        frames.append(by_user.sort_values(["p99_demand", "user"], ascending=[False, True]).head(k))
        median[m.name] = float(active[f"{m.name}_p99"].median()) if len(active) else None
    top = pd.concat(frames, ignore_index=True)
    order = {m.name: i for i, m in enumerate(MEASURES)}
    top = top.sort_values(["measure", "p99_demand", "user", "client_id"], ascending=[True, False, True, True],
                          key=lambda c: c.map(order) if c.name == "measure" else c, ignore_index=True)
    top.insert(2, "rank", top.groupby("measure").cumcount() + 1)
    top["median_p99"] = top["measure"].map(median).astype(float)
    top["times_median"] = top["p99_demand"] / top["median_p99"]
    return top
