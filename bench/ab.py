"""Two builds of the proxy side by side on one broker, under the same load in alternate rounds:
what a change costs the proxy per request, measured where a shared machine's drift cancels out.

    python -m bench.ab BASE_CHECKOUT [--workload produce-small|fetch-small] [--rounds 8]

BASE_CHECKOUT is another checkout's root (`git worktree add /tmp/base main`, or `git archive`
unpacked); its proxy runs with PYTHONPATH pointing there, this checkout's with this one. Each
round runs bench.load (as bench.throughput's produce-small or fetch-small) against each proxy in
turn, order alternating, and reads that proxy's CPU over the measured window. Printed: per
round, each build's requests/s and proxy CPU per request (user + system), and its read and
write system calls per request (/proc/PID/io: how many requests one read or write carried);
then the medians and their ratio.
bench.throughput's absolute rates move with other jobs by a factor of two on this machine; the
CPU a proxy spends per request moves far less, and the two builds share every round's weather.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from bench.throughput_runs import load_args, measure
from bench.throughput_setup import Bench, Route, Sizes
from devkit.processes import ProxyProcess
from devkit.tansu import Broker


def _proxy(broker: Broker, node_id: int, pythonpath: str) -> ProxyProcess:
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = pythonpath  # the child imports kafka_quota_proxy from there
    try:
        return ProxyProcess(broker.address, node_id).start()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path, help="the other checkout's root")
    parser.add_argument("--workload", choices=("produce-small", "fetch-small"), default="produce-small")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--this", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the build measured against BASE (default: this checkout; BASE again "
                             "for an A/A run, which shows the noise)")
    args = parser.parse_args()
    here = str(args.this.resolve())
    sizes = Sizes()
    broker = Broker().start()
    proxies: dict[str, ProxyProcess] = {}
    try:
        node_id = broker.node_id()
        proxies = {"base": _proxy(broker, node_id, str(args.base.resolve())),
                   "this": _proxy(broker, node_id, here)}
        pids = {name: p.proc.pid for name, p in proxies.items() if p.proc is not None}
        assert broker.proc is not None and len(pids) == 2
        routes = {name: Route(name, p.bootstrap, {"proxy": pids[name], "broker": broker.proc.pid})
                  for name, p in proxies.items()}
        bench = Bench(sizes, broker, {}, print)
        topic = bench.create_topic(f"ab-{args.workload}", 1)
        offsets: list[int] = []
        if args.workload == "fetch-small":
            offsets = bench.prepare(topic, sizes.fetch_small_batches, 1)
        per_request: dict[str, list[float]] = {"base": [], "this": []}
        parts: dict[str, list[list[float]]] = {"base": [], "this": []}  # user µs, system µs, syscalls
        for i in range(args.rounds):
            order = ["base", "this"] if i % 2 == 0 else ["this", "base"]
            line = []
            for name in order:
                result = measure(routes[name], load_args(bench, args.workload, routes[name], topic, offsets))
                rate = result["requests_per_second"]
                requests = rate * result["seconds"]
                us = result["cpu_seconds"]["proxy"] / requests * 1e6
                user, system = (s / requests * 1e6 for s in result["cpu_user_system"]["proxy"])
                calls = sum(result["syscalls"]["proxy"]) / requests
                per_request[name].append(us)
                parts[name].append([user, system, calls])
                line.append(f"{name} {rate:,.0f} requests/s, proxy {us:.1f} µs/request "
                            f"({user:.1f} user, {system:.1f} system, {calls:.2f} syscalls)")
            print(f"round {i + 1}: " + "; ".join(line), flush=True)
        base, this = (statistics.median(per_request[n]) for n in ("base", "this"))
        print(f"{args.workload}: proxy CPU per request, median of {args.rounds} rounds: base {base:.1f} µs, "
              f"this {this:.1f} µs, ratio {this / base:.3f}")
        for name in ("base", "this"):
            user, system, calls = (statistics.median(p[i] for p in parts[name]) for i in range(3))
            print(f"  {name}: median user {user:.1f} µs, system {system:.1f} µs, "
                  f"{calls:.2f} read and write system calls per request")
    finally:
        for p in proxies.values():
            p.stop()
        broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
