"""Does a slow quota store slow the clients? Proxy latency with the store near and 100 ms away.

One proxy process (`quota.scope: cluster`, a producer quota every request is charged against
and none reaches) syncs with a real Valkey through a relay (devkit/relay.py) that holds each
chunk `--delay-ms / 2` each way: 100 ms more per store round trip. A client sends Produce
requests (acks=1, one 100-byte record) one after another for `--seconds`, in phases that take
turns: the relay adding nothing, then 100 ms, and so on, so that drift on a shared machine falls
on both. Reported: p50 and p99 of each, their ratio, and the syncs that failed (a sync is
several round trips; over `timeout_ms` one fails, and two in a row would degrade the replica).

The issue's target: proxy p99 unchanged when the store has 100 ms of added latency, because
the request path never waits for the store.

    python -m bench.store_latency                    # 4 phases of each, 15 s each
    python -m bench.store_latency --phases 1 --seconds 5
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from contextlib import ExitStack

from confluent_kafka.admin import AdminClient, NewTopic

from bench.wire import check_produce, produce_frame, record_batch, round_trip
from devkit.processes import ProxyProcess
from devkit.relay import Relay
from devkit.tansu import Broker
from devkit.valkey import ValkeyServer

CLIENT_ID = "latency-tenant"
TOPIC = "store-latency"


def _phase(sock: socket.socket, frame: bytes, seconds: float) -> list[float]:
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        answer = round_trip(sock, frame)
        latencies.append((time.perf_counter() - started) * 1000)
        problem = check_produce(answer, 0)
        if problem is not None:
            raise RuntimeError(f"produce through the proxy: {problem}")
    return latencies


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1]


def measure(phases: int = 4, seconds: float = 15.0, delay_ms: float = 100.0) -> dict[str, float]:
    with ExitStack() as stack:
        broker = Broker().start()
        stack.callback(broker.stop)
        valkey = ValkeyServer().start()
        stack.callback(valkey.stop)
        relay = Relay(valkey.port).start()
        stack.callback(relay.stop)
        proxy = ProxyProcess(broker.address, broker.node_id(), extra_config={
            "quota": {"scope": "cluster"},
            "quotas": [{"client-id": CLIENT_ID, "producer_byte_rate": 10**12}],
            "store": {"url": f"redis://{relay.address}", "key_prefix": f"lat{os.getpid()}"},
        }).start()
        stack.callback(proxy.stop)
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
        frame = produce_frame(TOPIC, 0, record_batch(1, 100), CLIENT_ID)
        near: list[float] = []
        far: list[float] = []
        with socket.create_connection(("127.0.0.1", proxy.node_port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _phase(sock, frame, 2.0)  # warm-up: the topic's leader, the store's first syncs
            errors_before = proxy.metric("kafka_quota_proxy_store_errors_total")
            for _ in range(phases):
                relay.delay(0.0)
                near += _phase(sock, frame, seconds)
                relay.delay(delay_ms / 2000)  # each way
                far += _phase(sock, frame, seconds)
            relay.delay(0.0)
        failed = proxy.metric("kafka_quota_proxy_store_errors_total") - errors_before
        syncs = proxy.metric("kafka_quota_proxy_store_syncs_total")
        degraded = proxy.log_text().count("enforced as this replica's share")
    return {"near_p50": statistics.median(near), "near_p99": _p(near, 0.99),
            "far_p50": statistics.median(far), "far_p99": _p(far, 0.99),
            "requests": len(near) + len(far), "failed_syncs": failed, "syncs": syncs,
            "degradations": degraded}


def rows(r: dict[str, float], delay_ms: float = 100.0) -> list[tuple[str, str]]:
    return [
        ("Produce p50 / p99, store near", f"{r['near_p50']:.2f} / {r['near_p99']:.2f} ms"),
        (f"Produce p50 / p99, store {delay_ms:.0f} ms away",
         f"{r['far_p50']:.2f} / {r['far_p99']:.2f} ms"),
        ("p99 far / near", f"{r['far_p99'] / r['near_p99']:.2f}"),
        ("requests, syncs, failed syncs, degradations",
         f"{r['requests']:.0f}, {r['syncs']:.0f}, {r['failed_syncs']:.0f}, {r['degradations']:.0f}"),
        ("load average at the end", " ".join(f"{x:.1f}" for x in os.getloadavg())),
    ]


def run() -> list[tuple[str, str]]:
    return rows(measure())


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.store_latency")
    ap.add_argument("--phases", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--delay-ms", type=float, default=100.0)
    args = ap.parse_args()
    for name, value in rows(measure(args.phases, args.seconds, args.delay_ms), args.delay_ms):
        print(f"{name:50s} {value}")


if __name__ == "__main__":
    main()
