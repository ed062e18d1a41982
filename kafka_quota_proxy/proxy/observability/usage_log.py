"""The per-tenant usage log: what each (user, client-id) did, interval by interval.

How the loop never waits for a disk, and what is counted where: docs/usage-log.md, "How it is
written".
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import queue
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from kafka_quota_proxy.config.usage_settings import UsageLogSettings
from kafka_quota_proxy.proxy.context import RequestContext, request_time_ms
from kafka_quota_proxy.proxy.observability.metrics import METRIC_PREFIX
from kafka_quota_proxy.quota import usage
from kafka_quota_proxy.quota.kinds import (
    NEW_PRODUCER_IDS,
    PERMITS,
    REQUEST_BYTES,
    RESPONSE_BYTES,
    RESPONSE_FACTS,
    tenant_kinds,
    user_only_keys,
)
from kafka_quota_proxy.quota.resolution import QuotaResolver, QuotaStore

log = logging.getLogger("kafka_quota_proxy.usage")

_GROUP_INDEX = {group: i for i, group in enumerate(usage.GROUPS)}


class TenantUsage:
    """One tenant's counters for the current interval."""

    __slots__ = ("counters", "requests", "throttle_ms", "throttled", "topics")

    def __init__(self, kinds: int, counters: Sequence[float]) -> None:
        """`kinds`: the meter's throttle types; `counters`: its counters' starting values
        (UsageMeter.counters: each tenant kind's usage counter and the tenant's new
        connections; 0.0 for a time, 0 for a count)."""
        self.counters = list(counters)  # by the meter's counters
        self.requests = [0] * len(usage.GROUPS)
        self.throttle_ms = [0] * kinds  # by the meter's throttle types
        self.throttled = [0] * kinds
        # usage_log.topics: topic -> its bytes, usage.TOPIC_COUNTERS (produce, fetch, then refused)
        self.topics: dict[str, list[int]] | None = None


Tenants = dict[str, dict[str, TenantUsage]]  # user -> client-id -> usage


@dataclass(frozen=True, slots=True)
class Interval:
    """A closed interval on its way to the writer."""

    start_ms: int
    tenants: Tenants
    quotas: QuotaStore
    throttle_types: tuple[str, ...]  # the tenants' throttles, in this order (the meter's)
    counters: tuple[str, ...]  # the tenants' counters, in this order (the meter's)


class UsageMeter:
    """Counts per tenant on the event loop; hands closed intervals to a `UsageWriter`."""

    def __init__(self, settings: UsageLogSettings, store: QuotaStore, writer: UsageWriter,
                 permits: Callable[[RequestContext], int],
                 wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
        self.settings = settings
        self.store = store
        self.writer = writer
        self.permits = permits  # partitions a mutation request creates or deletes
        self.wall_ms = wall_ms
        self.interval_ms = settings.interval_seconds * 1000
        self.start_ms = self._aligned(wall_ms())
        self.tenants: Tenants = {}
        self.count = 0
        self.dropped = 0  # records of intervals the writer's queue had no room for
        self.unmetered = 0  # requests of tenants beyond max_tenants
        self.topics = settings.topics
        self.topic_count = 0  # (tenant, topic) pairs in the current interval
        self.topics_unmetered = 0  # topic byte counts of pairs beyond max_tenants
        # The tenant kinds' throttle types (quota/kinds.py, a registered kind's included)
        self.throttle_types = usage.throttle_types()
        self._throttle_index = {t: i for i, t in enumerate(self.throttle_types)}
        # Each tenant kind's usage counter and the new connections (quota/usage.py), taken at
        # start, as the throttle types: a kind counts what its quota measures, the fact it
        # declares (QuotaKind.metered) of the requests it names, or of every request.
        self.counters = usage.counter_names()
        at = {name: i for i, name in enumerate(self.counters)}
        self._connections = at["connections"]
        self._zeros: list[float] = [0] * len(self.counters)
        for i in (at[name] for name in usage.time_counters()):
            self._zeros[i] = 0.0  # milliseconds, written to 3 decimals
        # (fact, its counter, where a topic's share of it goes in usage_log.topics, -1: nowhere)
        on_request: dict[int | None, list[tuple[str, int, int]]] = {None: []}  # None: every request's
        on_response: dict[int | None, list[tuple[str, int, int]]] = {None: []}
        self._topic_kinds = len(usage.TOPIC_KINDS)
        for kind in tenant_kinds():
            fact, apis = kind.metered
            if not kind.usage_counter or not fact:
                continue
            topic_at = usage.TOPIC_KINDS.index(kind) if kind in usage.TOPIC_KINDS else -1
            side = on_response if fact in RESPONSE_FACTS else on_request
            for api in apis or (None,):
                side.setdefault(api, []).append((fact, at[kind.usage_counter], topic_at))
        # For each API key a kind names, what its request (its response) adds to which counters,
        # every request's included; what any other API key's adds.
        self._every_request, self._every_response = tuple(on_request[None]), tuple(on_response[None])
        self._on_request = {api: (*facts, *self._every_request)
                            for api, facts in on_request.items() if api is not None}
        self._on_response = {api: (*facts, *self._every_response)
                             for api, facts in on_response.items() if api is not None}

    def _aligned(self, now_ms: int) -> int:
        return now_ms - now_ms % self.interval_ms

    def _tenant(self, user: str, client_id: str) -> TenantUsage | None:
        by_client = self.tenants.get(user)
        if by_client is None:
            by_client = self.tenants[user] = {}
        else:
            found = by_client.get(client_id)
            if found is not None:
                return found
        if self.count >= self.settings.max_tenants:
            self.unmetered += 1
            return None
        self.count += 1
        found = by_client[client_id] = TenantUsage(len(self.throttle_types), self._zeros)
        return found

    # -- counting, on the event loop -----------------------------------------------------------

    def request(self, ctx: RequestContext) -> None:
        """A request that passed the request stages (forwarded, or answered by the proxy)."""
        if ctx.raw:
            return  # a bare legacy SASL token
        conn = ctx.conn
        t = self._tenant(conn.principal, ctx.header.client_id or "")
        if t is None:
            return
        key = ctx.api_key
        t.requests[_GROUP_INDEX[usage.api_group(key)]] += 1
        counters = t.counters
        if not conn.metered:
            conn.metered = True
            counters[self._connections] += 1
        for fact, i, topic_at in self._on_request.get(key, self._every_request):
            if fact == REQUEST_BYTES:
                counters[i] += len(ctx.frame) - 4
                if topic_at >= 0 and self.topics and ctx.topic_bytes:
                    self._count_topics(t, ctx.topic_bytes, topic_at)
            elif fact == NEW_PRODUCER_IDS:
                charged = ctx.charged
                if charged is not None:
                    counters[i] += charged.new_producer_ids
            elif fact == PERMITS:
                charged = ctx.charge()
                if charged.permits is None:
                    try:
                        charged.permits = self.permits(ctx)
                    except Exception:  # noqa: BLE001 - an undecodable body is the broker's to refuse
                        charged.permits = 0
                counters[i] += charged.permits
            else:  # REQUESTS
                counters[i] += 1

    def response(self, ctx: RequestContext, size: int) -> None:
        """A response written to the client: `size` bytes, size prefix included."""
        if ctx.raw:
            return
        now = perf_counter()
        if ctx.times.answered:
            time_ms = request_time_ms(ctx, now)
        else:
            time_ms = (now - ctx.times.received) * 1000.0  # answered by the proxy itself
        t = self._tenant(ctx.conn.principal, ctx.header.client_id or "")
        if t is None:
            return
        counters = t.counters
        for fact, i, topic_at in self._on_response.get(ctx.api_key, self._every_response):
            if fact == RESPONSE_BYTES:
                counters[i] += size - 4  # as a request's: the message without its size prefix
                if topic_at >= 0 and self.topics and ctx.topic_bytes:
                    self._count_topics(t, ctx.topic_bytes, topic_at)
            else:  # TIME_MS
                counters[i] += time_ms

    def _count_topics(self, t: TenantUsage, counted: list[tuple[str, int, int]], at: int) -> None:
        """Add a request's bytes per topic to the topic kind `at` (usage.TOPIC_COUNTERS: 0 for
        Produce, 1 for Fetch; the refused bytes go as many places further on as there are topic
        kinds)."""
        topics = t.topics
        if topics is None:
            topics = t.topics = {}
        for topic, passed, refused in counted:
            found = topics.get(topic)
            if found is None:
                if self.topic_count >= self.settings.max_tenants:
                    self.topics_unmetered += 1
                    continue
                self.topic_count += 1
                found = topics[topic] = [0] * (2 * self._topic_kinds)
            found[at] += passed
            found[at + self._topic_kinds] += refused

    def throttled(self, user: str, client_id: str, quota_type: str, throttle_ms: int) -> None:
        t = self._tenant(user, client_id)
        i = self._throttle_index.get(quota_type)
        if t is None or i is None:
            return
        t.throttle_ms[i] += throttle_ms
        t.throttled[i] += 1

    # -- interval boundaries ---------------------------------------------------------------------

    def rotate(self) -> None:
        """Close the current interval (at its boundary, or at shutdown) and queue it."""
        tenants, count = self.tenants, self.count
        start = self.start_ms
        self.tenants, self.count, self.topic_count = {}, 0, 0
        self.start_ms = self._aligned(self.wall_ms())
        if self.start_ms == start:
            self.start_ms = start + self.interval_ms  # rotated early (shutdown): never reuse a start
        if not tenants:
            return
        if not self.writer.submit(Interval(start, tenants, self.store.snapshot(), self.throttle_types,
                                           self.counters)):
            self.dropped += count

    def seconds_to_boundary(self) -> float:
        return max(0.0, (self._aligned(self.wall_ms()) + self.interval_ms - self.wall_ms()) / 1000)


class UsageWriter:
    """The thread that turns intervals into JSON Lines files, one per UTC hour."""

    def __init__(self, settings: UsageLogSettings, instance: str) -> None:
        self.settings = settings
        self.instance = instance
        self.dir = Path(settings.dir)
        self.queue: queue.Queue[Interval | None] = queue.Queue(maxsize=settings.queue_intervals)
        self.written = 0  # records
        self.errors = 0  # intervals lost to write errors
        self._file: Any = None
        self._path: Path | None = None
        self._thread = threading.Thread(target=self._run, name="usage-log-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, interval: Interval) -> bool:
        """Queue an interval without waiting; False if the queue is full."""
        try:
            self.queue.put_nowait(interval)
            return True
        except queue.Full:
            return False

    def close(self, timeout: float = 30.0) -> None:
        """Write everything queued, then stop. Waits up to `timeout` seconds for the disk."""
        if not self._thread.is_alive():
            return
        try:
            self.queue.put(None, timeout=timeout)
        except queue.Full:
            log.error("usage log: the writer is stuck; %d interval(s) not written", self.queue.qsize())
            return
        self._thread.join(timeout)

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        self._gzip_leftovers()
        while True:
            interval = self.queue.get()
            if interval is None:
                break
            try:
                self._write(interval)
            except OSError as exc:
                self.errors += 1
                log.error("usage log: cannot write the interval at %d: %s", interval.start_ms, exc)
                self._close_file()
        self._close_file()

    def _hour_path(self, start_ms: int) -> Path:
        t = time.gmtime(start_ms / 1000)
        return (self.dir / f"dt={t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}" / f"hour={t.tm_hour:02d}"
                / f"usage-{self.instance}.jsonl")

    def _write(self, interval: Interval) -> None:
        path = self._hour_path(interval.start_ms)
        if path != self._path:
            previous = self._path
            self._close_file()
            if previous is not None:
                self._gzip(previous)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the hour
            self._path = path
        lines = self._records(interval)
        self._file.write("".join(lines))
        self._file.flush()
        self.written += len(lines)

    def _records(self, interval: Interval) -> list[str]:
        resolvers = {key: QuotaResolver(interval.quotas, key) for key in usage.quota_keys()}
        by_user = user_only_keys()  # a user's alone (producer ids): resolved without a client-id
        seconds = self.settings.interval_seconds
        lines = []
        for user, by_client in interval.tenants.items():
            for client_id, t in by_client.items():
                quotas: dict[str, float | None] = {}
                for key, resolver in resolvers.items():
                    quotas[key.value] = resolver.resolve(
                        user, None if key in by_user else client_id).quota
                rec = usage.record(
                    interval.start_ms, seconds, self.instance, user, client_id,
                    {name: round(value, 3) if isinstance(value, float) else value
                     for name, value in zip(interval.counters, t.counters, strict=True)},
                    dict(zip(usage.GROUPS, t.requests, strict=True)),
                    dict(zip(interval.throttle_types, t.throttle_ms, strict=True)),
                    dict(zip(interval.throttle_types, t.throttled, strict=True)), quotas, t.topics)
                lines.append(json.dumps(rec, separators=(",", ":")) + "\n")
        return lines

    def _close_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                log.error("usage log: closing %s: %s", self._path, exc)
            self._file = None
            self._path = None

    def _gzip(self, path: Path) -> None:
        """Compress a closed hour's file to .jsonl.gz (appended as a new gzip member if one
        exists already) and remove the plain file."""
        target = path.with_name(path.name + ".gz")
        try:
            with open(path, "rb") as src, open(target, "ab") as raw:
                with gzip.GzipFile(fileobj=raw, mode="ab") as dst:
                    shutil.copyfileobj(src, dst)
                raw.flush()
                os.fsync(raw.fileno())  # on disk before the plain copy goes
            path.unlink()
        except OSError as exc:
            self.errors += 1
            log.error("usage log: cannot gzip %s: %s", path, exc)

    def _gzip_leftovers(self) -> None:
        """Gzip this instance's plain files of past hours (a previous run's last hour)."""
        current = self._hour_path(time.time_ns() // 1_000_000)
        for path in sorted(self.dir.glob(f"dt=*/hour=*/usage-{self.instance}.jsonl")):
            if path != current:
                self._gzip(path)


def default_instance(listen_port: int) -> str:
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname()) or "proxy"
    return f"{host[:80]}-{listen_port}"


class UsageCollector(Collector):
    """The usage log's own health, read at scrape time."""

    def __init__(self, meter: UsageMeter) -> None:
        self.meter = meter

    def collect(self) -> Iterator[Any]:
        m, w = self.meter, self.meter.writer
        for name, text, value in (
                ("usage_records_written", "Usage records written to the log", w.written),
                ("usage_records_dropped", "Usage records dropped: the writer's queue was full", m.dropped),
                ("usage_requests_unmetered", "Requests of tenants beyond usage_log.max_tenants in "
                                             "their interval", m.unmetered),
                ("usage_topics_unmetered", "Topic byte counts of (tenant, topic) pairs beyond "
                                           "usage_log.max_tenants in their interval", m.topics_unmetered),
                ("usage_write_errors", "Intervals or hour files the usage log could not write", w.errors)):
            family = CounterMetricFamily(METRIC_PREFIX + name, text)
            family.add_metric([], value)
            yield family
