"""Reading the usage log: JSON Lines, plain and gzipped, under an explicit schema made from
quota/usage.py (versions 1 and 2; version 1 has no `topics`).

Bad, cut-short or other-version lines are counted and skipped, never fatal; the result is one
flat row per record, its bytes per topic kept as one map column (`topic_rows` makes them rows).
The rules: docs/analytics.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, MapType, StringType, StructField, StructType

from kafka_quota_proxy.quota import usage

CORRUPT = "_corrupt_record"
FILE_GLOB = "*.{jsonl,jsonl.gz}"
REQUIRED = ("v", "start_ms", "interval_s", "user", "client_id")


class UsageInputError(ValueError):
    """The usage directory cannot be read at all (missing, no usage files)."""


def usage_schema() -> StructType:
    """The record (version 2, which reads version 1 too) as Spark reads it. Counters are read as
    doubles, so that a writer spelling a whole number `5.0` is not turned away; identity and time
    are exact types."""
    def group(names: tuple[str, ...]) -> StructType:
        return StructType([StructField(n, DoubleType()) for n in names])

    return StructType([
        StructField("v", LongType()),
        StructField("start_ms", LongType()),
        StructField("interval_s", LongType()),
        StructField("instance", StringType()),
        StructField("user", StringType()),
        StructField("client_id", StringType()),
        *(StructField(c, DoubleType()) for c in usage.counter_names()),
        StructField("requests", group(usage.GROUPS)),
        StructField("throttle_ms", group(usage.throttle_types())),
        StructField("throttled", group(usage.throttle_types())),
        StructField("quotas", group(tuple(k.value for k in usage.quota_keys()))),
        StructField("topics", MapType(StringType(), group(usage.TOPIC_COUNTERS))),
        StructField(CORRUPT, StringType()),
    ])


def check_usage_dir(path: str) -> None:
    """For a local path, fail early and clearly when there is nothing to read."""
    if "://" in path and not path.startswith("file://"):
        return  # hdfs://, s3a://, ...: Spark will say
    local = Path(path.removeprefix("file://"))
    if not local.is_dir():
        raise UsageInputError(f"no such directory: {path}")
    if next(local.rglob("*.jsonl"), None) is None and next(local.rglob("*.jsonl.gz"), None) is None:
        raise UsageInputError(f"no usage files (*.jsonl, *.jsonl.gz) under {path}")


def read_raw(spark: SparkSession, path: str) -> DataFrame:
    return (spark.read.schema(usage_schema())
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT)
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", FILE_GLOB)
            # A gzip cut short (a crash while compressing) must not stop the run: Spark keeps the
            # lines before the break and skips the rest, which no one can count.
            .option("ignoreCorruptFiles", "true")
            .json(path))


def is_bad(raw: DataFrame) -> Column:
    """A line that cannot be used: unparsable, of another version, or not saying whose and when."""
    bad = (raw[CORRUPT].isNotNull() | ~raw["v"].isin(*usage.READABLE_VERSIONS) | (raw["interval_s"] <= 0)
           | (raw["start_ms"] < 0))
    for name in REQUIRED:
        bad = bad | raw[name].isNull()
    return F.coalesce(bad, F.lit(True))


def _count(value: Column) -> Column:
    return F.coalesce(value, F.lit(0.0))


def flatten(records: DataFrame) -> DataFrame:
    """The records, one flat row each, with whole numbers where the format has them."""
    col = F.col
    columns = [col("user"), col("client_id"), F.coalesce(col("instance"), F.lit("")).alias("instance"),
               col("start_ms"), col("interval_s")]
    times = usage.time_counters()
    for c in usage.counter_names():
        value = _count(col(c))
        columns.append((value if c in times else value.cast(LongType())).alias(c))
    columns += [_count(col(f"requests.{g}")).cast(LongType()).alias(f"requests_{g}") for g in usage.GROUPS]
    columns += [_count(col(f"throttle_ms.{t}")).cast(LongType()).alias(f"throttle_{t}_ms")
                for t in usage.throttle_types()]
    columns += [_count(col(f"throttled.{t}")).cast(LongType()).alias(f"throttled_{t}")
                for t in usage.throttle_types()]
    columns += [col(f"quotas.{k.value}").alias(f"quota_{k.value}") for k in usage.quota_keys()]
    columns.append(col("topics"))
    return records.select(*columns)


def topic_rows(records: DataFrame) -> DataFrame:
    """One row per record and topic: the tenant, the interval and the topic's byte counts.
    A record without topics (version 1, or `usage_log.topics` off) gives none."""
    exploded = records.select("user", "client_id", "instance", "start_ms", "interval_s",
                              F.explode("topics").alias("topic", "counts"))
    return exploded.select("user", "client_id", "instance", "start_ms", "interval_s", "topic",
                           *(_count(F.col(f"counts.{c}")).cast(LongType()).alias(c)
                             for c in usage.TOPIC_COUNTERS))


@dataclass(frozen=True, slots=True)
class Ingested:
    """The good records, and a count of every line read and of the bad ones (filled in by the
    first action that runs over `records`)."""

    records: DataFrame
    observation: Observation

    def counts(self) -> tuple[int, int]:
        """(lines read, bad lines): call after an action has run over `records`."""
        got = self.observation.get
        return int(got.get("lines") or 0), int(got.get("bad") or 0)


def ingest(spark: SparkSession, path: str) -> Ingested:
    """The good records of the log under `path`, counting the bad lines on the way."""
    check_usage_dir(path)
    raw = read_raw(spark, path)
    flagged = raw.withColumn("_bad", is_bad(raw))
    observation = Observation("usage_lines")
    observed = flagged.observe(observation, F.count(F.lit(1)).alias("lines"),
                               F.sum(F.col("_bad").cast(LongType())).alias("bad"))
    return Ingested(flatten(observed.filter(~F.col("_bad"))), observation)
