"""The quota store failing under load: killed, stopped, or cut off by a partition.

Three proxy processes (`quota.scope: cluster`) share one 1 MiB/s `producer_byte_rate` through a
real Valkey, reached through a relay (devkit/relay.py); one librdkafka producer flat out through
each (the even traffic of `bench.shared_accuracy`). After `--healthy` seconds the store fails for
`--faulted` seconds, then comes back; the run goes on for `--after` seconds. The faults:

- kill: SIGKILL of Valkey, then a restart with nothing in it (its data lost);
- stop: SIGSTOP, then SIGCONT (a store that hangs: connections open, nothing answered);
- partition: the relay lets nothing through either way, then heals (bytes held, not lost).

Reported, from the producers' acknowledgements summed every 0.25 s and each replica's
`kafka_quota_proxy_store_degraded` gauge polled every 50 ms: delivery errors; how long after the
fault every replica was degraded, and after the store came back every one shared again; the
aggregate rate before, during the fault (from the moment all are degraded; `local_share`, the
default) and in the first and second 11 s windows after it came back. Targets (issue 14): no
client error, degraded within 2 sync intervals, at most 1.1x the quota while degraded under
stable traffic, correct within one window after the store comes back empty.

A store that refuses connections fails a sync at once; one that does not answer (stop,
partition) can only fail it at `store.timeout_ms` (500 ms by default), so the replicas degrade
after two of those. `--timeout-ms` sets it.

    python -m bench.store_faults                       # the three faults, 40 + 30 + 30 s each
    python -m bench.store_faults --faults stop --timeout-ms 100
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from bench.shared_accuracy import SLIDING_S, fullest_window
from devkit.producing import Timeline, produce, start_replicas
from devkit.relay import Relay
from devkit.tansu import Broker
from devkit.valkey import ValkeyServer

MIB = 1024 * 1024
QUOTA = MIB
CLIENT_ID = "faults-tenant"
FAULTS = ("kill", "stop", "partition")
GAUGE = "kafka_quota_proxy_store_degraded"


@dataclass
class Outcome:
    fault: str
    errors: int
    degraded_after: float | None  # seconds from the fault until every replica was degraded
    shared_after: float | None  # seconds from the store's return until every one shared again
    before: float  # aggregate bytes/s over the healthy period's second half
    during: float  # aggregate bytes/s while every replica was degraded
    during_window: float  # fullest sliding 11 s window while degraded, in windows' worth
    first_window: float  # bytes/s in the first 11 s after the store came back
    second_window: float  # bytes/s in the next 11 s


def _watch(proxies: Sequence, start: float, stop: threading.Event,
           states: list[tuple[float, tuple[int, ...]]]) -> None:
    while not stop.is_set():
        try:
            seen = tuple(int(p.metric(GAUGE)) for p in proxies)
        except OSError:
            seen = ()
        if seen:
            states.append((time.monotonic() - start, seen))
        stop.wait(0.05)


def _first(states: list[tuple[float, tuple[int, ...]]], after: float, value: int) -> float | None:
    for t, seen in states:
        if t >= after and all(s == value for s in seen):
            return t
    return None


def run_fault(broker: Broker, node_id: int, fault: str, healthy: float = 40.0, faulted: float = 30.0,
              after: float = 30.0, replicas: int = 3, timeout_ms: int | None = None) -> Outcome:
    prefix = f"faults{fault}{int(time.time())}"
    store: dict = {"key_prefix": prefix}
    if timeout_ms is not None:
        store["timeout_ms"] = timeout_ms
    with ExitStack() as stack:
        valkey = ValkeyServer().start()
        stack.callback(valkey.stop)
        relay = Relay(valkey.port).start()
        stack.callback(relay.stop)
        store["url"] = f"redis://{relay.address}"
        config = {"quota": {"scope": "cluster"},
                  "quotas": [{"client-id": CLIENT_ID, "producer_byte_rate": QUOTA}],
                  "store": store}
        topic = f"faults-{prefix}"
        proxies = start_replicas(stack, broker.address, node_id, replicas, config, topic)
        total = healthy + faulted + after
        start = time.monotonic() + 0.5
        timelines = [Timeline() for _ in proxies]
        threads = [threading.Thread(target=produce, daemon=True,
                                    args=(p.bootstrap, topic, CLIENT_ID, start, total, timelines[i]))
                   for i, p in enumerate(proxies)]
        for thread in threads:
            thread.start()
        states: list[tuple[float, tuple[int, ...]]] = []
        stop_watching = threading.Event()
        watcher = threading.Thread(target=_watch, args=(proxies, start, stop_watching, states),
                                   daemon=True)
        watcher.start()
        time.sleep(max(0.0, start + healthy - time.monotonic()))
        fault_at = time.monotonic() - start
        if fault == "kill":
            valkey.kill()
        elif fault == "stop":
            valkey.pause()
        else:
            relay.blackhole(faulted)
        time.sleep(max(0.0, start + healthy + faulted - time.monotonic()))
        back_at = time.monotonic() - start
        if fault == "kill":
            valkey.restart(empty=True)
        elif fault == "stop":
            valkey.resume()
        for thread in threads:
            thread.join(total + 120)
        stop_watching.set()
        watcher.join(5)

    def acked(t: float) -> int:
        return sum(tl.at(t) for tl in timelines)

    def rate(a: float, b: float) -> float:
        return (acked(b) - acked(a)) / (b - a) if b > a else 0.0

    degraded = _first(states, fault_at, 1)
    shared = _first(states, back_at, 0)
    from_ = degraded if degraded is not None else fault_at
    return Outcome(
        fault, sum(tl.errors for tl in timelines),
        None if degraded is None else degraded - fault_at,
        None if shared is None else shared - back_at,
        rate(healthy / 2, fault_at), rate(from_, back_at),
        fullest_window(acked, from_, back_at) / (QUOTA * SLIDING_S),
        rate(back_at, back_at + SLIDING_S), rate(back_at + SLIDING_S, back_at + 2 * SLIDING_S))


def rows(o: Outcome) -> list[tuple[str, str]]:
    def s(x: float | None) -> str:
        return "never" if x is None else f"{x:.2f} s"

    return [
        (f"{o.fault}: delivery errors", str(o.errors)),
        (f"{o.fault}: every replica degraded after", s(o.degraded_after)),
        (f"{o.fault}: every replica shared again after", s(o.shared_after)),
        (f"{o.fault}: aggregate before the fault",
         f"{o.before / MIB:.3f} MiB/s ({o.before / QUOTA:.2f}x the quota)"),
        (f"{o.fault}: aggregate while degraded",
         f"{o.during / MIB:.3f} MiB/s ({o.during / QUOTA:.2f}x); fullest 11 s window {o.during_window:.2f}x"),
        (f"{o.fault}: first 11 s after the store came back",
         f"{o.first_window / MIB:.3f} MiB/s ({o.first_window / QUOTA:.2f}x)"),
        (f"{o.fault}: next 11 s", f"{o.second_window / MIB:.3f} MiB/s ({o.second_window / QUOTA:.2f}x)"),
    ]


def run(faults: Sequence[str] = FAULTS, healthy: float = 40.0, faulted: float = 30.0, after: float = 30.0,
        timeout_ms: int | None = None) -> list[tuple[str, str]]:
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    out: list[tuple[str, str]] = [("load average at the start", load)]
    with ExitStack() as stack:
        broker = Broker().start()
        stack.callback(broker.stop)
        node_id = broker.node_id()
        for fault in faults:
            out += rows(run_fault(broker, node_id, fault, healthy, faulted, after, timeout_ms=timeout_ms))
    out.append(("load average at the end", " ".join(f"{x:.1f}" for x in os.getloadavg())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.store_faults")
    ap.add_argument("--faults", nargs="*", default=list(FAULTS), choices=FAULTS)
    ap.add_argument("--healthy", type=float, default=40.0)
    ap.add_argument("--faulted", type=float, default=30.0)
    ap.add_argument("--after", type=float, default=30.0)
    ap.add_argument("--timeout-ms", type=int, default=None)
    args = ap.parse_args()
    for name, value in run(args.faults, args.healthy, args.faulted, args.after, args.timeout_ms):
        print(f"{name:50s} {value}")


if __name__ == "__main__":
    main()
