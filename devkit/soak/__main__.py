"""`python -m devkit.soak [--minutes N] [--out DIR]`: run the soak, print its report, exit 0 if it
passed and 1 if not. DIR (default soak-out/) gets samples.csv, soak.png, report.txt, proxy.log
and tansu.log."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from devkit.soak.run import run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=Path("soak-out"))
    args = parser.parse_args(argv)
    outcome = run(args.minutes, args.out, say=lambda line: print(line, flush=True))
    print("\n".join(outcome.report()), flush=True)
    print(f"samples: {args.out / 'samples.csv'}, plot: {args.out / 'soak.png'}", flush=True)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
