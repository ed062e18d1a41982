"""`make demo-stress`: the demo run again and again, each time cold (a fresh Tansu, fresh
processes, the page cache dropped where the machine allows) and with busy-loop processes taking
the cores beside it, counting mismatches by cause, to reproduce a rare loss.

    python -m devkit.demo.stress [--runs 50] [--hogs 2,3] [--seconds 20] [--broker tansu]
                                 [--out build/demo-stress]
    python -m devkit.demo.stress --time-read-back [--hogs 0,3] [--records 105000]

`--time-read-back` instead times the demo's read of the log back through the proxy (Tansu, a
proxy process, `--records` records of 1 KiB in 64 KiB batches over 3 partitions, as a demo of
20 s leaves them) once beside each count of busy loops: the demo gave that read 20 s until it
said how far it got.

Run i has hogs[i % len(hogs)] busy loops beside it. A run's verdict is the demo's own: MATCH, or
MISMATCH with the cause line of devkit/demo/diagnosis.py (the broker's loss, or the proxy's or
the consumer's), or the demo failing to run at all. The whole output of every run that did not
match is kept in --out. Prints a line a run, then the count by verdict; exit status 0 if every
run matched, 1 if not.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from devkit.processes import die_with_parent

DROP_CACHES = Path("/proc/sys/vm/drop_caches")
HOG = "while True: pass"


def drop_caches() -> bool:
    """Drops the page cache, dentries and inodes (the binaries and the venv are read from disk
    again), where the machine lets this process; whether it did."""
    try:
        subprocess.run(["sync"], check=False, timeout=60)
        DROP_CACHES.write_text("3\n")
    except OSError:
        return False
    return True


@contextmanager
def hogs(count: int) -> Iterator[None]:
    """`count` processes that each keep a core busy, until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG], preexec_fn=die_with_parent)
             for _ in range(count)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            with suppress(subprocess.TimeoutExpired):
                p.wait(10)


def verdict(returncode: int | None, out: str) -> str:
    """A run's verdict from the demo's output: MATCH, the mismatch's cause, or why it failed."""
    if returncode is None:
        return "the demo did not end in time"
    if re.search(r": MATCH$", out, re.MULTILINE) and returncode == 0:
        return "MATCH"
    if re.search(r": MISMATCH$", out, re.MULTILINE):
        cause = re.search(r"^  (cause: .*)$", out, re.MULTILINE)
        return "MISMATCH, " + (cause[1] if cause else "no cause given")
    stopped = re.search(r"^  stopped early: (.*)$", out, re.MULTILINE)
    return f"the demo failed (exit {returncode})" + (f": {stopped[1]}" if stopped else "")


def held(out: str) -> str:
    """The demo's line on the limited producer's rate over its last quota window, shortened."""
    m = re.search(r"^    demo-limited +([\d.]+ MiB/s), quota [^:\n]*: ([+-]\d+% of its quota, [^:\n]*)", out,
                  re.MULTILINE)
    return f"demo-limited {m[1]}, {m[2]}" if m else "no quota line"


def passed_over(out: str) -> int:
    """How many acknowledged records the demo's live consumer passed over and its read of the log
    back found (Tansu's fetch gap, docs/reliability.md): the runs where the read back decided."""
    m = re.search(r"^  ([\d,]+) acknowledged record\(s\) the live consumer passed over", out, re.MULTILINE)
    return int(m[1].replace(",", "")) if m else 0


def read_back_took(out: str) -> str:
    """The demo's line on its read of the log back, if it read it back."""
    m = re.search(r"^  the log read back through the proxy: (.*)$", out, re.MULTILINE)
    return f"; read back: {m[1]}" if m else ""


def time_read_back(records: int, counts: list[int]) -> None:
    """Prints how long devkit.demo.clients.read_back takes over a demo-sized log, beside each
    count of busy loops."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from devkit.demo.clients import read_back, record_key
    from devkit.processes import ProxyProcess
    from devkit.tansu import Broker

    broker = Broker().start()
    try:
        proxy = ProxyProcess(broker.address, broker.node_id()).start()
        try:
            topic = "read-back"
            admin = AdminClient({"bootstrap.servers": broker.address})  # alive until the answer
            admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
            p = Producer({"bootstrap.servers": broker.address, "linger.ms": 10, "batch.size": 65536})
            value = b"x" * 1024
            for seq in range(records):
                while True:
                    try:
                        p.produce(topic, value, key=record_key(0, seq))
                        break
                    except BufferError:
                        p.poll(0.05)
            assert p.flush(60) == 0
            for n in counts:
                drop_caches()
                with hogs(n):
                    found = read_back(proxy.bootstrap, topic, 3, seconds=300)
                end = "" if found.complete else " (not to the end)"
                print(f"{n} hog(s): read {len(found):,} of {records:,} records back through the proxy "
                      f"in {found.seconds:.1f} s{end}", flush=True)
        finally:
            proxy.stop()
    finally:
        broker.stop()


def cause_kind(v: str) -> str:
    """A verdict without its counts, to count verdicts by kind."""
    return re.sub(r"[\d,]+ record\(s\)", "N record(s)", v)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m devkit.demo.stress", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--hogs", default="2,3", help="busy loops beside each run, cycled (default 2,3)")
    p.add_argument("--seconds", type=float, default=20.0, help="each demo's --seconds (default 20)")
    p.add_argument("--broker", choices=("tansu", "kafka"), default="tansu")
    p.add_argument("--out", type=Path, default=Path("build/demo-stress"))
    p.add_argument("--time-read-back", action="store_true",
                   help="time the demo's read of the log back instead, beside each --hogs count")
    p.add_argument("--records", type=int, default=105_000, help="records for --time-read-back")
    a = p.parse_args(argv)
    try:
        counts = [int(x) for x in a.hogs.split(",")]
    except ValueError:
        p.error(f"--hogs takes counts separated by commas, not {a.hogs!r}")
    if a.runs <= 0 or a.seconds <= 0 or not counts or min(counts) < 0:
        p.error("--runs and --seconds must be positive, --hogs counts not negative")
    if a.time_read_back:
        time_read_back(a.records, counts)
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    tally: Counter[str] = Counter()
    read_backs = 0  # runs whose live consumer passed over records that the read back found
    for i in range(a.runs):
        n = counts[i % len(counts)]
        dropped = drop_caches()
        started = time.monotonic()
        with hogs(n):
            try:
                demo = [sys.executable, "-m", "devkit.demo", "--plain", "--seconds", str(a.seconds),
                        "--broker", a.broker]
                r = subprocess.run(demo, capture_output=True, text=True, timeout=a.seconds + 300,
                                   preexec_fn=die_with_parent)
                code: int | None = r.returncode
                out = r.stdout + r.stderr
            except subprocess.TimeoutExpired as exc:
                code = None
                out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
                    else (exc.stdout or "")
        v = verdict(code, out)
        tally[cause_kind(v)] += 1
        over = passed_over(out)
        read_backs += bool(over)
        kept = ""
        if v != "MATCH":
            path = a.out / f"run-{i + 1:03d}.log"
            path.write_text(out)
            kept = f" (output in {path})"
        print(f"run {i + 1}/{a.runs}: {n} hog(s), caches {'dropped' if dropped else 'kept'}, "
              f"{time.monotonic() - started:.0f} s: {v}; {held(out)}"
              + (f"; the live consumer passed over {over:,}, found in the log read back" if over else "")
              + read_back_took(out)
              + kept, flush=True)
    print(f"\n{a.runs} runs ({read_backs} where the live consumer passed over records that the read "
          "back found):")
    for v, n in tally.most_common():
        print(f"  {n:3d}  {v}")
    return 0 if tally.keys() == {"MATCH"} else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
