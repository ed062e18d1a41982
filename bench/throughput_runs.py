"""Running bench.throughput's workloads: the bench.load generator as a child process per run,
the CPU of the processes on the path over its measured window, and each workload's runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.procfs import (
    cpu_split,
    descriptors,
    loadavg,
    machine_busy_seconds,
    rss_bytes,
    syscalls,
)
from bench.throughput_setup import (
    DIRECT,
    KIB,
    MIB,
    OURS,
    OURS_QUOTAS,
    REPO,
    TANSU,
    Bench,
    Route,
    Sizes,
    front_role,
)


def generator(args: Sequence[str], stdin: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench.load", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL)


def events(proc: subprocess.Popen) -> Iterator[dict[str, Any]]:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip():
            yield json.loads(line)


def _failed(proc: subprocess.Popen, what: str) -> RuntimeError:
    proc.kill()
    _, err = proc.communicate(timeout=10)
    return RuntimeError(f"load generator failed ({what}): {err.strip()[-2000:]}")


def _usage(pid: int) -> list[float]:
    """User and system CPU seconds, read and write system calls, of a process so far."""
    return [*cpu_split(pid), *syscalls(pid)]


def measure(path: Route, args: Sequence[str]) -> dict[str, Any]:
    """Run one generator against `path`; its result, with the CPU the path's processes spent in
    the measured window, and what the rest of the machine spent meanwhile (other jobs)."""
    proc = generator(args)
    split0: dict[str, list[float]] = {}
    split: dict[str, list[float]] = {}
    busy = 0.0
    result: dict[str, Any] | None = None
    load = loadavg()
    for event in events(proc):
        if event["event"] == "open":
            split0 = {role: _usage(pid) for role, pid in path.pids.items()}
            busy = machine_busy_seconds()
        elif event["event"] == "close":
            busy = machine_busy_seconds() - busy
            split = {role: [b - a for a, b in zip(split0[role], _usage(pid), strict=True)]
                     for role, pid in path.pids.items()}
        elif event["event"] == "result":
            result = event
    if proc.wait(60) != 0 or result is None:
        raise _failed(proc, " ".join(args[:1]))
    result.pop("event")
    cpu = {role: found[0] + found[1] for role, found in split.items()}  # user + system
    cpu["generator"] = result["generator_cpu_user"] + result["generator_cpu_system"]
    result["cpu_seconds"] = cpu
    # Per path process over the window: user and system CPU seconds, read and write system calls.
    result["cpu_user_system"] = {role: list(found[:2]) for role, found in split.items()}
    result["syscalls"] = {role: list(found[2:]) for role, found in split.items()}
    # Cores busy over the window, machine-wide, and the part of it that was not this benchmark.
    result["machine_busy_cores"] = busy / result["seconds"]
    result["other_cores"] = max(0.0, (busy - sum(cpu.values())) / result["seconds"])
    result["loadavg"] = load
    return result


# -- workloads ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Workload:
    """One measured workload: the runs of every path, and what they are compared by."""

    name: str
    title: str
    unit: str
    value: Callable[[dict[str, Any]], float]  # the measure of one run
    paths: list[str]
    target_ratio: float | None = None  # ours / direct at least this
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def load_args(bench: Bench, workload: str, path: Route, topic: str, offsets: Sequence[int] = (),
              seconds: float | None = None) -> list[str]:
    """The generator's command line for one run of a workload on one path (`offsets`: fetch's)."""
    s = bench.sizes
    if workload == "latency":
        return ["latency", "--bootstrap", path.bootstrap, "--topic", topic, "--rate", str(s.latency_rate),
                "--warmup", str(s.latency_warmup), "--seconds", str(seconds or s.latency_seconds)]
    tenants = workload == "tenants"
    args = ["--bootstrap", path.bootstrap, "--topic", topic, "--inflight", str(s.inflight),
            "--connections", str(s.tenants if tenants else s.connections),
            "--client-id", "tenant-{i:03d}" if tenants else "bench-load",
            "--warmup", str(s.warmup), "--seconds", str(seconds or s.seconds)]
    if workload.startswith("fetch"):
        max_bytes = 1_000_000 if workload == "fetch-large" else 1  # below one batch: one batch back
        return ["fetch", *args, "--offsets", ",".join(map(str, offsets)), "--max-bytes", str(max_bytes)]
    records = s.large_records if workload == "produce-large" else 1
    return ["produce", *args, "--records", str(records), "--record-bytes", str(s.record_bytes)]


def prepare_fetch_topics(bench: Bench) -> dict[str, tuple[str, list[int]]]:
    """The topics the fetch workloads read: workload -> (topic, first offset of each batch)."""
    s = bench.sizes
    large = bench.create_topic("bench-fetch-large", 1)
    small = bench.create_topic("bench-fetch-small", 1)
    return {"fetch-large": (large, bench.prepare(large, s.fetch_large_batches, s.large_records)),
            "fetch-small": (small, bench.prepare(small, s.fetch_small_batches, 1))}


def throughput_workloads(s: Sizes) -> list[Workload]:
    def mib_requests(r: dict[str, Any]) -> float:
        return float(r["request_bytes_per_second"]) / MIB

    def mib_responses(r: dict[str, Any]) -> float:
        return float(r["response_bytes_per_second"]) / MIB

    def requests(r: dict[str, Any]) -> float:
        return float(r["requests_per_second"])
    three = [DIRECT, OURS, TANSU]
    return [
        Workload("produce-large", f"Produce, large batches ({s.large_records} records of 1 KiB per request)",
                 "MiB/s", mib_requests, three, 0.90),
        Workload("produce-small", "Produce, small batches (one 1 KiB record per request)",
                 "requests/s", requests, three, 0.75),
        Workload("fetch-large", "Fetch, large responses (one batch of about 1 MiB each)",
                 "MiB/s", mib_responses, three, 0.90),
        Workload("fetch-small", "Fetch, small responses (one 1 KiB record each)",
                 "requests/s", requests, three, 0.75),
        Workload("tenants", f"Produce from {s.tenants} client ids at once (one record per request); "
                 "quotas on for every one of them against quotas off",
                 "requests/s", requests, [DIRECT, OURS, OURS_QUOTAS, TANSU]),
    ]


def run_throughput(bench: Bench, workloads: list[Workload]) -> None:
    s = bench.sizes
    fetch_topics = prepare_fetch_topics(bench) if any(w.name.startswith("fetch") for w in workloads) else {}
    for w in workloads:
        for rnd in range(s.rounds):
            for name in w.paths:
                path = bench.paths[name]
                if w.name in fetch_topics:
                    topic, offsets = fetch_topics[w.name]
                    run = measure(path, load_args(bench, w.name, path, topic, offsets))
                else:
                    with bench.fresh_topic(w.name, s.partitions) as topic:
                        run = measure(path, load_args(bench, w.name, path, topic))
                run["round"] = rnd + 1
                w.runs.setdefault(name, []).append(run)
                bench.log(f"{w.name} round {rnd + 1} {name}: {w.value(run):,.1f} {w.unit}"
                          f"{_errors(run)}{_cpu(run)}")


def _errors(run: dict[str, Any]) -> str:
    return f" ERRORS {run['error_count']}: {run['errors'][:2]}" if run.get("error_count") else ""


def _cpu(run: dict[str, Any]) -> str:
    secs = run["seconds"]
    shares = [f"{role} {100 * c / secs:.0f}%" for role, c in run["cpu_seconds"].items()]
    return "  (CPU: " + ", ".join(shares) + f"; other jobs {100 * run['other_cores']:.0f}%)"


def run_latency(bench: Bench) -> dict[str, list[dict[str, Any]]]:
    s = bench.sizes
    runs: dict[str, list[dict[str, Any]]] = {}
    with bench.fresh_topic("latency", 1) as topic:
        for rnd in range(s.rounds):
            for name in (DIRECT, OURS, TANSU):
                path = bench.paths[name]
                run = measure(path, load_args(bench, "latency", path, topic))
                run["round"] = rnd + 1
                runs.setdefault(name, []).append(run)
                bench.log(f"latency round {rnd + 1} {name}: p50 {run['p50_ms']:.3f} ms, "
                          f"p99 {run['p99_ms']:.3f} ms at {run['requests_per_second']:,.0f}/s{_errors(run)}")
    return runs


def run_idle(bench: Bench) -> dict[str, dict[str, Any]]:
    """Memory per idle connection in the process the clients connect to (the broker, for direct)."""
    s = bench.sizes
    out: dict[str, dict[str, Any]] = {}
    for name in (DIRECT, OURS, TANSU):
        path = bench.paths[name]
        front, broker = path.front_pid, path.pids["broker"]
        time.sleep(s.idle_settle)
        before = {"front": rss_bytes(front), "broker": rss_bytes(broker)}
        fds_before = {"front": descriptors(front), "broker": descriptors(broker)}
        proc = generator(["idle", "--bootstrap", path.bootstrap, "--connections", str(s.idle_connections)],
                         stdin=True)
        it = events(proc)
        ready = next(it, None)
        if ready is None or ready["event"] != "ready":
            raise _failed(proc, "idle")
        time.sleep(s.idle_settle)
        after = {"front": rss_bytes(front), "broker": rss_bytes(broker)}
        fds = {"front": descriptors(front) - fds_before["front"],
               "broker": descriptors(broker) - fds_before["broker"]}
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        result = next(it, None)
        if proc.wait(60) != 0 or result is None:
            raise _failed(proc, "idle")
        n = max(1, ready["connections"])
        run = {"connections": ready["connections"], "failed": ready["failed"], "errors": ready["errors"],
               "open_seconds": ready["seconds"], "rss_before": before, "rss_after": after,
               "bytes_per_connection": (after["front"] - before["front"]) / n,
               "broker_bytes_per_connection": (after["broker"] - before["broker"]) / n,
               "descriptors_added": fds, "loadavg": loadavg(),
               "generator_cpu_seconds": result["generator_cpu_user"] + result["generator_cpu_system"]}
        out[name] = run
        bench.log(f"idle {name}: {run['connections']} connections ({run['failed']} failed), "
                  f"{run['bytes_per_connection'] / KIB:.1f} KiB each in the {front_role(name)}, "
                  f"descriptors +{fds['front']} (broker +{fds['broker']})")
    return out
