"""`python -m devkit.proxy_faults` (`make faults-proxy`): every proxy fault, the long version,
and a table of what was lost and how long recovery took. Exit status 1 if anything was lost."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from devkit.proxy_faults import file_kills, in_flight, under_load
from devkit.tansu import Broker


def _seconds(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f}, max {max(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devkit.proxy_faults", description=__doc__)
    p.add_argument("--rounds", type=int, default=5, help="SIGTERMs, and kill -9s, under load (5)")
    p.add_argument("--rate", type=float, default=2000, help="records/s the producer sends (2000)")
    p.add_argument("--kills", type=int, default=200,
                   help="kill -9s of each forked file writer (200); of users add and the proxy "
                        "changing quotas, a quarter and a tenth of that")
    p.add_argument("--concurrent", type=int, default=20, help="users add processes at once (20)")
    args = p.parse_args(argv)
    rows: list[tuple[str, str, str, str, str]] = []
    ok = True
    started = time.monotonic()
    broker = Broker().start()
    try:
        node_id = broker.node_id()
        for fault in under_load.FAULTS:
            run = under_load.run(broker, node_id, fault, rounds=args.rounds, rate=args.rate)
            v = run.verdict
            assert v is not None
            ok &= run.clean
            name = "SIGTERM" if fault == "sigterm" else "kill -9"
            rows.append((
                f"{name} of the proxy, restarted on the same ports after 3 s",
                f"idempotent librdkafka producer (acks=all) at {args.rate:.0f} records/s over 3 "
                "partitions, a consumer, both through the proxy",
                f"{len(run.rounds)} x {name}",
                f"{len(v.lost)} of {v.acked} acknowledged; {len(v.duplicated)} duplicated; "
                f"{len(v.out_of_order)} partitions out of order; consumer missed {run.reader_missing}",
                f"in flight at the signal: {[r.in_flight for r in run.rounds]}; "
                f"exit after the signal {_seconds([r.exit_seconds for r in run.rounds])} s; "
                "producer reconnect after the restart "
                f"{_seconds([r.reconnect_seconds for r in run.rounds])} s; "
                f"consumer {_seconds([r.read_again_seconds for r in run.rounds])} s; "
                f"acknowledged through a duplicate-sequence answer: {v.offset_unknown}"))
        r = in_flight.pipelined_then_sigterm(broker, node_id, n=20)
        good = r.fetch_answered and r.answers == [(i, 0, 0) for i in range(20)] \
            and r.closed_cleanly and r.at_broker == list(range(20))
        ok &= good
        rows.append(("SIGTERM with requests in flight", "a long poll then 20 Produce pipelined, "
                     "waiting at the broker", "SIGTERM 0.5 s later",
                     f"{20 - len(r.answers)} of 20 unanswered; {20 - len(r.at_broker)} not at the broker",
                     f"answered {len(r.answers)} with error 0: {good}; FIN after the last: "
                     f"{r.closed_cleanly}; exit {r.exit_seconds:.2f} s"))
        r = in_flight.pipelined_then_sigterm(broker, node_id, n=5, record_bytes=50_000, quota=1000)
        good = [(c, e) for c, e, _ in r.answers] == [(0, 0)] and r.at_broker == [0] and r.closed_cleanly
        ok &= good
        rows.append(("SIGTERM of a throttled client", "a long poll then 5 Produce of 50 kB at "
                     "producer_byte_rate 1000", "SIGTERM 0.5 s later",
                     f"forwarded {len(r.answers)}, answered {len(r.answers)}; held ones written: "
                     f"{len(r.at_broker) - 1}",
                     f"throttle {r.answers[0][2] if r.answers else '-'} ms, exit {r.exit_seconds:.2f} s "
                     "(not waiting for the throttle)"))
        s = in_flight.slow_reader_then_sigterm(broker, node_id, n=20)
        good = s.answered == list(range(20)) and s.ending == "end of stream"
        ok &= good
        rows.append(("SIGTERM of a slow reader", "20 Fetch of ~1.8 MB pipelined, one more unread",
                     "SIGTERM, reading begins 1 s later", f"{20 - len(s.answered)} of 20 answers lost",
                     f"ended by: {s.ending}"))
        with tempfile.TemporaryDirectory() as d:
            base = Path(d)
            for name in (*file_kills.KINDS, "cli", "proxy", "concurrent"):
                (base / name).mkdir()
            reports = [file_kills.fork_kills(kind, base / kind,
                                             args.kills if kind != "naive" else max(20, args.kills // 4))
                       for kind in file_kills.KINDS]
            reports.append(file_kills.cli_kills(base / "cli", max(5, args.kills // 4)))
            reports.append(file_kills.proxy_kills(broker, node_id, base / "proxy", max(3, args.kills // 10)))
            users = file_kills.concurrent_adds(base / "concurrent", args.concurrent)
        for rep in reports:
            naive = "naive" in rep.writer
            ok &= (not rep.clean) if naive else rep.clean
            caught = " (in place: must be caught)" if naive else ""
            rows.append((f"kill -9 mid-write: {rep.writer}{caught}",
                         f"{rep.versions_finished} versions written", f"{rep.kills} x kill -9",
                         f"{len(rep.torn)} of {rep.kills} reads torn or not old-or-new",
                         f"temp files left after a kill: at most {rep.leftovers_max}; "
                         f"after the next write: {rep.leftovers_end}"))
        good = len(users) == args.concurrent
        ok &= good
        rows.append(("users add at the same instant", f"{args.concurrent} processes, different users",
                     "-", f"{args.concurrent - len(users)} of {args.concurrent} users lost", ""))
    finally:
        broker.stop()
    print("| what was run | load held | faults injected | what was lost | figures |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\n{'nothing lost' if ok else 'SOMETHING WAS LOST'}; {time.monotonic() - started:.0f} s in all")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
