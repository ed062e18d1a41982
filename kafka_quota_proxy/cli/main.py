"""The `kafka-quota-proxy` command.

    kafka-quota-proxy --upstream HOST:PORT[,HOST:PORT...] --listen HOST:PORT [--advertised-host HOST]
                      [--metrics HOST:PORT] [--config FILE] [--log-level LEVEL] [--workers N] [...]
    kafka-quota-proxy check-config FILE
    kafka-quota-proxy users ...                 (SASL credentials for terminate mode)
    kafka-quota-proxy analyze --usage DIR --out DIR [...]   (the usage pipeline, on Spark)
    kafka-quota-proxy generate-usage --out DIR [...]        (synthetic usage logs)

Bad configuration is one line naming the key, and exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from kafka_quota_proxy.config import ConfigError, Settings, load_file, merge
from kafka_quota_proxy.config.installed import missing_modules
from kafka_quota_proxy.config.settings import parse_values
from kafka_quota_proxy.config.worker_settings import WORKER_ROLE_FLAG, parse_worker_role
from kafka_quota_proxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES

EXIT_CONFIG = 2


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kafka-quota-proxy",
        description="A Kafka-protocol proxy that enforces Kafka's client quotas. "
                    "Other commands: 'check-config FILE', 'users', 'analyze', "
                    "'generate-usage'.")
    p.add_argument("--upstream", help="broker(s) to proxy: HOST:PORT[,HOST:PORT...]")
    p.add_argument("--listen", help="bootstrap listener HOST:PORT (default 0.0.0.0:9092)")
    p.add_argument("--advertised-host", help="host name clients are told to connect to")
    p.add_argument("--node-port-base", type=int,
                   help="broker N is served on port NODE_PORT_BASE+N (default: listen port + 1)")
    p.add_argument("--metrics", help="serve Prometheus metrics on HOST:PORT")
    p.add_argument("--config", help="YAML config file (flags override it)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    p.add_argument("--max-frame-bytes", type=int,
                   help=f"largest request accepted (default {DEFAULT_MAX_FRAME_BYTES})")
    p.add_argument("--workers", help="worker processes sharing the ports on this host (default 1)")
    p.add_argument(WORKER_ROLE_FLAG, help=argparse.SUPPRESS)  # set by the supervisor only
    return p


FLAG_KEYS = {"upstream": "upstream", "listen": "listen", "advertised_host": "advertised_host",
             "node_port_base": "node_port_base", "metrics": "metrics", "log_level": "log_level",
             "max_frame_bytes": "max_frame_bytes", "workers": "workers"}


def settings_from_args(argv: Sequence[str]) -> Settings:
    args = _run_parser().parse_args(argv)
    layers: list[dict[str, Any]] = []
    if args.config:
        layers.append(load_file(args.config))
    flags = {key: getattr(args, attr) for attr, key in FLAG_KEYS.items() if getattr(args, attr) is not None}
    try:
        layers.append(parse_values(flags))
    except ConfigError as exc:
        flag = "--" + exc.key.replace("_", "-")
        raise ConfigError(flag, exc.message) from None
    if args.worker_role is not None:
        layers.append({"worker": parse_worker_role(args.worker_role)})
    return merge(*layers)


def configure_logging(level: str, tag: str = "") -> None:
    """Log lines to stderr; `tag` (a worker's "w1") tells the workers' interleaved lines apart."""
    tag = f"[{tag}] " if tag else ""
    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s",
                        stream=sys.stderr)


def run_loop(main: Coroutine[Any, Any, Any]) -> Any:
    """Run on uvloop where it is installed (not on Windows), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def _run(argv: Sequence[str]) -> int:
    settings = settings_from_args(argv)
    if missing := missing_modules(settings):
        print(f"kafka-quota-proxy: cannot start: {missing[0]}", file=sys.stderr)
        return 1
    if settings.worker is not None:
        from kafka_quota_proxy.proxy.parent_death import die_with

        if not die_with(settings.worker.supervisor_pid):
            return 1  # the supervisor is gone already
        configure_logging(settings.log_level, settings.worker.name)
    elif settings.workers > 1:
        configure_logging(settings.log_level, "supervisor")
        from kafka_quota_proxy.proxy.workers.supervisor import Supervisor

        return Supervisor(settings, argv).run()
    else:
        configure_logging(settings.log_level)
    from kafka_quota_proxy.proxy.server import Proxy

    proxy = Proxy(settings)
    try:
        run_loop(proxy.run_until_signalled())
    except OSError as exc:
        print(f"kafka-quota-proxy: cannot start: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _check_config(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="kafka-quota-proxy check-config",
                                description="Validate a config file and print the settings it gives.")
    p.add_argument("file")
    p.add_argument("--probe-store", action="store_true",
                   help="also connect to the store: section's server and run one sync's calls")
    args = p.parse_args(argv)
    try:
        settings = merge(load_file(args.file))
    except ConfigError as exc:
        raise ConfigError(exc.key, exc.message, exc.source or args.file) from None
    print(f"{args.file}: OK")
    print(f"  listen {settings.listen}, upstream {', '.join(map(str, settings.upstream))}")
    print(f"  clients are told host {settings.effective_advertised_host}; "
          f"broker N on port {settings.effective_node_port_base}+N")
    if settings.workers > 1:
        print(f"  {settings.workers} worker processes sharing these ports, one /metrics merging them")
    else:
        print("  1 worker process")
    from kafka_quota_proxy.proxy.quota_runtime.access import management_policy

    policy, warnings = management_policy(settings)
    print(f"  {policy}")
    for warning in warnings:
        print(f"  warning: {warning}")
    if missing := missing_modules(settings):
        for line in missing:
            print(f"  error: {line}")
        return 1
    store = settings.store
    if store is None:
        print("  quota state: shared by the workers through a Valkey the supervisor starts (no store:)"
              if settings.workers > 1 else "  quota state: this process's own (no store:)")
        if args.probe_store:
            print("  store probe: nothing to probe (no store:)")
    else:
        print(f"  quota state shared through {store.redacted_url}"
              f"{' (Valkey Cluster)' if store.cluster else ''}, key prefix {store.key_prefix!r}, "
              f"synced every {store.sync_interval_ms} ms; on store failure: {store.on_failure} "
              f"after {store.degraded_grace_seconds:g}s")
        if settings.quota.scope == "proxy":
            print("  warning: quota.scope proxy is each process's own budget even with a store; "
                  "use broker or cluster to share it")
        if args.probe_store:
            from kafka_quota_proxy.proxy.store.probe import probe

            ok, line = run_loop(probe(store))
            print(f"  store probe: {line}")
            if not ok:
                return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["check-config"]:
            return _check_config(argv[1:])
        if argv[:1] == ["users"]:
            from kafka_quota_proxy.cli.users import main as users_main

            return users_main(argv[1:])
        if argv[:1] in (["analyze"], ["generate-usage"]):
            # The pipeline needs the `spark` extra; analytics.cli says so if it is missing.
            from kafka_quota_proxy.analytics.cli import main as analytics_main

            return analytics_main(argv)
        return _run(argv)
    except ConfigError as exc:
        print(f"kafka-quota-proxy: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
