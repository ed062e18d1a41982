"""Does `--workers 2` scale? The same CPU-bound workloads through one proxy started with
`--workers 1` and one started with `--workers 2`, in front of a broker that costs next to nothing
(bench.sink_broker), so that the proxy is what the load waits for.

    python -m bench workers                 (or `make bench BENCH=workers`)
    python -m bench.workers [--rounds 3] [--seconds 5] [--smoke]

Workloads, each from bench.load (one generator process; its CPU is reported):
- metadata: pipelined Metadata requests on the bootstrap port (32 connections, 2 in flight each);
  the proxy decodes every answer and rewrites its broker addresses;
- produce: pipelined Produce requests of one 100-byte record (acks=1) on the broker's port (32
  connections, 4 in flight each).

Each round runs one proxy then the other (1, 2, 1, 2, ...); the median of each is reported, with
the ratio, each process's CPU in cores, how the connections were spread over the workers, and the
load average: the issue's target is 2 workers >= 1.7x one on 2 cores, which needs those cores
free. The generator and the sink broker share them, so on 2 cores the proxy can never have both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import psutil

from bench.procfs import loadavg
from devkit.processes import LOOPBACK, ProxyProcess, free_port, wait_for_port

NODE_ID = 1
TOPIC = "bench"


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    args: tuple[str, ...]  # for bench.load after --bootstrap and --topic
    port: str  # "bootstrap" or "node": where the connections go


WORKLOADS = (
    Workload("metadata", ("metadata", "--connections", "32", "--inflight", "2"), "bootstrap"),
    Workload("produce", ("produce", "--connections", "32", "--inflight", "4", "--records", "1",
                         "--record-bytes", "100"), "node"),
)


@dataclass
class Stack:
    sink: subprocess.Popen[bytes]
    proxies: dict[int, ProxyProcess]  # workers -> proxy

    def proxy_procs(self, workers: int) -> list[psutil.Process]:
        """The supervisor (or the lone proxy) and its worker processes."""
        proc = self.proxies[workers].proc
        assert proc is not None
        top = psutil.Process(proc.pid)
        return [top, *(c for c in top.children() if "valkey" not in c.name())]


def cpu(procs: Sequence[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


@contextmanager
def started() -> Iterator[Stack]:
    with ExitStack() as stack:
        port = free_port()
        sink = subprocess.Popen([sys.executable, "-m", "bench.sink_broker", "--port", str(port),
                                 "--topic", TOPIC, "--partitions", "1"])
        stack.callback(sink.wait, 10)
        stack.callback(sink.kill)
        wait_for_port(port, proc=sink)
        proxies = {}
        for n in (1, 2):
            proxy = ProxyProcess(f"{LOOPBACK}:{port}", NODE_ID,
                                 extra_config={"workers": n, "log_level": "WARNING"})
            stack.callback(proxy.stop)  # before start(): a start that times out leaves a process
            proxy.start()
            proxies[n] = proxy
        yield Stack(sink, proxies)


@dataclass
class Run:
    workload: str
    workers: int
    requests_per_second: float
    proxy_cores: float
    broker_cores: float
    generator_cores: float
    spread: list[int] = field(default_factory=list)  # connections per worker
    errors: int = 0


def run_once(s: Stack, w: Workload, workers: int, warmup: float, seconds: float) -> Run:
    proxy = s.proxies[workers]
    procs = s.proxy_procs(workers)
    sink = psutil.Process(s.sink.pid)
    port = proxy.port if w.port == "bootstrap" else proxy.node_port
    gen = subprocess.Popen([sys.executable, "-m", "bench.load", w.args[0], "--bootstrap", proxy.bootstrap,
                            "--topic", TOPIC, "--warmup", str(warmup), "--seconds", str(seconds),
                            *w.args[1:]], stdout=subprocess.PIPE, text=True)
    assert gen.stdout is not None
    marks: dict[str, tuple[float, float, float]] = {}
    spread: list[int] = []
    result: dict[str, Any] = {}
    for line in gen.stdout:
        event = json.loads(line)
        if event["event"] in ("open", "close"):
            marks[event["event"]] = (cpu(procs), cpu([sink]), time.perf_counter())
            if event["event"] == "open":
                spread = [sum(1 for c in p.net_connections("tcp")
                              if c.laddr.port == port and c.status == "ESTABLISHED") for p in procs[1:]]
        elif event["event"] == "result":
            result = event
    if gen.wait(60) != 0 or not result:
        raise RuntimeError(f"bench.load {w.name} failed with status {gen.returncode}")
    (p0, b0, t0), (p1, b1, t1) = marks["open"], marks["close"]
    elapsed = t1 - t0
    return Run(w.name, workers, result["requests_per_second"], (p1 - p0) / elapsed, (b1 - b0) / elapsed,
               (result["generator_cpu_user"] + result["generator_cpu_system"]) / result["seconds"],
               spread if workers > 1 else [], result["error_count"])


def measure(rounds: int, warmup: float, seconds: float, log: Any = print) -> dict[str, Any]:
    report: dict[str, Any] = {"benchmark": "workers", "loadavg_start": loadavg(), "rounds": rounds,
                              "seconds": seconds, "cpus": psutil.cpu_count(), "workloads": {}}
    with started() as s:
        for w in WORKLOADS:
            runs: list[Run] = []
            for r in range(rounds):
                for workers in (1, 2):
                    run = run_once(s, w, workers, warmup, seconds)
                    log(f"{w.name} round {r + 1}, --workers {workers}: {run.requests_per_second:,.0f} "
                        f"requests/s, proxy {run.proxy_cores:.2f} cores, broker {run.broker_cores:.2f}, "
                        f"generator {run.generator_cores:.2f}"
                        + (f", connections per worker {run.spread}" if run.spread else "")
                        + (f", {run.errors} errors" if run.errors else ""))
                    runs.append(run)
            report["workloads"][w.name] = summarize(runs)
    report["loadavg_end"] = loadavg()
    return report


def summarize(runs: list[Run]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in (1, 2):
        mine = [r for r in runs if r.workers == n]
        out[f"workers_{n}"] = {
            "requests_per_second": statistics.median(r.requests_per_second for r in mine),
            "runs": [round(r.requests_per_second) for r in mine],
            "proxy_cores": round(statistics.median(r.proxy_cores for r in mine), 2),
            "broker_cores": round(statistics.median(r.broker_cores for r in mine), 2),
            "generator_cores": round(statistics.median(r.generator_cores for r in mine), 2),
            "spread": [r.spread for r in mine if r.spread], "errors": sum(r.errors for r in mine)}
    one, two = out["workers_1"], out["workers_2"]
    out["ratio"] = round(two["requests_per_second"] / one["requests_per_second"], 2)
    # Requests per core of proxy CPU: whether the second worker costs anything of its own.
    out["per_proxy_core_ratio"] = round((two["requests_per_second"] / two["proxy_cores"])
                                        / (one["requests_per_second"] / one["proxy_cores"]), 2)
    return out


def rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for name, w in report["workloads"].items():
        one, two = w["workers_1"], w["workers_2"]
        out.append((f"{name}: --workers 1 / 2, requests/s (median)",
                    f"{one['requests_per_second']:,.0f} / {two['requests_per_second']:,.0f}"))
        out.append((f"{name}: ratio 2 workers / 1 (target >= 1.7 on 2 free cores)", f"{w['ratio']:.2f}"))
        out.append((f"{name}: proxy CPU, cores, 1 / 2 workers",
                    f"{one['proxy_cores']} / {two['proxy_cores']}"))
        out.append((f"{name}: sink broker + generator CPU, cores, 1 / 2 workers",
                    f"{one['broker_cores']} + {one['generator_cores']} / "
                    f"{two['broker_cores']} + {two['generator_cores']}"))
    out.append(("load average at start / end (1, 5, 15 min)",
                f"{report['loadavg_start']} / {report['loadavg_end']}"))
    return out


def run() -> list[tuple[str, str]]:
    """For `python -m bench`."""
    report = measure(3, 1.0, 5.0)
    print(json.dumps(report))
    return rows(report)


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--smoke", action="store_true", help="one short round: a check that it runs")
    args = p.parse_args(argv)
    report = measure(1, 0.3, 0.7) if args.smoke else measure(args.rounds, 1.0, args.seconds)
    print(json.dumps(report))
    for measure_, result in rows(report):
        print(f"{measure_}: {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
