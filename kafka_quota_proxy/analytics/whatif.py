"""The what-if replay on Spark: every replay unit through `replay.replay_unit`, in parallel.

A unit is what one quota sensor of one proxy instance saw: for quotas from a file (or the
recommended ones), the tenants that Kafka's resolution puts on the same sensor (KIP-55: e.g.
all clients of a user with only user quotas); for the quotas the log recorded, one tenant, since
the log says which quota was in force but not which entity it came from. Each proxy instance
measures on its own, so instances are replayed apart and summed after. The units are grouped
with `groupBy(...).applyInPandas`, so each one runs in one Python worker, next to its data; only
per-tenant results come back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kafka_quota_proxy.analytics.measures import BY_KEY
from kafka_quota_proxy.analytics.replay import INPUT_COLUMNS, KINDS, Quotas, replay_unit
from kafka_quota_proxy.quota.rate import MetricConfig
from kafka_quota_proxy.quota.resolution import QuotaResolver, QuotaStore

KIND_MEASURES = {kind: BY_KEY[key] for kind, key in KINDS.items()}  # the replayed kinds' measures
UNIT = ["scenario", "kind", "instance", "unit_user", "unit_client"]
RESULT_SCHEMA = ("scenario string, kind string, instance string, user string, client_id string, "
                 "quota double, demand_bytes long, sent_bytes long, throttle_ms long, "
                 "throttled_requests long, delayed_bytes long, backlog_bytes long, "
                 "recorded_throttle_ms long, simulated_intervals long, fast_intervals long, "
                 "skipped_intervals long")
UNITS_SCHEMA = ("scenario string, kind string, user string, client_id string, unit_user string, "
                "unit_client string")
Frames = Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]
SUMMED = ("demand_bytes", "sent_bytes", "throttle_ms", "throttled_requests", "delayed_bytes", "backlog_bytes",
          "recorded_throttle_ms", "simulated_intervals", "fast_intervals", "skipped_intervals")


def replay_rows(records: DataFrame) -> DataFrame:
    """The records as replay input, one row per record and kind with anything to send."""
    parts = []
    for kind, m in KIND_MEASURES.items():
        parts.append(records.select(
            F.lit(kind).alias("kind"), "instance", "user", "client_id", "start_ms", "interval_s",
            F.col(m.amount).alias("bytes"), F.col(f"requests_{kind}").alias("requests"),
            F.col(f"throttle_{m.throttle}_ms").alias("throttle_ms"),
            F.col(f"quota_{m.key.value}").alias("recorded_quota"),
        ).filter((F.col("bytes") > 0) | (F.col("throttle_ms") > 0)))
    return functools.reduce(DataFrame.unionByName, parts)


def _units(scenarios: Mapping[str, Quotas | None]) -> Frames:
    """mapInPandas: for each tenant, scenario and kind, the unit its records are replayed in."""
    def assign(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        resolvers = {(name, kind): QuotaResolver(QuotaStore(quotas), key)
                     for name, quotas in scenarios.items() if quotas is not None
                     for kind, key in KINDS.items()}
        for frame in frames:
            rows = []
            for user, client in zip(frame["user"], frame["client_id"], strict=True):
                for name, quotas in scenarios.items():
                    for kind in KINDS:
                        if quotas is None:
                            rows.append((name, kind, user, client, user, client))
                        else:
                            tags = resolvers[(name, kind)].resolve(user, client).tags
                            rows.append((name, kind, user, client, tags[0], tags[1]))
            yield pd.DataFrame(rows, columns=[c.split()[0] for c in UNITS_SCHEMA.split(", ")])
    return assign


def _replayer(scenarios: Mapping[str, Quotas | None], config: MetricConfig,
              end_ms: int) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def replay(frame: pd.DataFrame) -> pd.DataFrame:
        scenario, kind, instance = frame["scenario"].iat[0], frame["kind"].iat[0], frame["instance"].iat[0]
        out = replay_unit(frame[list(INPUT_COLUMNS)], kind, scenarios[scenario], config, end_ms)
        out.insert(0, "instance", instance)
        out.insert(0, "kind", kind)
        out.insert(0, "scenario", scenario)
        return out
    return replay


def replay(records: DataFrame, scenarios: Mapping[str, Quotas | None], config: MetricConfig,
           end_ms: int) -> DataFrame:
    """Per scenario, kind and tenant (instances summed): replay.RESULT_COLUMNS."""
    rows = replay_rows(records)
    tenants = rows.select("user", "client_id").distinct()
    units = tenants.mapInPandas(_units(scenarios), UNITS_SCHEMA)
    results = (rows.join(units, ["kind", "user", "client_id"])
               .groupBy(*UNIT).applyInPandas(_replayer(scenarios, config, end_ms), RESULT_SCHEMA))
    return results.groupBy("scenario", "kind", "user", "client_id").agg(
        F.max("quota").alias("quota"), *(F.sum(c).alias(c) for c in SUMMED))

