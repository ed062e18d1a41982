"""What the usage pipeline costs on a log of over 10 million records, in local mode.

- Generate: 100 tenants, 12 days of 10 s intervals (10,368,000 records, 288 hourly files), hours
  written in parallel processes (the generator's fast path).
- Analyze, in one local Spark session (local[*]): read (JSON to Parquet, bad lines counted),
  report and recommendations, the what-if replay (current and candidate quotas, produce and
  fetch), the HTML report. Records per second for read + report and for the replay.
- Peak memory of the driver: the Python process (getrusage) and the JVM (VmHWM of the Spark
  driver's java process, which in local mode also runs the executor), and the largest Python
  worker.
- The replay's fast paths against the plain event loop, on one day of 10 tenants of the same log.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import pandas as pd

from kafka_quota_proxy.analytics.generate import generate, make_plan
from kafka_quota_proxy.analytics.pipeline import Options, analyze
from kafka_quota_proxy.analytics.quota_file import Quotas, load_quota_file
from kafka_quota_proxy.analytics.replay import replay_unit
from kafka_quota_proxy.analytics.session import start
from kafka_quota_proxy.analytics.summary import Summary
from kafka_quota_proxy.quota.rate import MetricConfig

TENANTS = 100
DAYS = 12
INTERVAL_S = 10
MASTER = "local[*]"
DRIVER_MEMORY = "2g"
SLOW_TENANTS = 10


def _vm_hwm_kib(pid: int) -> int:
    """A process's peak resident set (VmHWM), in KiB; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _one_day_rows(usage: Path, kind: str) -> pd.DataFrame:
    """The first day of the first SLOW_TENANTS tenants, as replay input, read without Spark."""
    amount, key, quota = {"produce": ("produce_bytes", "produce", "producer_byte_rate"),
                          "fetch": ("fetch_bytes", "fetch", "consumer_byte_rate")}[kind]
    rows = []
    for path in sorted(usage.rglob("usage-*.jsonl.gz"))[:24]:
        with gzip.open(path, "rt") as f:
            for line in f:
                r = json.loads(line)
                rows.append((r["user"], r["client_id"], r["start_ms"], r["interval_s"], r[amount],
                             r["requests"][key], r["throttle_ms"][key], r["quotas"][quota]))
    frame = pd.DataFrame(rows, columns=["user", "client_id", "start_ms", "interval_s", "bytes", "requests",
                                        "throttle_ms", "recorded_quota"]).astype({"recorded_quota": float})
    keep = sorted(set(zip(frame["user"], frame["client_id"], strict=True)))[:SLOW_TENANTS]
    return frame[[pair in set(keep) for pair in zip(frame["user"], frame["client_id"], strict=True)]]


def fast_against_slow(usage: Path, candidate: Quotas) -> tuple[float, float]:
    """Seconds to replay one day of SLOW_TENANTS tenants, both kinds and scenarios: (fast, plain)."""
    units = []
    for kind in ("produce", "fetch"):
        rows = _one_day_rows(usage, kind)
        end = int(rows["start_ms"].max()) + INTERVAL_S * 1000
        units += [(tenant, kind, quotas, end) for _, tenant in rows.groupby(["user", "client_id"])
                  for quotas in (None, candidate)]
    timings = []
    for fast in (True, False):
        began = time.perf_counter()
        for tenant, kind, quotas, end in units:
            replay_unit(tenant, kind, quotas, MetricConfig(), end, fast)
        timings.append(time.perf_counter() - began)
    return timings[0], timings[1]


def run() -> list[tuple[str, str]]:
    work = Path(tempfile.mkdtemp(prefix="kqp-bench-analytics-"))
    try:
        return _run(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(work: Path) -> list[tuple[str, str]]:
    usage, out = work / "usage", work / "out"
    plan = make_plan(tenants=TENANTS, days=DAYS, interval_s=INTERVAL_S)
    workers = os.cpu_count() or 1
    generated = generate(usage, plan, workers=workers)
    on_disk = sum(p.stat().st_size for p in usage.rglob("*"))
    rows = [(f"generate {generated['records']:,} records ({TENANTS} tenants, {DAYS} days of {INTERVAL_S} s), "
             f"{workers} processes", f"{generated['seconds']:.1f} s, "
             f"{generated['records'] / generated['seconds']:,.0f} records/s"),
            ("  on disk (gzip level 1)", f"{on_disk / 2**20:,.0f} MiB")]

    began = time.perf_counter()
    spark, _ = start(MASTER, {"spark.driver.memory": DRIVER_MEMORY})
    gateway = spark.sparkContext._jvm
    assert gateway is not None
    jvm = int(gateway.java.lang.ProcessHandle.current().pid())
    try:
        summary = analyze(spark, Options(str(usage), str(out)))
        workers_kib = max((_vm_hwm_kib(p) for p in _descendants(jvm)), default=0)
        jvm_kib = _vm_hwm_kib(jvm)
    finally:
        spark.stop()
    wall = time.perf_counter() - began
    rows += _pipeline_rows(summary, wall)
    python_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rows += [("peak memory: Python driver", f"{python_kib / 1024:,.0f} MiB"),
             (f"peak memory: JVM driver (also the executor in local mode; -Xmx {DRIVER_MEMORY})",
              f"{jvm_kib / 1024:,.0f} MiB"),
             ("peak memory: largest Python worker", f"{workers_kib / 1024:,.0f} MiB")]

    # The candidate of the run: the quotas it recommended.
    fast, slow = fast_against_slow(usage, load_quota_file(str(out / "recommended-quotas.yaml")).quotas)
    rows.append((f"replay of 1 day x {SLOW_TENANTS} tenants, both kinds and scenarios: "
                 "fast paths / plain loop", f"{fast:.1f} s / {slow:.1f} s ({slow / fast:.1f}x)"))
    return rows


def _pipeline_rows(s: Summary, wall: float) -> list[tuple[str, str]]:
    t = s.seconds
    report = t["read"] + t["report"] + t["recommend"]
    intervals = sum(s.replay.values()) or 1
    share = {k: 100 * v / intervals for k, v in s.replay.items()}
    return [
        ("records read (bad lines skipped)", f"{s.records:,} ({s.bad_lines:,})"),
        ("read: JSON lines to Parquet", f"{t['read']:.1f} s, {s.records / t['read']:,.0f} records/s"),
        ("read + report + recommendations", f"{report:.1f} s, {s.records / report:,.0f} records/s"),
        ("replay: 2 scenarios x produce, fetch",
         f"{t['replay']:.1f} s, {s.records / t['replay']:,.0f} records/s"),
        ("  replayed intervals: not simulated / recorded directly / event loop",
         f"{share['skipped_intervals']:.1f} % / {share['fast_intervals']:.1f} % / "
         f"{share['simulated_intervals']:.2f} %"),
        ("report.html", f"{t['html']:.1f} s"),
        ("wall time: start Spark, analyze, stop", f"{wall:.1f} s"),
    ]
