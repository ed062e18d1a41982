"""report.html: one self-contained page (plots embedded as base64 PNGs, also saved in plots/).

It collects only bounded results from Spark: the top rows of each table, the hourly series of the
few tenants it plots, and the hour-of-day means of the busiest tenants.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kafka_quota_proxy.analytics import plots
from kafka_quota_proxy.analytics.measures import (
    BYTE_MEASURES,
    MEASURES,
    TOPIC_MEASURES,
    USER_MEASURES,
    Measure,
)
from kafka_quota_proxy.analytics.readable import format_bytes, format_value
from kafka_quota_proxy.analytics.recommend import Recommendations
from kafka_quota_proxy.analytics.stats import to_pandas
from kafka_quota_proxy.analytics.summary import Summary
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaResolver, QuotaStore

PLOTTED_TENANTS = 6
TABLE_ROWS = 20
HEATMAP_TENANTS = 20
Quotas = Mapping[QuotaEntity, Mapping[QuotaKey, float]]


@dataclass
class Inputs:
    """The tables and results report.html is drawn from."""

    summary: Summary
    tenants: DataFrame
    hours: DataFrame
    hour_of_day: DataFrame
    outliers: pd.DataFrame
    recommendations: Recommendations
    replayed: DataFrame
    scenarios: Mapping[str, Quotas | None]
    top: int
    topics: DataFrame  # analytics/topics.py's report; empty without usage_log.topics


def label(user: str, client_id: str | None) -> str:
    """A tenant as `user / client-id`; a user alone (producer ids are per user) as its name."""
    if client_id is None:
        return user
    return f"{user} / {client_id or '(no client-id)'}"


def _labels(frame: pd.DataFrame) -> list[str]:
    return [label(u, c) for u, c in zip(frame["user"], frame["client_id"], strict=True)]


def _utc(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _duration(ms: float) -> str:
    if ms >= 3_600_000:
        return f"{ms / 3_600_000:.1f} h"
    if ms >= 60_000:
        return f"{ms / 60_000:.1f} min"
    return f"{ms / 1000:.1f} s"


def _share(x: float) -> str:
    return "" if x != x else f"{100 * x:.1f} %"


def _table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "<p><em>none</em></p>"
    return frame.to_html(index=False, escape=True, border=0, classes="t", na_rep="")


def _img(name: str, png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode()
    return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption>plots/{name}</figcaption></figure>")


# ---- collecting (bounded) --------------------------------------------------------------------


def _top(tenants: DataFrame, order: str, n: int) -> list[tuple[str, str]]:
    rows = (tenants.filter(F.col(order) > 0).orderBy(F.col(order).desc(), "user", "client_id").limit(n)
            .select("user", "client_id").collect())
    return [(r.user, r.client_id) for r in rows]


def _only(frame: DataFrame, tenants: list[tuple[str, str]]) -> DataFrame:
    wanted = frame.sparkSession.createDataFrame(tenants, "user string, client_id string")
    return frame.join(F.broadcast(wanted), ["user", "client_id"])


def _quota(quotas: Quotas | None, key: QuotaKey, user: str, client_id: str) -> float | None:
    if quotas is None:
        return None
    return QuotaResolver(QuotaStore(quotas), key).resolve(user, client_id).quota


def _series(inputs: Inputs, m: Measure) -> list[plots.TenantSeries]:
    tenants = _top(inputs.tenants, m.amount, PLOTTED_TENANTS)
    if not tenants:
        return []
    frame = to_pandas(_only(inputs.hours, tenants).select(
        "user", "client_id", "hour_ms", F.col(f"{m.name}_mean").alias("mean"),
        F.col(f"{m.name}_peak").alias("peak"), F.col(f"quota_{m.key.value}").alias("quota")))
    s = inputs.summary
    every_hour = pd.RangeIndex(s.first_ms // 3_600_000 * 3_600_000, s.end_ms, 3_600_000)
    out = []
    for user, client in tenants:
        one = frame[(frame["user"] == user) & (frame["client_id"] == client)].set_index("hour_ms")
        # No line for an hour means no usage in it: zero, not a gap.
        one = one.reindex(every_hour).fillna({"mean": 0.0, "peak": 0.0})
        one = one.reset_index(drop=True)
        out.append(plots.TenantSeries(
            label(user, client), pd.Series(pd.to_datetime(every_hour, unit="ms")), one["mean"], one["peak"],
            one["quota"].astype(float),
            {name: _quota(quotas, m.key, user, client) for name, quotas in inputs.scenarios.items()}))
    return out


def _replay_rows(replayed: DataFrame) -> pd.DataFrame:
    worst = (replayed.groupBy("user", "client_id").agg(F.max("throttle_ms").alias("worst"))
             .filter(F.col("worst") > 0).orderBy(F.col("worst").desc(), "user", "client_id").limit(TABLE_ROWS)
             .collect())
    tenants = [(r.user, r.client_id) for r in worst]
    if not tenants:
        return pd.DataFrame()
    return to_pandas(_only(replayed, tenants))


def _heatmap(inputs: Inputs) -> pd.DataFrame:
    tenants = _top(inputs.tenants.withColumn("_bytes", F.col("produce_bytes") + F.col("fetch_bytes")),
                   "_bytes", HEATMAP_TENANTS)
    if not tenants:
        return pd.DataFrame()
    frame = to_pandas(_only(inputs.hour_of_day, tenants).select(
        "user", "client_id", "hour_of_day", (F.col("produce_mean") + F.col("fetch_mean")).alias("bps")))
    frame["label"] = _labels(frame)
    grid = frame.pivot_table(index="label", columns="hour_of_day", values="bps", fill_value=0.0)
    grid = grid.reindex(columns=range(24), fill_value=0.0)
    return grid.reindex([label(u, c) for u, c in tenants])


# ---- tables -----------------------------------------------------------------------------------


def _tenant_table(tenants: DataFrame) -> pd.DataFrame:
    frame = to_pandas(tenants.withColumn("_bytes", F.col("produce_bytes") + F.col("fetch_bytes"))
                      .orderBy(F.col("_bytes").desc(), "user", "client_id").limit(TABLE_ROWS))
    out = pd.DataFrame({"tenant": _labels(frame),
                        "intervals": frame["intervals"],
                        "produced": frame["produce_bytes"].map(format_bytes),
                        "fetched": frame["fetch_bytes"].map(format_bytes)})
    for m in BYTE_MEASURES:
        for p in ("p50", "p99", "max"):
            out[f"{m.name} {p}"] = frame[f"{m.name}_{p}"].map(lambda v, u=m.unit: format_value(v, u))
    for m in (m for m in MEASURES if m not in BYTE_MEASURES):
        out[f"{m.name} p99"] = frame[f"{m.name}_p99"].map(lambda v, u=m.unit: format_value(v, u))
    out["throttle produce"] = frame["throttle_produce_ms"].map(_duration)
    out["throttle fetch"] = frame["throttle_fetch_ms"].map(_duration)
    out["throttled intervals"] = frame["throttled_interval_share"].map(_share)
    out["throttled time"] = frame["throttled_time_share"].map(_share)
    return out


def _topic_table(topics: DataFrame) -> pd.DataFrame:
    frame = to_pandas(topics.withColumn("_bytes", F.col("produce_bytes") + F.col("fetch_bytes"))
                      .orderBy(F.col("_bytes").desc(), "topic").limit(TABLE_ROWS))
    out = pd.DataFrame({"topic": frame["topic"], "intervals": frame["intervals"],
                        "written": frame["produce_bytes"].map(format_bytes),
                        "read": frame["fetch_bytes"].map(format_bytes)})
    for m in TOPIC_MEASURES:
        for p in ("p50", "p99", "max"):
            out[f"{m.name} {p}"] = frame[f"{m.name}_{p}"].map(lambda v, u=m.unit: format_value(v, u))
    out["writers"] = frame["writers"]
    out["readers"] = frame["readers"]
    out["top writer"] = frame["top_writer"].fillna("")
    out["top reader"] = frame["top_reader"].fillna("")
    out["refused, produce"] = frame["produce_refused_interval_share"].map(_share)
    out["refused, fetch"] = frame["fetch_refused_interval_share"].map(_share)
    return out


def _outlier_table(outliers: pd.DataFrame) -> pd.DataFrame:
    if outliers.empty:
        return outliers
    units = outliers["unit"]
    return pd.DataFrame({
        "measure": outliers["measure"], "rank": outliers["rank"],
        "tenant": _labels(outliers),
        "p99 demand": [format_value(v, u) for v, u in zip(outliers["p99_demand"], units, strict=True)],
        "p99 measured": [format_value(v, u) for v, u in zip(outliers["p99"], units, strict=True)],
        "max": [format_value(v, u) for v, u in zip(outliers["max"], units, strict=True)],
        "x median tenant": outliers["times_median"].map(lambda x: "" if x != x else f"{x:.1f}")})


def _quota_value(value: float, unit: str) -> str:
    return f"{value:g}" + (f" ({format_value(value, unit)})" if unit == "B/s" else "")


def _recommendation_table(recs: Recommendations) -> pd.DataFrame:
    return pd.DataFrame({
        "key": [r.measure.key.value for r in recs.items],
        "entity": [r.entity.describe() for r in recs.items],
        "kind": [r.kind for r in recs.items],
        "value": [_quota_value(r.value, r.measure.unit) for r in recs.items],
        "from p99 demand": [format_value(r.basis, r.measure.unit) for r in recs.items]})


def _replay_table(rows: pd.DataFrame, kinds: dict[str, str]) -> pd.DataFrame:
    if rows.empty:
        return rows
    wide = rows.pivot_table(index=["user", "client_id", "kind"], columns="scenario",
                            values=["quota", "throttle_ms", "delayed_bytes", "backlog_bytes", "demand_bytes",
                                    "recorded_throttle_ms"], aggfunc="first")
    out = []
    for (user, client, kind), r in wide.iterrows():
        row = {"tenant": label(user, client), "kind": kinds[kind],
               "demand": format_bytes(r[("demand_bytes", "current")]),
               "recorded throttle": _duration(r[("recorded_throttle_ms", "current")])}
        for scenario in ("current", "candidate"):
            q = r[("quota", scenario)]
            row[f"{scenario} quota"] = "none" if q != q else format_value(q, "B/s")
            row[f"{scenario} throttle"] = _duration(r[("throttle_ms", scenario)])
            row[f"{scenario} delayed"] = format_bytes(r[("delayed_bytes", scenario)])
            row[f"{scenario} backlog"] = format_bytes(r[("backlog_bytes", scenario)])
        out.append(row)
    return pd.DataFrame(out)


def _throttle_bars(rows: pd.DataFrame) -> pd.DataFrame:
    if rows.empty:
        return pd.DataFrame(columns=["label", "current_ms", "candidate_ms"])
    per = rows.groupby(["user", "client_id", "scenario"], as_index=False)["throttle_ms"].sum()
    wide = per.pivot_table(index=["user", "client_id"], columns="scenario", values="throttle_ms",
                           fill_value=0).reset_index()
    frame = pd.DataFrame({"label": _labels(wide), "current_ms": wide.get("current", 0),
                          "candidate_ms": wide.get("candidate", 0)})
    frame["worst"] = frame[["current_ms", "candidate_ms"]].max(axis=1)
    return frame.sort_values(["worst", "label"], ascending=[False, True]).head(15).drop(columns="worst")


# ---- the page ---------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{margin-bottom:.2em} h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table.t{border-collapse:collapse;font-size:13px;margin:.5em 0}
table.t th,table.t td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
table.t th{background:#f4f4f4} table.t td:first-child,table.t th:first-child{text-align:left}
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:12px}
figure{margin:1em 0} img{max-width:100%} figcaption{font-size:11px;color:#888}
.note{color:#555;font-size:14px;max-width:60em}
"""

DEMAND_MODEL = """In each interval a tenant's demand is what it sent plus what its recorded throttle
held back: <code>demand = bytes + throttle_ms / 1000 &times; Q</code>, Q being the quota recorded as in
force (Kafka's throttle formula read backwards: a throttle of T means the client was T &times; Q bytes
ahead of its quota). A tenant throttled for the whole interval so reads as at least twice its quota;
more the log cannot show. The replay sends each interval's demand evenly over the interval in
min(requests, 10) requests through the proxy's own quota engine (ClientQuotaManager, QuotaStore,
LocalSensors, the same window), with Kafka's precedence and shared sensors. The client is muted for
each throttle it gets (KIP-219); what is still waiting at the end of an interval carries over.
Produce is charged when sent; a Fetch over quota is answered empty, un-recorded and asked again after
its throttle. <em>Delayed</em> = bytes sent later than due; <em>backlog</em> = bytes still waiting when
the log ends."""


def _replay_totals(replayed: DataFrame) -> list[tuple[str, str]]:
    """Per scenario: the replayed throttle time and how many tenants get any."""
    totals = to_pandas(replayed.groupBy("scenario").agg(
        F.sum("throttle_ms").alias("ms"),
        F.countDistinct(F.when(F.col("throttle_ms") > 0, F.struct("user", "client_id"))).alias("tenants")))
    rows = []
    for scenario in ("current", "candidate"):
        one = totals[totals["scenario"] == scenario]
        ms, tenants = (int(one["ms"].iloc[0]), int(one["tenants"].iloc[0])) if len(one) else (0, 0)
        rows.append((f"replayed throttle, {scenario} quotas",
                     f"{_duration(ms)} over {tenants} tenant{'' if tenants == 1 else 's'}"))
    return rows


def _summary_table(s: Summary, replay_totals: list[tuple[str, str]]) -> pd.DataFrame:
    rows = [("usage log", s.usage), ("lines read", f"{s.lines:,}"), ("records used", f"{s.records:,}"),
            ("bad lines skipped", f"{s.bad_lines:,}"), ("tenants (user, client-id)", f"{s.tenants:,}"),
            ("users", f"{s.users:,}"), ("topics", f"{s.topics:,}"),
            ("time range", f"{_utc(s.first_ms)} to {_utc(s.end_ms)}"),
            ("quota window", f"{s.window_num} samples of {s.window_size_seconds} s"),
            ("current quotas", s.current), ("candidate quotas", s.candidate), *replay_totals,
            ("stages", ", ".join(f"{k} {v:.1f} s" for k, v in s.seconds.items()))]
    return pd.DataFrame(rows, columns=["", "value"])


def _per_user() -> str:
    keys = " and ".join(m.key.value for m in USER_MEASURES)
    return f"{keys} {'is' if len(USER_MEASURES) == 1 else 'are'} per user, from hourly rates." if keys else ""


def write(out: Path, inputs: Inputs) -> Path:
    """Collect, plot and write report.html (and plots/*.png) under `out`."""
    figures = {  # usage-produce.png, usage-fetch.png
        f"usage-{m.name}.png": plots.usage_against_quota(
            _series(inputs, m),
            f"{m.name.capitalize()} rate against quota, hourly: the top {PLOTTED_TENANTS} tenants by "
            f"{m.name} bytes")
        for m in BYTE_MEASURES}
    replay_rows = _replay_rows(inputs.replayed)
    figures["throttle-current-vs-candidate.png"] = plots.throttle_before_after(
        _throttle_bars(replay_rows), f"current ({inputs.summary.current})",
        f"candidate ({inputs.summary.candidate})",
        "Replayed throttle time per tenant (produce + fetch), current vs candidate quotas")
    figures["hour-of-day.png"] = plots.hour_of_day_heatmap(
        _heatmap(inputs),
        f"Hour-of-day pattern of produce + fetch bytes/s, top {HEATMAP_TENANTS} tenants by bytes")
    (out / "plots").mkdir(exist_ok=True)
    for name, png in figures.items():
        (out / "plots" / name).write_bytes(png)

    recs = inputs.recommendations
    kinds = {"produce": "produce (producer_byte_rate)", "fetch": "fetch (consumer_byte_rate)"}
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in recs.notes)
    parts = [
        "<h1>Usage report</h1>",
        f"<p class=note>kafka-quota-proxy analyze, {html.escape(inputs.summary.usage)}</p>",
        "<h2>Summary</h2>", _table(_summary_table(inputs.summary, _replay_totals(inputs.replayed))),
        f"<h2>Tenants</h2><p class=note>The top {TABLE_ROWS} tenants by bytes produced and fetched. "
        "Rates are per interval (the amount over the interval's length); percentiles are over the "
        "intervals the tenant was active in. Request time is a percentage of one thread, as "
        "request_percentage counts it. Every tenant is in tenants.csv / tenants.parquet.</p>",
        _table(_tenant_table(inputs.tenants)),
        _img("hour-of-day.png", figures["hour-of-day.png"], "hour-of-day pattern"),
        "<h2>Topics</h2>",
        (f"<p class=note>The top {TABLE_ROWS} of {inputs.summary.topics} topics by bytes written and read. "
         "A topic's rate is its bytes from every client and proxy instance in an interval over the "
         "interval's length, what a topic quota holds; percentiles are over the intervals it had bytes "
         "in. <em>Refused</em> is the share of its intervals in which its topic quota refused bytes. "
         "Every topic is in topics.csv / topics.parquet.</p>" + _table(_topic_table(inputs.topics)))
        if inputs.summary.topics else
        "<p class=note>This log has no bytes per topic: turn on <code>usage_log.topics</code>.</p>",
        f"<h2>Top outliers</h2><p class=note>The top {inputs.top} tenants by each measure's p99 demand "
        "(the interval rate with held-back bytes added), and how many times the median tenant's p99 "
        "that is.</p>",
        _table(_outlier_table(inputs.outliers)),
        "<h2>Recommended quotas</h2>"
        f"<p class=note>Default: p{recs.percentile:g} over tenants of their p99 demand, "
        f"x {recs.headroom:g}, rounded up; a tenant whose p99 is above the default gets an override of "
        f"its p99 x {recs.headroom:g}. {_per_user()} Topics get "
        "the same rule over their p99 rates, every client together.</p>",
        _table(_recommendation_table(recs)),
        f"<ul class=note>{notes}</ul>" if notes else "",
        "<p>recommended-quotas.yaml (load it as the proxy's <code>quotas:</code>):</p>",
        f"<pre>{html.escape(recs.to_yaml(inputs.summary.usage))}</pre>",
        f"<p>recommended-quotas.sh:</p><pre>{html.escape(recs.to_kafka_configs())}</pre>",
        "<h2>What-if replay</h2>", f"<p class=note>{DEMAND_MODEL}</p>",
        f"<p class=note>Current: {html.escape(inputs.summary.current)}. Candidate: "
        f"{html.escape(inputs.summary.candidate)}. The {TABLE_ROWS} tenants with the most throttle in "
        "either; all are in replay.csv / replay.parquet.</p>",
        _table(_replay_table(replay_rows, kinds)),
        _img("throttle-current-vs-candidate.png", figures["throttle-current-vs-candidate.png"],
             "throttle time per tenant, current vs candidate"),
        "<h2>Usage against quota</h2>",
        *(_img(f"usage-{m.name}.png", figures[f"usage-{m.name}.png"], f"{m.name} rate against quota")
          for m in BYTE_MEASURES),
    ]
    page = ("<!doctype html><html><head><meta charset=utf-8><title>kafka-quota-proxy usage report</title>"
            f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n")
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
