"""Where kafka-quota-proxy spends its time under one of bench.throughput's workloads.

    python -m bench.throughput_profile fetch-large [--seconds 15] [--quotas] [--native]

Starts the broker and the proxies as bench.throughput does, runs one workload's load through
kafka-quota-proxy (with the tenants' quotas with --quotas), samples the proxy process with py-spy
(`pip install py-spy`; it needs ptrace, which root has) and prints the functions with the most
samples, by self and by cumulative time. With --native, C frames are shown too (the syscalls
inside uvloop); idle time in epoll then shows as well and should be read past.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from bench.throughput import WORKLOADS
from bench.throughput_runs import events, generator, load_args, prepare_fetch_topics
from bench.throughput_setup import OURS, OURS_QUOTAS, Sizes, started

PROFILED = [w for w in WORKLOADS if w != "idle"]
# Without --native, a sample inside uvloop's C code (socket reads and writes, epoll) ends at the
# Python frame that entered the loop.
IN_LOOP = "Runner.run (asyncio/runners.py:118)"
LINE = re.compile(r":\d+\)$")


def top(raw: Path, n: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """(samples, by self per line, by cumulative per function) from py-spy's raw (collapsed
    stack) output."""
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        k = int(count)
        frames = stack.split(";")
        total += k
        leaf = frames[-1]
        own["uvloop's C code (socket I/O, epoll)" if leaf == IN_LOOP else leaf] += k
        for f in {LINE.sub(")", f) for f in frames}:
            cumulative[f] += k
    return total, own.most_common(n), cumulative.most_common(n)


def profile(workload: str, seconds: float, quotas: bool, native: bool, n: int = 30) -> str:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    sizes = Sizes()
    out = Path(tempfile.mkdtemp(prefix="kqp-profile-")) / f"{workload}.txt"
    with started(sizes, print) as bench:
        path = bench.paths[OURS_QUOTAS if quotas else OURS]
        if workload.startswith("fetch"):
            topic, offsets = prepare_fetch_topics(bench)[workload]
        else:
            topic, offsets = bench.create_topic(f"bench-profile-{workload}", sizes.partitions), []
        # The load outlasts the sampling, warm-up before it and a margin after.
        load = generator(load_args(bench, workload, path, topic, offsets, seconds=seconds + 2))
        time.sleep(sizes.warmup + 0.5)
        mode = ["--native"] if native else ["--nonblocking"]
        command = [spy, "record", "--pid", str(path.pids["proxy"]), "--duration", str(int(seconds)),
                   "--rate", "250", "--format", "raw", "--output", str(out), *mode]
        sampled = subprocess.run(command, capture_output=True, text=True)
        result = next((e for e in events(load) if e["event"] == "result"), {})
        load.wait(60)
        if sampled.returncode != 0:
            raise SystemExit(f"py-spy failed: {sampled.stderr.strip()[-1000:]}")
    total, own, cumulative = top(out, n)
    rate = result.get("requests_per_second", 0.0)
    busy = 100 * total / (250 * seconds)
    lines = [f"{workload} through kafka-quota-proxy{' with quotas' if quotas else ''}: "
             f"{rate:,.0f} requests/s; {total} samples over {seconds:g} s at 250/s ({busy:.0f}% of the "
             f"time not idle{', native frames included' if native else ''})", "", "by self:"]
    lines += [f"  {100 * k / total:5.1f}%  {f}" for f, k in own]
    lines += ["", "by cumulative (per function):"]
    lines += [f"  {100 * k / total:5.1f}%  {f}" for f, k in cumulative]
    lines.append(f"\nraw samples: {out}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.throughput_profile",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("workload", choices=PROFILED)
    p.add_argument("--seconds", type=float, default=15.0, help="how long to sample")
    p.add_argument("--quotas", action="store_true", help="through the proxy with the tenants' quotas")
    p.add_argument("--native", action="store_true", help="show C frames (uvloop, syscalls) too")
    args = p.parse_args(argv)
    print(profile(args.workload, args.seconds, args.quotas, args.native))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
