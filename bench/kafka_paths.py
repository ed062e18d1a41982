"""`make bench BENCH=kafka` (issue 39): the field's own tools, Kafka's `kafka-producer-perf-test`
and `kafka-consumer-perf-test`, through each path to one Apache Kafka 4.4 broker from devkit, in
interleaved rounds (every path once per workload in each round, in turn).

Paths (`--paths`):
- `direct`: the broker itself;
- `proxy`: kafka-quota-proxy, no quota configured;
- `proxy-quotas`: kafka-quota-proxy with 100 tenants' quotas (client-ids tenant-000 ...; the tools
  run as tenant-000, whose 1 GB/s producer and consumer byte rates are measured, never reached);
- `proxy-workers`: kafka-quota-proxy with `--workers 2`, no quota;
- `haproxy`: HAProxy in TCP mode (Debian's package; `apt-get install haproxy`), in front of a
  second listener of the broker that advertises HAProxy's address, so that every connection goes
  through it;
- `kroxylicious`: Kroxylicious 0.23.0 in passthrough (devkit.kroxylicious: built once from its
  source with `python -m devkit.kroxylicious build --source DIR`; absent, with why, otherwise).

Each path is warmed up first with an uncounted flat-out produce (Kroxylicious's JIT, like any
JVM's, needs it), and each round takes the paths in turn from a different one.

Workloads (`--workloads`), each with its own topic of one partition per path and round:
- `produce-1k`, `produce-64k`: ProducerPerformance flat out (`--throughput -1`), acks=all, 1 KiB
  and 64 KiB records, `--megabytes` of them;
- `produce-1k-paced`: the same at a fixed rate (`--rate` records/s, 10 s), for latency;
- `produce-1k-transactional`: flat out with `--transactional-id` (a transaction every 100 ms);
- `consume-1k`: ConsumerPerformance reading `--megabytes` of 1 KiB records, filled beforehand
  through `direct`, in a group of its own each run (its fetch rate, rebalance excluded).

Reported per workload and path, medians over the rounds: throughput (MiB/s, as the tools count),
its ratio to `direct` in the same round, the producer tool's own p50, p99 and p99.9 latency and
what each path adds to `direct`'s, and the CPU the path's own process(es) used per MiB/s
(millicores: CPU ms per MiB moved, from /proc), with the broker's CPU beside it (a broker short of
CPU caps every path alike on a small machine). Then the issue's targets, each met or not.

    python -m bench.kafka_paths                      # every path and workload, three rounds
    python -m bench.kafka_paths --paths direct proxy haproxy --workloads produce-1k --runs 5
    make bench BENCH=kafka

Printed, never asserted: docs/performance.md holds the measured tables.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from bench.procfs import cpu_seconds, machine_busy_seconds
from devkit import kroxylicious
from devkit.kafka import KafkaBroker
from devkit.kafka_jvm import LOOPBACK, free_port, java_command, lib_dir, run_tool
from devkit.processes import ProxyProcess, die_with_parent, wait_for_port

MIB = 2**20
PATHS = ("direct", "proxy", "proxy-quotas", "proxy-workers", "haproxy", "kroxylicious")
TENANTS = 100
TENANT_RATE = 1_000_000_000  # B/s: configured and measured, never reached
CLIENT_ID = "tenant-000"


@dataclass(frozen=True)
class Workload:
    tool: str  # "producer" or "consumer"
    record: int  # value bytes
    paced: bool = False  # at `--rate` records/s for 10 s, not flat out
    transactional: bool = False


WORKLOADS = {
    "produce-1k": Workload("producer", 1024),
    "produce-64k": Workload("producer", 64 * 1024),
    "produce-1k-paced": Workload("producer", 1024, paced=True),
    "produce-1k-transactional": Workload("producer", 1024, transactional=True),
    "consume-1k": Workload("consumer", 1024),
}
PACED_SECONDS = 10


@dataclass
class Result:
    workload: str
    path: str
    round: int
    mib_s: float | None = None
    latency_ms: dict[str, float] = field(default_factory=dict)  # p50, p99, p99.9 (producers)
    cpu_ms_per_mib: float | None = None  # the path's own processes
    broker_cpu: float | None = None  # the broker's CPU over the run, in cores
    idle: float | None = None  # the machine's idle cores over the run
    error: str = ""


# -- the tools' own summaries --------------------------------------------------------------------------

PRODUCER_SUMMARY = re.compile(
    r"(\d+) records sent, [\d.]+ records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th")


def producer_summary(text: str) -> tuple[int, float, dict[str, float]] | None:
    """ProducerPerformance's last line: (records, MiB/s, {avg, p50, p99, p99.9} in ms), None
    without. The tool prints its percentiles in whole ms, its average to 0.01 ms."""
    found = PRODUCER_SUMMARY.findall(text)
    if not found:
        return None
    records, mib_s, avg, _, p50, _, p99, p999 = found[-1]
    return int(records), float(mib_s), {"avg": float(avg), "p50": float(p50), "p99": float(p99),
                                        "p99.9": float(p999)}


def consumer_summary(text: str) -> tuple[float, float] | None:
    """ConsumerPerformance's line under its header: (MiB read, fetch MiB/s, rebalance excluded)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("start.time") and i + 1 < len(lines):
            head = [h.strip() for h in line.split(",")]
            values = [v.strip() for v in lines[i + 1].split(",")]
            if len(values) != len(head):
                return None
            row = dict(zip(head, values, strict=True))
            return float(row["data.consumed.in.MB"]), float(row["fetch.MB.sec"])
    return None


# -- the paths ---------------------------------------------------------------------------------------

@dataclass
class Route:
    """One path to the broker: its bootstrap address and its own processes."""

    name: str
    bootstrap: str | None  # None: not measured (`absent` says why)
    pids: Callable[[], list[int]] = list  # the path's own processes, for their CPU
    absent: str = ""


def haproxy_config(front: int, back: int) -> str:
    return (f"global\n  maxconn 4096\ndefaults\n  mode tcp\n  timeout connect 5s\n"
            f"  timeout client 300s\n  timeout server 300s\n"
            f"frontend kafka\n  bind {LOOPBACK}:{front}\n  default_backend broker\n"
            f"backend broker\n  server b1 {LOOPBACK}:{back}\n")


def broker_with_haproxy_listener(front: int, back: int) -> KafkaBroker:
    """A broker with a second PLAINTEXT listener on `back` that advertises HAProxy's `front`."""
    broker = KafkaBroker()
    base = broker.properties()
    broker.properties_extra = {
        "listeners": base["listeners"] + f",HAPROXY://{LOOPBACK}:{back}",
        "advertised.listeners": base["advertised.listeners"] + f",HAPROXY://{LOOPBACK}:{front}",
        "listener.security.protocol.map": base["listener.security.protocol.map"] + ",HAPROXY:PLAINTEXT",
    }
    return broker


def proxy_pids(proxy: ProxyProcess) -> list[int]:
    """The proxy's processes: with --workers, the supervisor and its workers."""
    assert proxy.proc is not None
    return [proxy.proc.pid, *(proxy.worker_pids() if proxy.workers > 1 else ())]


def popen_pids(proc: subprocess.Popen[bytes]) -> list[int]:
    return [proc.pid]


def start_paths(names: Sequence[str], broker: KafkaBroker, haproxy_ports: tuple[int, int],
                stack: ExitStack, scratch: Path) -> dict[str, Route]:
    paths: dict[str, Route] = {}
    for name in names:
        if name == "direct":
            paths[name] = Route(name, broker.bootstrap)
        elif name.startswith("proxy"):
            extra: dict = {}
            if name == "proxy-quotas":
                extra["quotas"] = [{"client-id": f"tenant-{i:03d}", "producer_byte_rate": TENANT_RATE,
                                    "consumer_byte_rate": TENANT_RATE} for i in range(TENANTS)]
            if name == "proxy-workers":
                extra["workers"] = 2
            proxy = ProxyProcess(broker.address, broker.node_id, extra_config=extra).start()
            stack.callback(proxy.stop)
            paths[name] = Route(name, proxy.bootstrap, functools.partial(proxy_pids, proxy))
        elif name == "haproxy":
            binary = shutil.which("haproxy")
            if binary is None:
                paths[name] = Route(name, None, absent="no haproxy on the PATH (apt-get install haproxy)")
                continue
            front, back = haproxy_ports
            config = scratch / "haproxy.cfg"
            config.write_text(haproxy_config(front, back))
            proc = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
            stack.callback(proc.kill)
            wait_for_port(front, proc=proc)
            paths[name] = Route(name, f"{LOOPBACK}:{front}", functools.partial(popen_pids, proc))
        elif name == "kroxylicious":
            if kroxylicious.lib_dir() is None:
                paths[name] = Route(name, None, absent=f"Kroxylicious {kroxylicious.VERSION} not built: "
                                    "python -m devkit.kroxylicious build --source DIR")
                continue
            try:
                running = kroxylicious.start(broker.bootstrap, kroxylicious.free_ports(),
                                             scratch / "kroxylicious", node_id=broker.node_id)
            except kroxylicious.KroxyliciousError as exc:
                paths[name] = Route(name, None, absent=str(exc).splitlines()[0])
                continue
            stack.callback(running.stop)
            paths[name] = Route(name, running.bootstrap, functools.partial(popen_pids, running.proc))
        else:
            raise ValueError(f"unknown path {name}; known: {', '.join(PATHS)}")
    return paths


# -- one run -----------------------------------------------------------------------------------------

def tool(main_class: str, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = java_command(f"org.apache.kafka.tools.{main_class}", *args, lib=lib_dir(None), heap="512m")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def run_one(name: str, path: Route, broker: KafkaBroker, topic: str, megabytes: int, rate: int,
            round_: int, filled: str | None) -> Result:
    work = WORKLOADS[name]
    out = Result(name, path.name, round_)
    assert path.bootstrap is not None and broker.proc is not None
    pids = path.pids()
    before = [cpu_seconds(p) for p in pids]
    broker_before, busy_before, wall = cpu_seconds(broker.proc.pid), machine_busy_seconds(), time.monotonic()
    try:
        if work.tool == "consumer":
            assert filled is not None
            done = tool("ConsumerPerformance", [
                "--bootstrap-server", path.bootstrap, "--topic", filled,
                "--num-records", str(megabytes * MIB // work.record), "--group", f"perf-{path.name}-{round_}",
                "--timeout", "60000", "--command-property", f"client.id={CLIENT_ID}"], timeout=600)
            read = consumer_summary(done.stdout)
            if read is None:
                out.error = f"ConsumerPerformance exited {done.returncode}: {done.stderr.strip()[-300:]}"
                return out
            moved, out.mib_s = read
        else:
            records = rate * PACED_SECONDS if work.paced else megabytes * MIB // work.record
            props = [f"bootstrap.servers={path.bootstrap}", f"client.id={CLIENT_ID}", "acks=all"]
            extra = ["--transactional-id", f"perf-{path.name}-{round_}", "--transaction-duration-ms", "100"] \
                if work.transactional else []
            done = tool("ProducerPerformance", [
                "--topic", topic, "--num-records", str(records), "--record-size", str(work.record),
                "--throughput", str(rate if work.paced else -1), *extra, "--producer-props", *props],
                timeout=600)
            summary = producer_summary(done.stdout)
            if summary is None:
                out.error = f"ProducerPerformance exited {done.returncode}: {done.stderr.strip()[-300:]}"
                return out
            sent, out.mib_s, out.latency_ms = summary
            moved = sent * work.record / MIB
    except subprocess.TimeoutExpired:
        out.error = "ran over 600 s"
        return out
    seconds = time.monotonic() - wall
    if pids and moved > 0:
        out.cpu_ms_per_mib = 1000 * sum(cpu_seconds(p) - b for p, b in zip(pids, before, strict=True)) / moved
    out.broker_cpu = (cpu_seconds(broker.proc.pid) - broker_before) / seconds
    out.idle = (os.cpu_count() or 1) - (machine_busy_seconds() - busy_before) / seconds
    return out


def create_topic(bootstrap: str, topic: str) -> None:
    done = run_tool("TopicCommand", "--bootstrap-server", bootstrap, "--create", "--topic", topic,
                    "--partitions", "1", "--replication-factor", "1")
    if done.returncode != 0:
        raise RuntimeError(f"cannot create {topic}: {done.stderr.strip()[-300:]}")


# -- the rounds and the report -------------------------------------------------------------------------

def _median(values: Sequence[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def summarize(results: Sequence[Result], paths: Sequence[str]) -> list[tuple[str, str]]:
    """Per workload and path, the medians over the rounds, each ratio to `direct` taken in its
    round; then the issue's targets."""
    rows: list[tuple[str, str]] = []
    by = {(r.workload, r.path, r.round): r for r in results}
    workloads = list(dict.fromkeys(r.workload for r in results))
    rounds = sorted({r.round for r in results})
    for name in workloads:
        direct = [by.get((name, "direct", n)) for n in rounds]
        base = {p: _median([d.latency_ms.get(p) for d in direct if d is not None and not d.error])
                for p in ("avg", "p50")}
        ratios: dict[str, float | None] = {}
        cpu: dict[str, float | None] = {}
        for path in paths:
            mine = [by.get((name, path, n)) for n in rounds]
            ok = [r for r in mine if r is not None and not r.error]
            if not ok:
                errors = sorted({r.error for r in mine if r is not None and r.error})
                rows.append((f"{name}, {path}", "; ".join(errors) or "not run"))
                continue
            per_round = [r.mib_s / d.mib_s for r, d in zip(mine, direct, strict=True)
                         if r is not None and d is not None and r.mib_s and d.mib_s]
            ratios[path] = _median(per_round)
            cpu[path] = _median([r.cpu_ms_per_mib for r in ok])
            latency = {p: _median([r.latency_ms.get(p) for r in ok]) for p in ("avg", "p50", "p99", "p99.9")}
            said = [f"{_fmt(_median([r.mib_s for r in ok]), '.1f')} MiB/s",
                    f"{_fmt(ratios[path], '.3f')} of direct"]
            avg, p50 = latency["avg"], latency["p50"]
            if avg is not None and p50 is not None:
                said.append(f"latency avg {avg:.2f}, p50/p99/p99.9 {p50:.0f}/"
                            f"{_fmt(latency['p99'], '.0f')}/{_fmt(latency['p99.9'], '.0f')} ms")
                base_avg, base_p50 = base["avg"], base["p50"]
                if path != "direct" and base_avg is not None and base_p50 is not None:
                    said.append(f"adds {avg - base_avg:+.2f} ms avg, {p50 - base_p50:+.0f} ms p50")
            if path != "direct":
                said.append(f"{_fmt(cpu[path], '.1f')} CPU ms per MiB")
            said.append(f"broker {_fmt(_median([r.broker_cpu for r in ok]))} cores, "
                        f"idle {_fmt(_median([r.idle for r in ok]))} ({len(ok)} runs)")
            text = "; ".join(said)
            rows.append((f"{name}, {path}", text))
        rows += targets(name, ratios, cpu)
    return rows


def targets(name: str, ratios: dict[str, float | None],
            cpu: dict[str, float | None]) -> list[tuple[str, str]]:
    """Issue 39's targets for the proxy's paths: >= 0.95 of direct, >= HAProxy's ratio - 0.03,
    >= Kroxylicious's, and CPU per MiB below Kroxylicious's."""
    rows = []
    for path in ("proxy", "proxy-quotas", "proxy-workers"):
        ratio = ratios.get(path)
        if ratio is None:
            continue
        said = [f"{ratio:.3f} of direct ({'met' if ratio >= 0.95 else 'missed'} 0.95)"]
        if (haproxy := ratios.get("haproxy")) is not None:
            bound = haproxy - 0.03
            said.append(f"HAProxy - 0.03 = {bound:.3f} ({'met' if ratio >= bound else 'missed'})")
        if (k := ratios.get("kroxylicious")) is not None:
            said.append(f"Kroxylicious {k:.3f} ({'met' if ratio >= k else 'missed'})")
            mine, theirs = cpu.get(path), cpu.get("kroxylicious")
            if mine is not None and theirs is not None:
                said.append(f"CPU {mine:.1f} against {theirs:.1f} ms per MiB "
                            f"({'met' if mine < theirs else 'missed'})")
        rows.append((f"{name}, {path}: targets", "; ".join(said)))
    return rows


def run(paths: Sequence[str] = PATHS, workloads: Sequence[str] = tuple(WORKLOADS), runs: int = 3,
        megabytes: int = 256, rate: int = 5000) -> list[tuple[str, str]]:
    unknown = [w for w in workloads if w not in WORKLOADS] + [p for p in paths if p not in PATHS]
    if unknown:
        raise ValueError(f"unknown {', '.join(unknown)}; paths: {', '.join(PATHS)}; "
                         f"workloads: {', '.join(WORKLOADS)}")
    paths = ["direct", *(p for p in paths if p != "direct")]  # the ratios' base, always measured
    results: list[Result] = []
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kafka-paths-")))
        haproxy_ports = (free_port(), free_port())
        broker = broker_with_haproxy_listener(*haproxy_ports).start()
        stack.callback(broker.close)
        started = start_paths(paths, broker, haproxy_ports, stack, scratch)
        rows = [(f"path {p.name}", p.absent) for p in started.values() if p.bootstrap is None]
        live = [p for p in paths if started[p].bootstrap is not None]
        stamp = int(time.time())
        filled = None
        if any(WORKLOADS[w].tool == "consumer" for w in workloads):
            filled = f"perf-filled-{stamp}"
            create_topic(broker.bootstrap, filled)
            fill = run_one("produce-1k", started["direct"], broker, filled, megabytes, rate, -1, None)
            if fill.error:
                raise RuntimeError(f"cannot fill {filled}: {fill.error}")
        # Every path warmed up first (a JVM's JIT, the proxy's caches): a flat-out produce, not counted.
        for path in live:
            warm = f"perf-warm-{path}-{stamp}"
            create_topic(broker.bootstrap, warm)
            run_one("produce-1k", started[path], broker, warm, min(64, megabytes), rate, -1, None)
        for round_ in range(runs):
            # The paths in turn, each round starting one further on: no path is always first after
            # another workload, or always after the same one.
            order = live[round_ % len(live):] + live[:round_ % len(live)]
            for name in workloads:
                for path in order:
                    topic = f"perf-{name}-{path}-{stamp}-{round_}"
                    if WORKLOADS[name].tool == "producer":
                        create_topic(broker.bootstrap, topic)
                    result = run_one(name, started[path], broker, topic, megabytes, rate, round_, filled)
                    results.append(result)
                    print(f"{name:26s} {path:14s} round {round_}: {_fmt(result.mib_s, '.1f')} MiB/s "
                          f"{result.latency_ms or ''} cpu {_fmt(result.cpu_ms_per_mib, '.1f')} ms/MiB "
                          f"broker {_fmt(result.broker_cpu)} idle {_fmt(result.idle)} {result.error}",
                          file=sys.stderr, flush=True)
        return rows + summarize(results, live)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kafka_paths", description=__doc__.split("\n\n")[0])
    ap.add_argument("--paths", nargs="*", default=list(PATHS), choices=PATHS)
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--megabytes", type=int, default=256, help="MiB each flat-out run moves")
    ap.add_argument("--rate", type=int, default=5000, help="records/s of produce-1k-paced")
    args = ap.parse_args(argv)
    for key, value in run(args.paths, args.workloads, args.runs, args.megabytes, args.rate):
        print(f"{key:48s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
