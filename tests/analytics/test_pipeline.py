"""The pipeline on Spark: reading (bad lines counted and skipped), the per-tenant report against
the records themselves, recommendations that catch exactly the injected outliers and load in the
proxy, the replay's bookkeeping and hand-computed throttles, and the HTML report."""

from __future__ import annotations

import base64
import gzip
import json
import math
import re
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from pyspark.sql import SparkSession

from kafka_quota_proxy.analytics.measures import BY_NAME
from kafka_quota_proxy.analytics.pipeline import Options, analyze
from kafka_quota_proxy.analytics.quota_file import load_quota_file
from kafka_quota_proxy.analytics.readable import round_up_bytes
from kafka_quota_proxy.analytics.reading import ingest
from kafka_quota_proxy.analytics.recommend import kafka_configs_command
from kafka_quota_proxy.analytics.stats import ACCURACY
from kafka_quota_proxy.config.quota_settings import parse_quota_list, validate_quota_entries
from kafka_quota_proxy.quota import usage
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaResolver, QuotaStore
from tests.analytics.conftest import Analyzed, Generated, bad_lines
from tests.support.usage import usage_records

pytestmark = pytest.mark.spark

TABLES = ("tenants", "hourly", "hour_of_day", "users", "outliers", "recommendations", "replay", "topics")


@pytest.fixture(scope="module")
def records(generated: Generated) -> list[dict[str, Any]]:
    return usage_records(generated.dir, "proxy-a")  # every good record of the generated log


def assert_percentile(got: float, values: list[float], percentile: float) -> None:
    """percentile_approx's guarantee: one of the values, at most n / ACCURACY ranks from the
    nearest-rank percentile."""
    ordered = sorted(values)
    rank = math.ceil(percentile / 100 * len(ordered)) - 1
    slack = math.ceil(len(ordered) / ACCURACY)
    assert ordered[max(0, rank - slack)] <= got <= ordered[min(len(ordered) - 1, rank + slack)]
    assert any(math.isclose(got, v, rel_tol=1e-12) for v in ordered[max(0, rank - slack):rank + slack + 1])


def read_table(analyzed: Analyzed, name: str) -> pd.DataFrame:
    return pd.read_parquet(analyzed.out / f"{name}.parquet")


def recommended(analyzed: Analyzed) -> dict[QuotaEntity, dict[QuotaKey, float]]:
    return recommended_quotas(analyzed.out)


def recommended_quotas(out: Path) -> dict[QuotaEntity, dict[QuotaKey, float]]:
    text = (out / "recommended-quotas.yaml").read_text()
    return validate_quota_entries(parse_quota_list(yaml.safe_load(text)["quotas"]))


# ---- reading -------------------------------------------------------------------------------------


def test_bad_and_partial_lines_are_counted_and_skipped(spark: SparkSession, tmp_path: Path) -> None:
    hour = tmp_path / "dt=2026-01-05" / "hour=00"
    hour.mkdir(parents=True)
    good = usage.record(1767571200000, 10, "p", "alice", "app",
                        {"produce_bytes": 100, "request_time_ms": 0.5}, {"produce": 2}, {"produce": 30},
                        {"produce": 1}, {"producer_byte_rate": 1000.0})
    spelled_as_float = json.dumps({**good, "start_ms": good["start_ms"] + 10_000, "fetch_bytes": 5.0})
    (hour / "usage-p.jsonl").write_text("\n".join([json.dumps(good), *bad_lines(), spelled_as_float]) + "\n")
    with gzip.open(tmp_path / "dt=2026-01-05" / "hour=00" / "usage-q.jsonl.gz", "wt") as f:
        f.write(json.dumps({**good, "instance": "q"}) + "\n" + "{\"v\": 1, \"start_ms\": \n")
    # A gzip cut short, as a crash while compressing leaves it: the whole lines before the break count.
    lines = "".join(json.dumps({**good, "instance": "r", "start_ms": good["start_ms"] + k * 10_000}) + "\n"
                    for k in range(300))
    compressed = gzip.compress(lines.encode())[:1400]
    whole = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(compressed).count(b"\n")
    (tmp_path / "dt=2026-01-05" / "hour=01").mkdir()
    (tmp_path / "dt=2026-01-05" / "hour=01" / "usage-r.jsonl.gz").write_bytes(compressed)
    (tmp_path / "notes.txt").write_text("not a usage file\n")
    ingested = ingest(spark, str(tmp_path))
    rows = sorted(ingested.records.collect(), key=lambda r: (r.instance, r.start_ms))
    # 3 good lines; 7 bad in the plain file, 1 cut short in the gzip; the broken gzip's whole lines.
    assert 0 < whole < 300
    assert ingested.counts() == (11 + whole, 8)
    assert [(r.instance, r.start_ms, r.produce_bytes, r.fetch_bytes) for r in rows if r.instance != "r"] == [
        ("p", 1767571200000, 100, 0), ("p", 1767571210000, 100, 5), ("q", 1767571200000, 100, 0)]
    recovered = [r.start_ms for r in rows if r.instance == "r"]
    assert recovered == [good["start_ms"] + k * 10_000 for k in range(whole)]
    first = rows[0].asDict()
    assert (first["requests_produce"], first["throttle_produce_ms"], first["throttled_produce"]) == (2, 30, 1)
    assert first["request_time_ms"] == 0.5 and first["quota_producer_byte_rate"] == 1000.0
    assert first["quota_consumer_byte_rate"] is None
    assert "dt" not in first and "hour" not in first  # partition directories are not data


def test_the_run_counts_the_bad_lines_and_succeeds(analyzed: Analyzed, generated: Generated) -> None:
    s = analyzed.summary
    assert s["bad_lines"] == generated.bad_lines == 7
    assert s["records"] == generated.manifest["records"] == 57_600
    assert s["lines"] == s["records"] + s["bad_lines"]
    assert s["tenants"] == 40
    assert s["first_ms"] == 1767571200000 and s["end_ms"] == 1767571200000 + 86_400_000
    first_line = analyzed.stdout.splitlines()[0]
    assert first_line.startswith("read 57,600 records of 40 tenants (7 bad lines skipped) in ")


# ---- the per-tenant report -----------------------------------------------------------------------


def test_tenant_totals_and_percentiles_are_the_records(analyzed: Analyzed,
                                                       records: list[dict[str, Any]]) -> None:
    tenants = read_table(analyzed, "tenants").set_index(["user", "client_id"])
    assert len(tenants) == 40
    by_tenant: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_tenant[(r["user"], r["client_id"])].append(r)
    for tenant, rs in by_tenant.items():
        row = tenants.loc[tenant]
        assert row["intervals"] == len(rs) == 1440
        assert row["produce_bytes"] == sum(r["produce_bytes"] for r in rs)
        assert row["fetch_bytes"] == sum(r["fetch_bytes"] for r in rs)
        assert row["requests"] == sum(sum(r["requests"].values()) for r in rs)
        assert row["throttle_fetch_ms"] == sum(r["throttle_ms"]["fetch"] for r in rs)
        assert row["new_producer_ids"] == sum(r["new_producer_ids"] for r in rs)
        rates = [r["produce_bytes"] / 60 for r in rs]
        assert row["produce_max"] == max(rates)
        assert_percentile(row["produce_p50"], rates, 50)
        assert_percentile(row["produce_p99"], rates, 99)
        held = [r["throttle_ms"]["fetch"] / 1000 * r["quotas"]["consumer_byte_rate"] for r in rs]
        demand = [(r["fetch_bytes"] + h) / 60 for r, h in zip(rs, held, strict=True)]
        assert_percentile(row["demand_fetch_p99"], demand, 99)
        assert_percentile(row["request_p99"], [r["request_time_ms"] * 0.1 / 60 for r in rs], 99)
        throttled = [r for r in rs if any(r["throttle_ms"].values())]
        assert row["throttled_interval_share"] == pytest.approx(len(throttled) / 1440, rel=1e-12)
        assert row["quota_consumer_byte_rate"] == 4194304.0 and math.isnan(row["quota_request_percentage"])


def test_hourly_and_hour_of_day_tables(analyzed: Analyzed, records: list[dict[str, Any]]) -> None:
    hourly = read_table(analyzed, "hourly")
    assert len(hourly) == 40 * 24
    one = hourly[(hourly["client_id"] == "svc-000-app") & (hourly["hour_of_day"] == 13)].iloc[0]
    in_hour = [r for r in records if r["client_id"] == "svc-000-app"
               and (r["start_ms"] - 1767571200000) // 3_600_000 == 13]
    assert one["produce_bytes"] == sum(r["produce_bytes"] for r in in_hour)
    assert one["produce_mean"] == pytest.approx(one["produce_bytes"] / 3600)
    assert one["produce_peak"] == max(r["produce_bytes"] for r in in_hour) / 60
    by_hour = read_table(analyzed, "hour_of_day")
    assert len(by_hour) == 40 * 24  # one day: each hour of day once
    same = by_hour[(by_hour["client_id"] == "svc-000-app") & (by_hour["hour_of_day"] == 13)].iloc[0]
    assert same["produce_mean"] == pytest.approx(one["produce_mean"])


def test_every_table_is_parquet_and_csv(analyzed: Analyzed) -> None:
    for name in TABLES:
        frame = read_table(analyzed, name)
        csv = analyzed.out / f"{name}.csv"
        parts = sorted(csv.glob("part-*.csv")) if csv.is_dir() else [csv]
        assert len(parts) == 1
        assert len(pd.read_csv(parts[0])) == len(frame) > 0, name


def test_outliers_rank_each_measure(analyzed: Analyzed, generated: Generated) -> None:
    outliers = read_table(analyzed, "outliers")
    assert list(outliers["measure"].unique()) == ["produce", "fetch", "request", "mutations", "producer_ids"]
    for _, top in outliers.groupby("measure", sort=False):
        assert top["rank"].tolist() == list(range(1, 11))
        assert top["p99_demand"].is_monotonic_decreasing
    # Producer ids rank users, by hourly rates as the quota measures them.
    ids = outliers[outliers["measure"] == "producer_ids"]
    assert ids["client_id"].isna().all()
    users = read_table(analyzed, "users").set_index("user")
    assert ids["p99_demand"].tolist() == users.loc[ids["user"], "producer_ids_p99"].tolist()
    injected_ids = [o["user"] for o in generated.manifest["outliers"] if "producer_ids" in o["measures"]]
    assert ids["user"].tolist()[:len(injected_ids)] == injected_ids
    injected = {(o["user"], o["client_id"]) for o in generated.manifest["outliers"]
                if {"produce", "fetch", "request"} & set(o["measures"])}
    leaders = outliers[(outliers["rank"] == 1) & outliers["measure"].isin(["produce", "fetch", "request"])]
    firsts = {(r.user, r.client_id) for r in leaders.itertuples()}
    assert firsts <= injected


# ---- recommendations -----------------------------------------------------------------------------


def test_the_injected_outliers_are_exactly_the_tenants_given_overrides(analyzed: Analyzed,
                                                                       generated: Generated) -> None:
    quotas = {e: v for e, v in recommended(analyzed).items() if e.topic is None}  # the clients'
    overridden = {(e.user, e.client_id) for e in quotas if e.client_id not in (None, DEFAULT)}
    overridden_users = {e.user for e in quotas if e.client_id is None and e.user != DEFAULT}
    injected = generated.manifest["outliers"]
    assert overridden | {(u, f"{u}-app") for u in overridden_users} == {(o["user"], o["client_id"])
                                                                           for o in injected}
    # Each injected measure got its override (producer ids on the user).
    for o in injected:
        for measure in o["measures"]:
            key = BY_NAME[measure].key
            entity = (QuotaEntity(user=o["user"]) if measure == "producer_ids"
                      else QuotaEntity(user=o["user"], client_id=o["client_id"]))
            assert key in quotas.get(entity, {}), (o, measure)
    # Defaults for every key the tenants use.
    assert set(quotas[QuotaEntity(user=DEFAULT, client_id=DEFAULT)]) == {
        QuotaKey.PRODUCER_BYTE_RATE, QuotaKey.CONSUMER_BYTE_RATE, QuotaKey.REQUEST_PERCENTAGE,
        QuotaKey.CONTROLLER_MUTATION_RATE}
    assert set(quotas[QuotaEntity(user=DEFAULT)]) == {QuotaKey.PRODUCER_IDS_RATE}


def test_the_recommended_files_load_in_the_proxy(analyzed: Analyzed) -> None:
    quotas = recommended(analyzed)
    assert load_quota_file(str(analyzed.out / "recommended-quotas.yaml")).quotas == quotas
    script = (analyzed.out / "recommended-quotas.sh").read_text()
    # Every entity but the default topic, which kafka-configs.sh cannot name (a comment says so).
    assert [line for line in script.splitlines() if line.startswith("kafka-configs.sh")] == [
        kafka_configs_command(e, v) for e, v in quotas.items() if e != QuotaEntity(topic=DEFAULT)]
    assert QuotaEntity(topic=DEFAULT) in quotas and "\n# topic <default>: producer_byte_rate=" in script
    table = read_table(analyzed, "recommendations")
    assert len(table) == sum(len(v) for v in quotas.values())


# ---- replay --------------------------------------------------------------------------------------


def test_the_replay_accounts_for_every_byte(analyzed: Analyzed, records: list[dict[str, Any]]) -> None:
    replay = read_table(analyzed, "replay")
    quotas = recommended(analyzed)
    demand: dict[tuple[str, str, str], int] = defaultdict(int)
    throttle: dict[tuple[str, str, str], int] = defaultdict(int)
    for r in records:
        for kind, amount, key in (("produce", "produce_bytes", "producer_byte_rate"),
                                  ("fetch", "fetch_bytes", "consumer_byte_rate")):
            if r[amount] or r["throttle_ms"][kind]:
                demand[(r["user"], r["client_id"], kind)] += round(
                    r[amount] + r["throttle_ms"][kind] / 1000 * r["quotas"][key])
                throttle[(r["user"], r["client_id"], kind)] += r["throttle_ms"][kind]
    assert set(replay["scenario"]) == {"current", "candidate"}
    assert len(replay) == 2 * len(demand)
    keys = {"produce": QuotaKey.PRODUCER_BYTE_RATE, "fetch": QuotaKey.CONSUMER_BYTE_RATE}
    for row in replay.itertuples():
        tenant = (row.user, row.client_id, row.kind)
        assert row.demand_bytes == demand[tenant]
        assert row.recorded_throttle_ms == throttle[tenant]
        assert row.sent_bytes + row.backlog_bytes == row.demand_bytes
        assert row.delayed_bytes <= row.sent_bytes
        assert row.simulated_intervals + row.fast_intervals + row.skipped_intervals == 1440
        if row.scenario == "candidate":
            resolver = QuotaResolver(QuotaStore(quotas), keys[row.kind])
            assert row.quota == resolver.resolve(row.user, row.client_id).quota
        else:
            assert row.quota == {"produce": 2097152.0, "fetch": 4194304.0}[row.kind]
    # Under the current quotas the tenants held to them are throttled; the candidate quotas, made
    # from everyone's demand with headroom, throttle a small fraction of that (a tenant's rare
    # bursts above its p99 still can be).
    current = replay[replay["scenario"] == "current"]
    assert current[current["recorded_throttle_ms"] > 0]["throttle_ms"].gt(0).all()
    candidate = replay[replay["scenario"] == "candidate"]
    assert candidate["throttle_ms"].sum() < current["throttle_ms"].sum() / 100


def test_a_proxy_config_as_current_quotas_and_a_candidate_file(spark: SparkSession, tmp_path: Path) -> None:
    # Two intervals of alice's Produce, 6000 then 5000 B in one request each. The proxy's config
    # sets 500 B/s and a 6-sample window; the candidate 600 B/s. By Kafka's formula (N = 6, the
    # fresh window is 5 s): current 7000 + 5000 ms, candidate 5000 + 3333 ms (see test_replay).
    hour = tmp_path / "usage" / "dt=2026-01-05" / "hour=00"
    hour.mkdir(parents=True)
    lines = [usage.record(1767571200000 + k * 10_000, 10, "p", "alice", "app", {"produce_bytes": b},
                          {"produce": 1}, {}, {}, {}) for k, b in enumerate((6000, 5000))]
    (hour / "usage-p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    config = tmp_path / "proxy.yaml"
    config.write_text("upstream: [kafka-1:9092]\nlisten: 0.0.0.0:9092\n"
                      "quota:\n  mode: enforce\n  window_num: 6\n  window_size_seconds: 1\n"
                      "quotas:\n  - user: alice\n    producer_byte_rate: 500\n")
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text("quotas:\n  - {user: <default>, producer_byte_rate: 600}\n")
    out = tmp_path / "out"
    summary = analyze(spark, Options(str(tmp_path / "usage"), str(out), str(config), str(candidate)))
    assert (summary.window_num, summary.window_size_seconds) == (6, 1)
    assert (summary.current, summary.candidate) == (str(config), str(candidate))
    replay = pd.read_parquet(out / "replay.parquet").set_index("scenario")
    columns = ["quota", "throttle_ms", "throttled_requests", "backlog_bytes"]
    assert replay.loc["current", columns].tolist() == [500.0, 12000, 2, 0]
    assert replay.loc["candidate", columns].tolist() == [600.0, 8333, 2, 0]


def test_the_workers_of_one_proxy_are_read_as_instances_of_their_own(spark: SparkSession,
                                                                      tmp_path: Path) -> None:
    # `--workers 2` writes usage-<instance>-w0 and -w1, each worker measuring its own share: the
    # same two intervals as above through each worker are two instances' (2 in the tenant's
    # report), replayed apart (each 7000 + 5000 ms) and summed, not one instance's 11000+ bytes.
    hour = tmp_path / "usage" / "dt=2026-01-05" / "hour=00"
    hour.mkdir(parents=True)
    for worker in ("gw-w0", "gw-w1"):
        lines = [usage.record(1767571200000 + k * 10_000, 10, worker, "alice", "app", {"produce_bytes": b},
                              {"produce": 1}, {}, {}, {}) for k, b in enumerate((6000, 5000))]
        (hour / f"usage-{worker}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    config = tmp_path / "proxy.yaml"
    config.write_text("upstream: [kafka-1:9092]\nworkers: 2\n"
                      "quota:\n  window_num: 6\n  window_size_seconds: 1\n"
                      "quotas:\n  - user: alice\n    producer_byte_rate: 500\n")
    out = tmp_path / "out"
    analyze(spark, Options(str(tmp_path / "usage"), str(out), str(config)))
    tenants = pd.read_parquet(out / "tenants.parquet").set_index("user")
    assert tenants.loc["alice", ["instances", "produce_bytes"]].tolist() == [2, 22000]
    replay = pd.read_parquet(out / "replay.parquet").set_index("scenario")
    assert replay.loc["current", ["throttle_ms", "throttled_requests"]].tolist() == [24000, 4]


# ---- the report ----------------------------------------------------------------------------------


def test_the_html_report_embeds_its_plots(analyzed: Analyzed) -> None:
    page = (analyzed.out / "report.html").read_text()
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    names = ["hour-of-day.png", "throttle-current-vs-candidate.png", "usage-produce.png", "usage-fetch.png"]
    assert len(embedded) == len(names)
    saved = {name: (analyzed.out / "plots" / name).read_bytes() for name in names}
    assert sorted(base64.b64decode(e) for e in embedded) == sorted(saved.values())
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000 for png in saved.values())
    for heading in ("Summary", "Tenants", "Top outliers", "Recommended quotas", "What-if replay",
                    "Usage against quota"):
        assert f"<h2>{heading}</h2>" in page
    assert "<td>bad lines skipped</td>\n      <td>7</td>" in page
    assert "<td>records used</td>\n      <td>57,600</td>" in page
    replay = read_table(analyzed, "replay")
    for scenario in ("current", "candidate"):
        rows = replay[(replay["scenario"] == scenario) & (replay["throttle_ms"] > 0)]
        tenants = len(rows[["user", "client_id"]].drop_duplicates())
        row = rf"<td>replayed throttle, {scenario} quotas</td>\n\s*<td>[^<]* over {tenants} tenants?</td>"
        assert re.search(row, page)
    assert "demand = bytes + throttle_ms / 1000 &times; Q" in page
    assert "  - user: &lt;default&gt;\n    client-id: &lt;default&gt;\n" in page  # the YAML, escaped
    assert "src=" not in page.replace('src="data:image/png;base64,', "")  # nothing fetched from elsewhere


# ---- topics ----------------------------------------------------------------------------------------


def test_the_hottest_topics_and_their_quotas(spark: SparkSession, tmp_path: Path) -> None:
    """Version-2 records' bytes per topic, from two instances and tenants, summed per topic and
    interval; a version-1 record (no topics) is read as a record without topics."""
    t0 = 1767571200000
    hour = tmp_path / "usage" / "dt=2026-01-05" / "hour=00"
    hour.mkdir(parents=True)

    def rec(instance: str, user: str, start_ms: int, topics: dict[str, list[int]]) -> dict[str, Any]:
        return usage.record(start_ms, 10, instance, user, "app", {"produce_bytes": 1}, {"produce": 1},
                            {}, {}, {}, topics)

    p_lines = [rec("p", "alice", t0, {"hot": [10_000, 0, 500, 0], "cold": [1000, 0, 0, 0]}),
               rec("p", "alice", t0 + 10_000, {"hot": [20_000, 0, 0, 0]})]
    q_lines = [rec("q", "bob", t0, {"hot": [5000, 0, 0, 0], "cold": [0, 2000, 0, 0]}),
               rec("q", "bob", t0 + 10_000, {"hot": [0, 30_000, 0, 0]})]
    old = {k: v for k, v in rec("r", "carol", t0, {}).items() if k != "topics"} | {"v": 1}
    (hour / "usage-p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in p_lines))
    (hour / "usage-q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in q_lines))
    (hour / "usage-r.jsonl").write_text(json.dumps(old) + "\n")
    out = tmp_path / "out"
    summary = analyze(spark, Options(str(tmp_path / "usage"), str(out)))
    assert (summary.records, summary.bad_lines, summary.tenants, summary.topics) == (5, 0, 3, 2)
    topics = pd.read_parquet(out / "topics.parquet").set_index("topic")
    # hot: 15,000 B in the first interval (1500 B/s, 500 refused), 20,000 in the second (2000 B/s);
    # read only in the second (3000 B/s). Percentiles are over the intervals with bytes.
    hot = topics.loc["hot"]
    assert hot[["intervals", "produce_bytes", "fetch_bytes", "produce_refused_bytes", "fetch_refused_bytes"]
               ].tolist() == [2, 35_000, 30_000, 500, 0]
    rates = ["produce_p50", "produce_p99", "produce_max", "fetch_p50", "fetch_p99", "fetch_max"]
    assert hot[rates].tolist() == [1500.0, 2000.0, 2000.0, 3000.0, 3000.0, 3000.0]
    assert hot[["produce_refused_interval_share", "fetch_refused_interval_share"]].tolist() == [0.5, 0.0]
    assert hot[["writers", "readers", "top_writer", "top_writer_bytes", "top_reader", "top_reader_bytes"]
               ].tolist() == [2, 1, "alice/app", 30_000, "bob/app", 30_000]
    cold = topics.loc["cold"]
    assert cold[["intervals", "produce_p99", "fetch_p99", "writers", "readers"]].tolist() == [
        1, 100.0, 200.0, 1, 1]
    # Recommended: the p95 of the two topics' p99 (the hotter one's) x 1.5, no override needed.
    quotas = recommended_quotas(out)
    assert quotas[QuotaEntity(topic=DEFAULT)] == {QuotaKey.PRODUCER_BYTE_RATE: float(round_up_bytes(3000)),
                                                  QuotaKey.CONSUMER_BYTE_RATE: float(round_up_bytes(4500))}
    assert "topic hot: its producer_byte_rate quota refused bytes in 50% of its intervals" in (
        out / "recommended-quotas.yaml").read_text()
    page = (out / "report.html").read_text()
    assert "<h2>Topics</h2>" in page and "<td>alice/app</td>" in page


def test_a_log_without_topics_says_how_to_get_them(spark: SparkSession, tmp_path: Path) -> None:
    hour = tmp_path / "usage" / "dt=2026-01-05" / "hour=00"
    hour.mkdir(parents=True)
    line = usage.record(1767571200000, 10, "p", "alice", "app", {"produce_bytes": 10}, {"produce": 1},
                        {}, {}, {})
    (hour / "usage-p.jsonl").write_text(json.dumps(line) + "\n")
    summary = analyze(spark, Options(str(tmp_path / "usage"), str(tmp_path / "out")))
    assert summary.topics == 0 and pd.read_parquet(tmp_path / "out" / "topics.parquet").empty
    assert "This log has no bytes per topic: turn on <code>usage_log.topics</code>." in (
        tmp_path / "out" / "report.html").read_text()


def test_the_generated_topics_add_up_to_the_records(analyzed: Analyzed,
                                                    records: list[dict[str, Any]]) -> None:
    written: dict[str, int] = defaultdict(int)
    read: dict[str, int] = defaultdict(int)
    for r in records:
        for topic, counts in r["topics"].items():
            written[topic] += counts["produce_bytes"]
            read[topic] += counts["fetch_bytes"]
    topics = read_table(analyzed, "topics").set_index("topic")
    assert analyzed.summary["topics"] == len(topics) == 8
    assert topics["produce_bytes"].to_dict() == dict(written)
    assert topics["fetch_bytes"].to_dict() == dict(read)
    assert (topics["intervals"] == 1440).all()  # one day of 60 s intervals, every topic in each
