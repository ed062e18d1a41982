"""`python -m bench [name ...]`: run the benchmarks (all by default) and print what they measured."""

from __future__ import annotations

import sys
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from bench import (
    analytics,
    framing,
    kafka_fidelity,
    kafka_paths,
    many_connections,
    many_connections_sim,
    producer_ids,
    quota_cost,
    request_check,
    shared_accuracy,
    shared_sim,
    store_faults,
    store_latency,
    store_parts,
    store_sync,
    tansu_perf,
    throughput,
    workers,
)

# In this order: what is timed finely runs first. Spark's JVM outlives spark.stop() until this
# process exits (2.3 GB resident, a few percent of a core), so analytics comes last.
BENCHMARKS: dict[str, tuple[str, Callable[[], list[tuple[str, str]]]]] = {
    "throughput": ("Throughput, added latency, idle-connection memory: direct, kafka-quota-proxy, "
                   "tansu proxy", throughput.run),
    "tansu_perf": ("Produce throughput from Tansu's own load generator (tansu perf produce, acks=0): "
                   "direct, kafka-quota-proxy, tansu proxy", tansu_perf.run),
    "framing": ("Cutting frames out of a client's bytes (FrameDecoder): cost per frame, peak held for "
                "one large frame", framing.run),
    "quota_cost": ("Quota accounting per request: the quota stages with no quota configured and with "
                   "100 tenants' quotas", quota_cost.run),
    "shared_accuracy": ("Cluster-wide quotas: 3 and 10 proxy replicas sharing one Valkey hold one "
                        "1 MiB/s producer quota (even, skewed, shifting traffic)", shared_accuracy.run),
    "store_latency": ("Cluster-wide quotas: Produce latency through a proxy whose store is near, and "
                      "100 ms away", store_latency.run),
    "store_faults": ("Cluster-wide quotas: 3 replicas under load while their store is killed (and "
                     "restarted empty), stopped, or partitioned away", store_faults.run),
    "shared_sim": ("Cluster-wide quotas, the arithmetic alone: 1, 3 and 10 simulated replicas' quota "
                   "engines on an ideal store, 10 seeds a shape", shared_sim.run),
    "many_connections": ("Many connections, one quota, side by side with Apache Kafka 4.4: 1, 3 and 10 "
                         "producers and a group of 3 consumers under one client-id, Kafka's broker "
                         "enforcing the quota and the proxy enforcing it", many_connections.run),
    "kafka": ("Kafka's own perf tools through each path to Apache Kafka 4.4: direct, the proxy (no "
              "quotas, 100 tenants' quotas, --workers 2), HAProxy (TCP) and Kroxylicious (passthrough), "
              "three interleaved rounds", kafka_paths.run),
    "kafka_fidelity": ("Kafka-exact, side by side with Apache Kafka 4.4: one client under one producer "
                       "quota, Kafka's broker enforcing it and the proxy enforcing it (set with "
                       "kafka-configs.sh on each), measured at the broker, three rounds",
                       kafka_fidelity.run),
    "many_connections_sim": ("Many connections, one quota: 1, 3 and 10 clients under one client-id held by "
                             "Kafka's broker and by the proxy, and by quota.byte_rate_enforcement: paced "
                             "on 1, 3 and 10 replicas, simulated (librdkafka clients, a fake clock, the "
                             "proxy's own quota engine)", many_connections_sim.run),
    "request_check": ("Request body check (WellFormed): cost per request beside reading its header",
                      request_check.run),
    "producer_ids": ("Producer-id quota (KIP-936): cost per Produce request, memory per user",
                     producer_ids.run),
    "store_sync": ("Shared quota store at scale: 100 replicas x 10,000 tenants syncing with one Valkey "
                   "every 100 ms (simulated), the store's CPU per sync and per entity update",
                   store_sync.run),
    "store_parts": ("Shared quota store parts: servers (start, script cost, Cluster) and clients "
                    "(redis-py + hiredis, valkey-glide: latency, CPU, faults)", store_parts.run),
    "workers": ("--workers 1 against --workers 2 on CPU-bound workloads, in front of a broker that "
                "answers from a cache (bench.sink_broker)", workers.run),
    "analytics": ("Usage pipeline: 10M records through analyze (local Spark), replay fast paths, "
                  "driver memory", analytics.run),
}


def main(argv: list[str]) -> int:
    names = argv or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    console = Console()
    for name in names:
        title, run = BENCHMARKS[name]
        table = Table(title=title, title_justify="left")
        table.add_column("measure")
        table.add_column("result", justify="right")
        for row in run():
            table.add_row(*row)
        console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
