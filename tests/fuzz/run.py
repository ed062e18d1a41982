"""`make fuzz`: every target under atheris for `--runs` inputs each, then one line per target.

    python -m tests.fuzz.run [--runs 1000000] [--jobs 2] [--out build/fuzz] [TARGET ...]

Each target runs as its own libFuzzer process (tests/fuzz/atheris_main.py) over the committed
seed corpus (tests/fuzz/corpus/TARGET, read only) and a working corpus in OUT/TARGET/corpus,
where the inputs it finds go. A crash stops that target; its input is OUT/TARGET/crash-<sha1>,
and its log OUT/TARGET/fuzz.log has the traceback. Exit status 1 if any target crashed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.fuzz.targets import TARGETS

CORPUS = Path(__file__).parent / "corpus"
MAX_LEN = 16384
# Stream targets: their seeds are a connection's first 512 bytes, and every byte costs a feed.
MAX_LEN_OF = {"framing": 1024, "proxy_protocol": 1024}
WIDTH = max(len(t) for t in TARGETS)  # of the target column
_STAT = re.compile(r"^stat::(\w+):\s+(\d+)", re.M)
_DONE = re.compile(r"^Done \d+ runs in (\d+) second", re.M)
_PROGRESS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)", re.M)


@dataclass
class Outcome:
    target: str
    runs: int
    cov: int
    features: int
    corpus: int
    crashes: int
    seconds: float
    status: int


def fuzz(target: str, runs: int, out: Path) -> Outcome:
    work = out / target
    (work / "corpus").mkdir(parents=True, exist_ok=True)
    log = work / "fuzz.log"
    command = [sys.executable, "-m", "tests.fuzz.atheris_main", target, str(work / "corpus"),
               str(CORPUS / target), f"-runs={runs}", f"-max_len={MAX_LEN_OF.get(target, MAX_LEN)}",
               "-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1", f"-artifact_prefix={work}/",
               "-print_pcs=0", "-reduce_inputs=1"]
    start = time.monotonic()
    with open(log, "w") as f:
        status = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    return summarize(target, out, time.monotonic() - start, status)


def summarize(target: str, out: Path, seconds: float | None = None, status: int | None = None) -> Outcome:
    """The outcome of a target's run, read from its log and its crash files (the time and exit
    status too, when they are not given: libFuzzer's own count of seconds, and whether it ended)."""
    work = out / target
    text = (work / "fuzz.log").read_text(errors="replace")
    if seconds is None:
        done = _DONE.search(text)
        seconds = float(done.group(1)) if done else 0.0
    if status is None:
        status = 0 if _DONE.search(text) else 1
    stats = {k: int(v) for k, v in _STAT.findall(text)}
    progress = _PROGRESS.findall(text)
    last = progress[-1] if progress else ("0", "0", "0", "0")
    crashes = len([p for p in work.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-", "leak-"))])
    executed = stats.get("number_of_executed_units", int(last[0]))
    return Outcome(target, executed, int(last[1]), int(last[2]), int(last[3]), crashes, seconds, status)


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the atheris fuzz targets (make fuzz).")
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=f"some of: {', '.join(TARGETS)}")
    parser.add_argument("--runs", type=int, default=1_000_000, help="inputs per target")
    parser.add_argument("--jobs", type=int, default=2, help="targets run side by side")
    parser.add_argument("--out", type=Path, default=Path("build/fuzz"))
    parser.add_argument("--report", action="store_true",
                        help="run nothing: print the table from the logs already in OUT")
    args = parser.parse_args()
    args.targets = args.targets or list(TARGETS)
    if unknown := set(args.targets) - set(TARGETS):
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    start = time.monotonic()
    if not args.report:
        print(f"fuzzing {len(args.targets)} targets, {args.runs} inputs each, {args.jobs} at a time; "
              f"logs in {args.out}/TARGET/fuzz.log", flush=True)
    outcomes = []
    if args.report:
        outcomes = [summarize(t, args.out) for t in args.targets if (args.out / t / "fuzz.log").exists()]
    else:
        with ThreadPoolExecutor(args.jobs) as pool:
            for outcome in pool.map(lambda t: fuzz(t, args.runs, args.out), args.targets):
                outcomes.append(outcome)
                print(f"  {outcome.target:{WIDTH}} done in {outcome.seconds:6.0f} s", flush=True)
    print(f"\n{'target':{WIDTH}} {'inputs run':>11} {'cov':>6} {'features':>9} {'corpus':>7} "
          f"{'crashes':>8} {'seconds':>8}")
    for o in outcomes:
        failed = "" if o.status == 0 else f"   exit {o.status}, see {args.out}/{o.target}/"
        print(f"{o.target:{WIDTH}} {o.runs:11} {o.cov:6} {o.features:9} {o.corpus:7} {o.crashes:8} "
              f"{o.seconds:8.0f}{failed}")
    print(f"wall time {time.monotonic() - start:.0f} s")
    return 1 if any(o.crashes or o.status for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
