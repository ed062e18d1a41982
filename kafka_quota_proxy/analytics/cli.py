"""`kafka-quota-proxy analyze` and `kafka-quota-proxy generate-usage` (options: docs/analytics.md).

Spark, pandas, pyarrow and matplotlib (the `spark` extra) are imported only here, when a command
runs, so the proxy itself never needs them. Bad arguments, unreadable inputs and a missing extra
are one line and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from typing import NoReturn

from kafka_quota_proxy.analytics.summary import Summary

EXIT_USAGE = 2
PROG = "kafka-quota-proxy"
NEEDS = {"analyze": ("pyspark", "pandas", "pyarrow", "matplotlib"), "generate-usage": ("numpy",)}


class UsageError(Exception):
    """A bad command line, said in one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value
    return parse


def _percentile(text: str) -> float:
    value = _positive(float)(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"expected a percentile in (0, 100], got {text!r}")
    return value


def _conf(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def analyze_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=f"{PROG} analyze", description="Per-tenant usage report, recommended quotas and a "
                "what-if replay, from the proxy's usage log (on Spark).")
    p.add_argument("--usage", required=True, metavar="DIR", help="the usage log directory (usage_log.dir)")
    p.add_argument("--out", required=True, metavar="DIR", help="where the tables and report.html go")
    p.add_argument("--quotas", metavar="FILE",
                   help="the current quotas (proxy config or a `quotas:` list); default: as the log recorded")
    p.add_argument("--candidate", metavar="FILE",
                   help="quotas to replay against the current ones; default: the recommended quotas")
    p.add_argument("--master", metavar="URL", help="Spark master (default local[*], or spark-submit's)")
    p.add_argument("--percentile", type=_percentile, default=95.0,
                   help="the default quota is this percentile of the tenants' p99 demand (default 95)")
    p.add_argument("--headroom", type=_positive(float), default=1.5,
                   help="multiplier on the demand the quotas are made from (default 1.5)")
    p.add_argument("--top", type=_positive(int), default=10, help="outliers listed per measure (default 10)")
    p.add_argument("--window-num", type=_positive(int),
                   help="quota.window_num (default: from --quotas, or 11)")
    p.add_argument("--window-size-seconds", type=_positive(int),
                   help="quota.window_size_seconds (default: from --quotas, or 1)")
    p.add_argument("--conf", type=_conf, action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting, e.g. spark.driver.memory=4g (repeatable)")
    return p


def generate_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=f"{PROG} generate-usage", description="Write a synthetic usage log, in the proxy's "
                "format and layout, with known outliers.")
    p.add_argument("--out", required=True, metavar="DIR", help="the log directory to write")
    p.add_argument("--tenants", type=_positive(int), default=100, help="(default 100)")
    p.add_argument("--days", type=_positive(int), default=7, help="(default 7)")
    p.add_argument("--interval-seconds", type=_positive(int), default=10, help="(default 10)")
    p.add_argument("--start", default="2026-01-05", metavar="YYYY-MM-DD",
                   help="first day, UTC (default 2026-01-05, a Monday)")
    p.add_argument("--outliers", type=int, default=3, help="tenants made outliers (default 3)")
    p.add_argument("--seed", type=int, default=1, help="(default 1)")
    p.add_argument("--instance", default="proxy-a", help="the proxy instance named in the records")
    p.add_argument("--workers", type=_positive(int),
                   help="processes writing hours in parallel (default: auto)")
    return p


def _missing(command: str) -> list[str]:
    return [m for m in NEEDS[command] if importlib.util.find_spec(m) is None]


def main(argv: list[str]) -> int:
    """argv[0] is the command ("analyze" or "generate-usage"), the rest its arguments."""
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command not in NEEDS:
        print(f"{PROG}: expected a command: {' or '.join(NEEDS)}", file=sys.stderr)
        return EXIT_USAGE
    missing = _missing(command)
    if missing:
        print(f"{PROG} {command}: needs the spark extra (missing: {', '.join(missing)}): "
              f"pip install 'kafka-quota-proxy[spark]'", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _analyze(args) if command == "analyze" else _generate(args)
    except UsageError as exc:
        print(f"{PROG} {command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0


def _generate(argv: list[str]) -> int:
    from kafka_quota_proxy.analytics.generate import GenerateError, generate, make_plan

    args = generate_parser().parse_args(argv)
    try:
        plan = make_plan(args.tenants, args.days, args.interval_seconds, args.start, args.outliers, args.seed,
                         args.instance)
        result = generate(args.out, plan, args.workers)
    except (GenerateError, OSError) as exc:
        raise UsageError(str(exc)) from None
    rate = result["records"] / result["seconds"] if result["seconds"] else 0
    outliers = "; ".join(f"{o['user']}/{o['client_id']} ("
                         + ", ".join(f"{m} x{f:.1f}" for m, f in o["measures"].items()) + ")"
                         for o in result["outliers"]) or "none"
    days = f"{args.days} day" + ("s" if args.days != 1 else "")
    print(f"wrote {result['records']:,} records ({len(plan.tenants)} tenants, {days}, "
          f"{args.interval_seconds} s intervals) to {args.out} in {result['seconds']:.1f} s "
          f"({rate:,.0f} records/s)")
    print(f"injected outliers: {outliers}")
    return 0


def _analyze(argv: list[str]) -> int:
    args = analyze_parser().parse_args(argv)
    from pyspark.errors import AnalysisException, PySparkRuntimeError

    from kafka_quota_proxy.analytics.pipeline import Options, analyze
    from kafka_quota_proxy.analytics.quota_file import load_quota_file
    from kafka_quota_proxy.analytics.reading import UsageInputError, check_usage_dir
    from kafka_quota_proxy.analytics.session import start
    from kafka_quota_proxy.config.errors import ConfigError

    options = Options(args.usage, args.out, args.quotas, args.candidate, args.percentile, args.headroom,
                      int(args.top), args.window_num and int(args.window_num),
                      args.window_size_seconds and int(args.window_size_seconds))
    try:
        check_usage_dir(args.usage)
        for path in (args.quotas, args.candidate):
            if path:
                load_quota_file(path)  # before the 10 s of starting Spark
        spark, created = start(args.master, dict(args.conf))
    except (UsageInputError, ConfigError) as exc:
        raise UsageError(str(exc)) from None
    except PySparkRuntimeError as exc:
        raise UsageError(f"cannot start Spark: {str(exc).splitlines()[0]}") from None
    try:
        summary = analyze(spark, options)
    except (ConfigError, UsageInputError) as exc:
        raise UsageError(str(exc)) from None
    except AnalysisException as exc:
        raise UsageError(f"cannot read {args.usage}: {str(exc).splitlines()[0]}") from None
    except OSError as exc:
        raise UsageError(f"cannot write {args.out}: {exc}") from None
    finally:
        if created:
            spark.stop()
    _print_summary(summary)
    return 0


def _print_summary(s: Summary) -> None:
    print(f"read {s.records:,} records of {s.tenants:,} tenants ({s.bad_lines:,} bad lines skipped) "
          f"in {sum(s.seconds.values()):.1f} s")
    print(f"wrote {s.out}/report.html, recommended-quotas.yaml, recommended-quotas.sh and the tables "
          "(tenants, hourly, hour_of_day, outliers, recommendations, replay)")
