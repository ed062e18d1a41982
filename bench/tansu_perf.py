"""Produce throughput driven by Tansu's own load generator, `tansu perf produce`: direct to the
broker, through kafka-quota-proxy, and through `tansu proxy`, in one run.

`tansu perf produce` sends Produce requests with acks=0 and waits for each answer, which Tansu
gives (Kafka would not): the workload that found the proxy's acks=0 defect (docs/reliability.md,
"Broker quirks"). Each path runs the same command for the same time, in interleaved rounds; the
records it wrote are read off the partition's end, directly from the broker (`log_end`), so the
figure is what reached the broker, whatever the generator believes. Throughput is records per
second of sending time (`--duration`): the generator's start and teardown are not counted.

    python -m bench.tansu_perf            # the default run (about 2 minutes)
    python -m bench.tansu_perf --smoke    # a few seconds a path: a check that everything runs
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.throughput_setup import DIRECT, OURS, PATH_TITLES, TANSU, TansuProxy
from devkit.processes import ProxyProcess
from devkit.tansu import Broker, tansu_binary

KIB = 1024


@dataclass(frozen=True, slots=True)
class Load:
    """One `tansu perf produce` workload."""

    name: str
    title: str
    batch_size: int  # records per Produce request
    record_size: int  # bytes per record
    producers: int  # concurrent producers (connections)


LOADS = (
    Load("one-record", "1 record of 1 KiB a request, 4 producers", 1, KIB, 4),
    Load("batched", "100 records of 1 KiB a request, 1 producer", 100, KIB, 1),
)


@dataclass(frozen=True, slots=True)
class Sizes:
    rounds: int = 3
    seconds: int = 5


FULL = Sizes()
SMOKE = Sizes(rounds=1, seconds=2)


def perf_produce(bootstrap: str, topic: str, load: Load, seconds: int, timeout: float = 120.0
                 ) -> subprocess.CompletedProcess[str]:
    """Run `tansu perf produce` against `bootstrap` for `seconds`; its exit status and output."""
    return subprocess.run(
        [tansu_binary(), "perf", "--broker", f"tcp://{bootstrap}", topic, "produce",
         "--batch-size", str(load.batch_size), "--record-size", str(load.record_size),
         "--producers", str(load.producers), "--duration", f"{seconds}s"],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, "RUST_LOG": "warn"})


def log_end(broker: str, topic: str, partition: int = 0) -> int:
    """The offset after the partition's last record, asked of the broker itself. Tansu's
    ListOffsets (latest) gives the base offset of the last batch, short of the true end by that
    batch's records (docs/reliability.md, "Broker quirks"): the records from there on are read
    and counted."""
    c = Consumer({"bootstrap.servers": broker, "group.id": "bench-tansu-perf", "enable.auto.commit": False})
    try:
        tp = TopicPartition(topic, partition)
        end = int(c.get_watermark_offsets(tp, timeout=10)[1])
        c.assign([TopicPartition(topic, partition, end)])
        quiet_until = time.monotonic() + 2.0
        while time.monotonic() < quiet_until:
            msg = c.poll(0.2)
            offset = msg.offset() if msg is not None and msg.error() is None else None
            if offset is not None:
                end = max(end, offset + 1)
                quiet_until = time.monotonic() + 1.0
        return end
    finally:
        c.close()


@contextmanager
def paths(log: Callable[[str], None]) -> Iterator[tuple[Broker, dict[str, str]]]:
    """The broker, and the bootstrap address of each path to it."""
    with ExitStack() as stack:
        broker = Broker().start()
        stack.callback(broker.stop)
        ours = ProxyProcess(broker.address, broker.node_id()).start()
        stack.callback(ours.stop)
        peer = TansuProxy(broker.address).start()
        stack.callback(peer.stop)
        log(f"broker {broker.address}, kafka-quota-proxy {ours.bootstrap}, tansu proxy {peer.address}")
        yield broker, {DIRECT: broker.address, OURS: ours.bootstrap, TANSU: peer.address}


def measure(sizes: Sizes = FULL, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every load on every path, `sizes.rounds` interleaved rounds; records/s per run."""
    results: dict[str, Any] = {"seconds": sizes.seconds, "rounds": sizes.rounds, "loads": {}}
    with paths(log) as (broker, bootstraps):
        admin = AdminClient({"bootstrap.servers": broker.address})
        for load in LOADS:
            runs: dict[str, list[dict[str, Any]]] = {p: [] for p in bootstraps}
            for round_ in range(sizes.rounds):
                for path, bootstrap in bootstraps.items():
                    topic = f"perf-{load.name}-{path.replace('+', '-')}-{round_}"
                    for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
                        f.result(30)
                    started = time.monotonic()
                    done = perf_produce(bootstrap, topic, load, sizes.seconds)
                    wall = time.monotonic() - started
                    records = log_end(broker.address, topic)
                    for f in admin.delete_topics([topic]).values():
                        f.result(30)
                    run: dict[str, Any] = {
                        "exit": done.returncode, "records": records, "wall_seconds": round(wall, 2),
                        "records_per_second": records / sizes.seconds,
                        "mib_per_second": records * load.record_size / sizes.seconds / KIB / KIB}
                    if done.returncode != 0:
                        run["stderr"] = done.stderr[-2000:]
                    runs[path].append(run)
                    log(f"{load.name} via {path}: {records} records in {sizes.seconds} s "
                        f"(exit {done.returncode}, {wall:.1f} s wall)")
            results["loads"][load.name] = {"title": load.title, "runs": runs}
    return results


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    """One row a load and path: median records/s and MiB/s, and the ratio to direct."""
    out = []
    for load in results["loads"].values():
        medians = {p: median([r["records_per_second"] for r in runs]) for p, runs in load["runs"].items()}
        for path, runs in load["runs"].items():
            failed = sum(1 for r in runs if r["exit"] != 0)
            mib = median([r["mib_per_second"] for r in runs])
            ratio = medians[path] / medians[DIRECT] if medians[DIRECT] else float("nan")
            text = f"{medians[path]:,.0f} records/s, {mib:.1f} MiB/s, {ratio:.2f}x direct"
            if failed:
                text += f", {failed} of {len(runs)} runs failed"
            out.append((f"tansu perf produce, {load['title']}: {PATH_TITLES[path]}", text))
    return out


def run(sizes: Sizes = FULL) -> list[tuple[str, str]]:
    """For `python -m bench`."""
    return rows(measure(sizes))


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tansu_perf", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="a few seconds a path: a check that everything runs")
    args = p.parse_args(argv)
    for measure_, result in run(SMOKE if args.smoke else FULL):
        print(f"{measure_}: {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
