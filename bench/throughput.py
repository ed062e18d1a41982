"""Throughput, added latency and memory per connection: the broker direct, through kafka-quota-proxy,
and through tansu proxy (the Rust proxy in the same Tansu binary), measured in one run.

    python -m bench throughput                  (or `make bench BENCH=throughput`)
    python -m bench.throughput [--smoke] [--results-dir DIR] [--only WORKLOAD ...]

One Tansu broker (memory storage) serves every path; kafka-quota-proxy runs as its console entry
point with its default settings, tansu proxy as `tansu proxy --origin-url`. The load comes from
bench.load, a separate process that encodes each request once and reports its own CPU; the
proxy's and the broker's CPU over the same window are read from /proc/<pid>/stat.

Workloads (each path run `rounds` times, interleaved direct, ours, tansu, direct, ...; the median
is reported, with its ratio to direct: absolute rates drift on a shared machine, so ratios measured
in one run are what count; and since the broker, the proxy and the generator share the machine's
cores, the report also shows each one's CPU and what other jobs took meanwhile):
- produce, large: requests of one ~1 MiB batch (1,000 records of 1 KiB), 4 connections, 5 in
  flight each, acks=1;
- produce, small: the same with one record per request;
- fetch, large: one ~1 MiB batch per response (max_bytes below the batch size), cycling through a
  prepared topic; fetch, small: one 1 KiB record per response;
- tenants: the small produce load from 100 client ids at once, one connection each, through a
  proxy with a producer_byte_rate quota (high enough never to throttle) for every one of them,
  against an identical proxy without quotas (both run all along);
- latency: one Produce of one record at a time at 1,000 requests/s; p50 and p99, and what each
  proxy adds to direct;
- idle: thousands of connections that each made one ApiVersions round trip, then the RSS growth
  per connection of the process the clients connect to. 9,000, not 10,000: kafka-quota-proxy
  holds two descriptors per client connection (client and broker) under this machine's hard
  limit of 20,000 open files.

Results go to bench/results/throughput-<UTC time>.md and .json and throughput-latest.md.

This module is the entry point; the sizes, paths and processes are in bench.throughput_setup,
running the workloads in bench.throughput_runs, the report in bench.throughput_report.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.procfs import loadavg
from bench.throughput_report import (
    machine,
    markdown,
    ratio_lines,
    summarize_idle,
    summarize_latency,
    summarize_throughput,
)
from bench.throughput_runs import run_idle, run_latency, run_throughput, throughput_workloads
from bench.throughput_setup import SMOKE, Sizes, started

RESULTS_DIR = Path(__file__).resolve().parent / "results"
FULL = Sizes()  # the default run

WORKLOADS = ("produce-large", "produce-small", "fetch-large", "fetch-small", "tenants", "latency", "idle")


def measure_all(sizes: Sizes = FULL, results_dir: Path = RESULTS_DIR, only: Sequence[str] = WORKLOADS,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the workloads, write the Markdown and JSON reports; the report as a dict."""
    started_at = datetime.now(UTC)
    report: dict[str, Any] = {"benchmark": "throughput", "started": started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                              "command": [sys.executable, *sys.argv], "machine": machine(),
                              "sizes": asdict(sizes), "loadavg_start": loadavg(), "workloads": []}
    with started(sizes, log) as bench:
        chosen = [w for w in throughput_workloads(sizes) if w.name in only]
        run_throughput(bench, chosen)
        report["workloads"] += [summarize_throughput(w) for w in chosen]
        if "latency" in only:
            report["workloads"].append(summarize_latency(run_latency(bench), sizes.latency_rate))
        if "idle" in only:
            report["workloads"].append(summarize_idle(run_idle(bench)))
    report["loadavg_end"] = loadavg()
    report["finished"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = started_at.strftime("%Y%m%dT%H%M%SZ")
    text = markdown(report)
    (results_dir / f"throughput-{stamp}.md").write_text(text)
    (results_dir / "throughput-latest.md").write_text(text)
    (results_dir / f"throughput-{stamp}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    report["files"] = [str(results_dir / f"throughput-{stamp}.{ext}") for ext in ("md", "json")]
    return report


def run(sizes: Sizes = FULL, results_dir: Path = RESULTS_DIR) -> list[tuple[str, str]]:
    """For `python -m bench`: measure, write the reports, print the ratios; rows for its table."""
    report = measure_all(sizes, results_dir)
    rows = ratio_lines(report)
    print()
    for measure_, result in rows:
        print(f"{measure_}: {result}")
    print(f"written: {', '.join(report['files'])}")
    return rows


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes: a check that everything runs")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    p.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    args = p.parse_args(argv)
    report = measure_all(SMOKE if args.smoke else FULL, args.results_dir, args.only)
    for measure_, result in ratio_lines(report):
        print(f"{measure_}: {result}")
    print(f"written: {', '.join(report['files'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
