"""The arithmetic of cluster-wide quotas alone, fast: R replicas' quota engines (the proxy's own
`QuotaEngine` with `quota.scope: cluster`) on a simulated clock, synced every 100 ms through an
ideal store (each replica's absolute count per aligned sample, summed), one modelled client per
replica. No processes, no network: what it shows is what the formula and the sharing do, to study
a shape in seconds before `bench.shared_accuracy` measures it for real.

The client model: a request of `request_bytes` is charged when sent; the next one goes out
`rtt_ms` later, or after the throttle the answer carries (a KIP-219 client, muted as Kafka mutes
it). Traffic shapes as in `bench.shared_accuracy` (even, skewed, shifting); `--replicas 1` is
Kafka's formula with nothing shared, the baseline for this client model. A producer quota,
then a consumer quota: there a throttled fetch delivers nothing and its bytes are taken back.

    python -m bench.shared_sim                        # 1, 3 and 10 replicas, every shape, 10 seeds
    python -m bench.shared_sim --replicas 10 --shapes shifting --seeds 3
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import random
import statistics
from collections.abc import Sequence

from bench.shared_accuracy import SLIDING_S, fullest_window
from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaStore

MIB = 1024 * 1024
QUOTA = MIB
SHAPES = ("even", "skewed", "shifting")
SEND, SYNC = 0, 1


def _pace(shape: str, index: int, replicas: int, now_ms: float) -> float | None:
    """Bytes/s client `index` sends at (None: flat out; 0: idle), as bench.shared_accuracy."""
    if shape == "even":
        return None
    if shape == "skewed":
        return None if index == 0 else 0.05 * QUOTA
    return None if index == int(now_ms // 10_000) % replicas else 0.0


def simulate(replicas: int, shape: str, seconds: float = 60.0, warm_up: float = 15.0,
             request_bytes: int = 128 * 1024, sync_ms: float = 100.0, rtt_ms: float = 2.0,
             seed: int = 1, kind: str = "produce") -> tuple[float, float]:
    """(aggregate rate over the measured period, fullest sliding 11 s window), as fractions of the
    quota (rate) and of the quota's worth (window). `kind` "consume": a consumer quota, where a
    throttled fetch delivers nothing and its bytes are taken back (Kafka's rule, the proxy's)."""
    rnd = random.Random(seed)
    now = [0]  # the engines' clock, whole ms as the proxy's
    quota_key = QuotaKey.PRODUCER_BYTE_RATE if kind == "produce" else QuotaKey.CONSUMER_BYTE_RATE
    quotas = {QuotaEntity(client_id="t"): {quota_key: float(QUOTA)}}
    engines: list[QuotaEngine] = []
    for index in range(replicas):
        engine = QuotaEngine(QuotaSettings(scope="cluster"), QuotaStore(quotas),
                             clock=lambda: now[0], shared_buckets=1)
        assert engine.shared is not None
        engine.shared.live_replicas = replicas
        engine.shared.read_every_ms = sync_ms
        engine.shared.rng = random.Random(seed * 1000 + index)  # decisions by chance, reproducible
        engines.append(engine)
    store: dict[str, dict[int, dict[int, int]]] = {}  # key -> sample -> replica -> absolute
    events: list[tuple[float, int, int]] = []
    for i in range(replicas):
        heapq.heappush(events, (rnd.uniform(0, sync_ms), SYNC, i))
        heapq.heappush(events, (rnd.uniform(0, 10), SEND, i))
    sent: list[tuple[float, int]] = []
    end = (warm_up + seconds) * 1000
    while events:
        t, event, i = heapq.heappop(events)
        if t > end:
            break
        now[0] = int(t)
        engine = engines[i]
        if event == SYNC:
            registry = engine.shared
            assert registry is not None
            for batch in registry.collect(now[0]):
                for key, writes in batch.writes.items():
                    for sample, value in writes.items():
                        store.setdefault(key, {}).setdefault(sample, {})[i] = value
                totals = {key: {s: sum(store.get(key, {}).get(s, {}).values()) for s in wanted}
                          for key, wanted in batch.reads.items()}
                registry.applied(batch, totals, False, now[0])
            heapq.heappush(events, (t + sync_ms, SYNC, i))
            continue
        pace = _pace(shape, i, replicas, t)
        if pace == 0.0:
            heapq.heappush(events, (t + 50, SEND, i))
            continue
        size = request_bytes if pace is None else min(request_bytes, 16 * 1024)
        managers = engine.scope("x")
        key = QuotaKey.PRODUCER_BYTE_RATE if kind == "produce" else QuotaKey.CONSUMER_BYTE_RATE
        quota = managers.rates[key]
        throttle = quota.record_and_get_throttle_ms("", "t", size, now[0])
        if throttle and kind == "consume":
            quota.unrecord("", "t", size, now[0])
        else:
            sent.append((t, size))
        later = t + rtt_ms + throttle
        if pace is not None:
            later = max(later, t + size / pace * 1000)
        heapq.heappush(events, (later, SEND, i))
    times = [t for t, _ in sent]
    cumulative = [0]
    for _, size in sent:
        cumulative.append(cumulative[-1] + size)

    def upto(t: float) -> int:
        return cumulative[bisect.bisect_right(times, t)]

    start = warm_up * 1000
    rate = (upto(end) - upto(start)) / seconds
    worst = fullest_window(lambda s: upto(s * 1000), warm_up, warm_up + seconds)
    return rate / QUOTA, worst / (QUOTA * SLIDING_S)


def run(fleets: Sequence[int] = (1, 3, 10), shapes: Sequence[str] = SHAPES,
        seeds: int = 10, kinds: Sequence[str] = ("produce", "consume")) -> list[tuple[str, str]]:
    rows = []
    for kind in kinds:
        for replicas in fleets:
            for shape in shapes if replicas > 1 else ("even",):
                results = [simulate(replicas, shape, seed=s, kind=kind) for s in range(1, seeds + 1)]
                errors = [r - 1 for r, _ in results]
                windows = [w for _, w in results]
                name = f"{kind}, {replicas} replicas, {shape}"
                rows.append((f"{name}: aggregate, {seeds} seeds",
                             f"mean {statistics.mean(errors):+.1%}, worst {max(errors, key=abs):+.1%}"))
                rows.append((f"{name}: fullest 11 s window",
                             f"mean {statistics.mean(windows):.2f}x, worst {max(windows):.2f}x"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.shared_sim")
    ap.add_argument("--replicas", type=int, nargs="*", default=[1, 3, 10])
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=SHAPES)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--kinds", nargs="*", default=["produce", "consume"], choices=["produce", "consume"])
    args = ap.parse_args()
    for name, value in run(args.replicas, args.shapes, args.seeds, args.kinds):
        print(f"{name:50s} {value}")


if __name__ == "__main__":
    main()
