"""What-if replay: recorded usage sent again through the proxy's own quota engine, under other quotas.

One replay unit (the tenants sharing one quota sensor, on one instance) is fed to
`quota.managers.ClientQuotaManager` with time taken from the log. The demand model, the results
and the two exact fast paths: docs/analytics.md.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import byte_rate_kinds
from kafka_quota_proxy.quota.managers import ClientQuotaManager
from kafka_quota_proxy.quota.rate import MetricConfig, Rate
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.sensors import LocalSensors

# What is replayed: the byte rates (quota/kinds.py), by their measure's name ("produce", "fetch"),
# which is also the name of the requests' group in a usage record.
KINDS: dict[str, QuotaKey] = {kind.measure or kind.key.value: kind.key for kind in byte_rate_kinds()}
MAX_REQUESTS_PER_INTERVAL = 10
# The bound is compared with a sum of floats; stay clear of the last bit.
_SAFETY = 1 - 1e-9

Quotas = Mapping[QuotaEntity, Mapping[QuotaKey, float]]

# What a replay unit reads: one row per record (several per interval are summed).
INPUT_COLUMNS = ("user", "client_id", "start_ms", "interval_s", "bytes", "requests", "throttle_ms",
                 "recorded_quota")
# What it returns: one row per tenant.
RESULT_COLUMNS = ("user", "client_id", "quota", "demand_bytes", "sent_bytes", "throttle_ms",
                  "throttled_requests", "delayed_bytes", "backlog_bytes", "recorded_throttle_ms",
                  "simulated_intervals", "fast_intervals", "skipped_intervals")


def demand_bytes(amount: np.ndarray, throttle_ms: np.ndarray, quota: np.ndarray) -> np.ndarray:
    """The demand model: bytes + throttle_ms / 1000 * Q_current (Q missing: no addition), whole bytes."""
    q = np.nan_to_num(np.asarray(quota, dtype=float), nan=0.0)
    return np.rint(np.asarray(amount, dtype=float) + np.asarray(throttle_ms, dtype=float) / 1000.0 * q
                   ).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Requests:
    """Every request of a unit as the demand model spreads them, in time order: row `row` (of
    the merged records) sends `size` bytes at `due`. `fits` says whether the (N+1)*W of records
    up to and including it stay within Q * (N-1) * W, had everything gone out when due."""

    due: np.ndarray
    size: np.ndarray
    row: np.ndarray
    fits: np.ndarray


def spread(starts: np.ndarray, interval_ms: np.ndarray, demand: np.ndarray,
           recorded_requests: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's demand in min(requests, 10) requests (at least one, never more than bytes), evenly
    spread over its interval: (due_ms, bytes, row) per request, rows in order."""
    n = np.minimum(np.clip(recorded_requests, 1, MAX_REQUESTS_PER_INTERVAL), demand)
    n = np.where(demand > 0, n, 0).astype(np.int64)
    row = np.repeat(np.arange(len(n)), n)
    first = np.cumsum(n) - n
    k = np.arange(len(row)) - first[row]
    per = np.maximum(n, 1)
    due = starts[row] + (k * interval_ms[row]) // per[row]
    size = (demand // per)[row] + (k < (demand % per)[row])
    return due, size, row


def plan_requests(merged: pd.DataFrame, quotas: np.ndarray, config: MetricConfig) -> Requests:
    """The unit's requests, and for each whether the bound holds at its time (a sliding window
    over everything the unit's records put on the sensor)."""
    interval_ms = merged["interval_s"].to_numpy(np.int64) * 1000
    due, size, row = spread(merged["start_ms"].to_numpy(np.int64), interval_ms,
                            merged["demand"].to_numpy(np.int64), merged["requests"].to_numpy(np.int64))
    order = np.argsort(due, kind="stable")
    due, size, row = due[order], size[order], row[order]
    cum = np.concatenate(([0], np.cumsum(size)))
    oldest = np.searchsorted(due, due - (config.samples + 1) * config.window_ms, side="right")
    held = cum[1:] - cum[oldest]
    limit = quotas[row] * (config.samples - 1) * config.window_s * _SAFETY
    return Requests(due, size, row, np.isnan(limit) | (held <= limit))


@dataclass(slots=True)
class TenantReplay:
    """One tenant's outcome in one replay unit."""

    user: str
    client_id: str
    quota: float | None = None
    demand_bytes: int = 0
    sent_bytes: int = 0
    throttle_ms: int = 0
    throttled_requests: int = 0
    delayed_bytes: int = 0
    backlog_bytes: int = 0
    simulated_intervals: int = 0
    fast_intervals: int = 0


class _Client:
    """The simulated client of one tenant: its waiting requests and when its mute ends."""

    __slots__ = ("result", "queue", "muted_until", "in_heap")

    def __init__(self, result: TenantReplay) -> None:
        self.result = result
        self.queue: deque[list[int]] = deque()
        self.muted_until = 0
        self.in_heap = False


class _Simulation:
    """The event loop of one replay unit: its clients and the engine."""

    def __init__(self, manager: ClientQuotaManager, fetch: bool, config: MetricConfig) -> None:
        self.manager = manager
        self.sensors = manager.sensors
        self.fetch = fetch
        self.config = config
        self.heap: list[tuple[int, int, _Client]] = []
        self.seq = 0
        self.clients: dict[tuple[str, str], _Client] = {}
        self.span_ms = (config.samples + 1) * config.window_ms
        self.last_sent_ms = -(2**62)  # the last send through the event loop

    def client(self, user: str, client_id: str) -> _Client:
        c = self.clients.get((user, client_id))
        if c is None:
            c = self.clients[(user, client_id)] = _Client(TenantReplay(user, client_id))
        return c

    def quiet(self, start_ms: int, clients: list[_Client]) -> bool:
        """Nothing waiting, nobody muted, and the samples hold only what went out when due: then a
        request's precomputed `fits` is what the sensor really holds."""
        return (not self.heap and self.last_sent_ms <= start_ms - self.span_ms
                and all(c.muted_until <= start_ms for c in clients))

    def record_due(self, sends: list[tuple[int, int, _Client]]) -> None:
        """Record requests that cannot be throttled, in time order, with the same changes to the
        sensor as record_and_get_throttle_ms: the record, and the measuring (whose purge changes
        the samples) when a bound applies; only the throttle arithmetic is left out."""
        manager = self.manager
        if not manager.quotas_enabled:
            for _, size, client in sends:
                client.result.sent_bytes += size
            return
        for due, size, client in sends:
            r = client.result
            res = manager.resolver.resolve(r.user, r.client_id)
            rate = self.sensors.get_or_create(res.sensor_key, due, self._new_rate)
            if rate is not None:  # None: the entity cap, and the manager would not record either
                rate.record(size, due)
                if res.quota is not None:
                    rate.measure(due)
            r.sent_bytes += size

    def enqueue(self, client: _Client, sends: list[list[int]]) -> None:
        client.queue.extend(sends)
        if not client.in_heap:
            self._push(client)

    def _new_rate(self) -> Rate:
        return Rate(self.config)

    def _push(self, client: _Client) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (max(client.queue[0][0], client.muted_until), self.seq, client))
        client.in_heap = True

    def run_until(self, end_ms: int) -> None:
        """Send every waiting request whose time comes before `end_ms`, in time order."""
        heap = self.heap
        while heap and heap[0][0] < end_ms:
            now, _, client = heapq.heappop(heap)
            client.in_heap = False
            self._send(client, now)
            if client.queue:
                self._push(client)

    def _send(self, client: _Client, now: int) -> None:
        r = client.result
        head = client.queue[0]
        due, size = head
        if self.fetch:
            cap = self._fetch_cap(r.user, r.client_id)
            if size > cap:
                size = max(1, int(cap))
        self.last_sent_ms = now
        throttle = self.manager.record_and_get_throttle_ms(r.user, r.client_id, size, now)
        if throttle > 0:
            r.throttle_ms += throttle
            r.throttled_requests += 1
            client.muted_until = now + throttle
            if self.fetch:
                # Kafka's throttled fetch: an empty response, the bytes taken back, asked again later.
                self.manager.unrecord(r.user, r.client_id, size, now)
                return
        r.sent_bytes += size
        if now > due:
            r.delayed_bytes += size
        if size < head[1]:
            head[1] -= size
        else:
            client.queue.popleft()

    def _fetch_cap(self, user: str, client_id: str) -> float:
        # The proxy's cap on a Fetch's max_bytes: one sample's worth, Q * W, and never more than
        # Kafka's Q * (N-1) * W (proxy/stages/quota_charge.py, QuotaCharge._fetch_cap).
        window_max = self.manager.max_value_in_quota_window(user, client_id)
        quota = self.manager.quota(user, client_id)
        return window_max if quota is None else min(window_max, quota * self.config.window_s)

    def finish(self, end_ms: int) -> list[TenantReplay]:
        self.run_until(end_ms)
        for client in self.clients.values():
            client.result.backlog_bytes = sum(size for _, size in client.queue)
            client.result.quota = self.manager.quota(client.result.user, client.result.client_id)
        return [c.result for c in self.clients.values()]


def _merge_records(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per tenant and interval start (restarts and retries can write two), time-ordered.
    A quota given as None (JSON's null, read straight from a log) is no quota: NaN."""
    rows = rows.astype({"recorded_quota": float})
    merged = rows.groupby(["start_ms", "user", "client_id"], sort=True, as_index=False).agg(
        interval_s=("interval_s", "max"), bytes=("bytes", "sum"), requests=("requests", "sum"),
        throttle_ms=("throttle_ms", "sum"), recorded_quota=("recorded_quota", "max"))
    merged["demand"] = demand_bytes(merged["bytes"].to_numpy(), merged["throttle_ms"].to_numpy(),
                                    merged["recorded_quota"].to_numpy())
    return merged


def replay_unit(rows: pd.DataFrame, kind: str, quotas: Quotas | None, config: MetricConfig,
                end_ms: int, fast: bool = True) -> pd.DataFrame:
    """Replay one unit's records (INPUT_COLUMNS) of one kind ("produce" or "fetch") under `quotas`
    (None: the quotas the log recorded as in force) until `end_ms`; RESULT_COLUMNS per tenant."""
    key = KINDS[kind]
    merged = _merge_records(rows)
    recorded = quotas is None
    store = QuotaStore() if recorded else QuotaStore(quotas)
    manager = ClientQuotaManager(key, store, config, LocalSensors(config))
    if recorded:
        unit_quotas = merged["recorded_quota"].to_numpy(dtype=float)
    else:
        pairs = list(zip(merged["user"], merged["client_id"], strict=True))
        resolved = {pair: manager.quota(*pair) for pair in set(pairs)}
        unit_quotas = np.array([np.nan if resolved[p] is None else resolved[p] for p in pairs], dtype=float)
    if np.all(np.isnan(unit_quotas)):
        return _unsimulated(merged, unit_quotas)
    requests = plan_requests(merged, unit_quotas, config)
    if fast and requests.fits.all():
        # By induction every interval is quiet and every request fits: nothing is ever throttled.
        return _unsimulated(merged, unit_quotas)
    sim = _Simulation(manager, kind == "fetch", config)
    _simulate(sim, merged, requests, unit_quotas if recorded else None, store, key, fast)
    results = sim.finish(end_ms)
    recorded_throttle = merged.groupby(["user", "client_id"])["throttle_ms"].sum()
    return pd.DataFrame([_row(r, int(recorded_throttle[(r.user, r.client_id)])) for r in results],
                        columns=list(RESULT_COLUMNS))


def _simulate(sim: _Simulation, merged: pd.DataFrame, requests: Requests, recorded_quotas: np.ndarray | None,
              store: QuotaStore, key: QuotaKey, fast: bool) -> None:
    starts = merged["start_ms"].tolist()
    demand = merged["demand"].tolist()
    clients = [sim.client(u, c) for u, c in zip(merged["user"], merged["client_id"], strict=True)]
    # Each row's requests, in time order, and whether all of them fit.
    by_row: list[list[list[int]]] = [[] for _ in starts]
    row_fits = [True] * len(starts)
    for due, size, row, fits in zip(requests.due.tolist(), requests.size.tolist(), requests.row.tolist(),
                                    requests.fits.tolist(), strict=True):
        by_row[row].append([due, size])
        row_fits[row] = row_fits[row] and fits
    everyone = QuotaEntity(user=DEFAULT)  # a recorded quota applies to its own tenant, on its own sensor
    current: float | None = None
    n = len(starts)
    i = 0
    while i < n:
        start = starts[i]
        j = i
        while j < n and starts[j] == start:
            j += 1
        sim.run_until(start)  # what waited went out under the quota of its time
        if recorded_quotas is not None:
            q = recorded_quotas[i]
            wanted = None if q != q else float(q)
            if wanted != current:
                if wanted is None:
                    store.remove(everyone, key)
                else:
                    store.set(everyone, key, wanted)
                current = wanted
        rows = range(i, j)
        for k in rows:
            clients[k].result.demand_bytes += demand[k]
        if fast and all(row_fits[k] for k in rows) and sim.quiet(start, [clients[k] for k in rows]):
            sends = sorted(((due, size, clients[k]) for k in rows for due, size in by_row[k]),
                           key=lambda s: s[0])
            sim.record_due(sends)
            for k in rows:
                clients[k].result.fast_intervals += 1
        else:
            for k in rows:
                clients[k].result.simulated_intervals += 1
                if by_row[k]:
                    sim.enqueue(clients[k], by_row[k])
        i = j


def _row(r: TenantReplay, recorded_throttle_ms: int) -> tuple[object, ...]:
    return (r.user, r.client_id, np.nan if r.quota is None else r.quota, r.demand_bytes, r.sent_bytes,
            r.throttle_ms, r.throttled_requests, r.delayed_bytes, r.backlog_bytes, recorded_throttle_ms,
            r.simulated_intervals, r.fast_intervals, 0)


def _unsimulated(merged: pd.DataFrame, quotas: np.ndarray) -> pd.DataFrame:
    """No quota, or never over it: everything sent on time, nothing throttled."""
    frame = merged.assign(q=quotas)
    out = frame.groupby(["user", "client_id"], sort=True, as_index=False).agg(
        quota=("q", "last"), demand_bytes=("demand", "sum"), recorded_throttle_ms=("throttle_ms", "sum"),
        skipped_intervals=("start_ms", "nunique"))
    out["sent_bytes"] = out["demand_bytes"]
    for column in ("throttle_ms", "throttled_requests", "delayed_bytes", "backlog_bytes",
                   "simulated_intervals", "fast_intervals"):
        out[column] = 0
    return out[list(RESULT_COLUMNS)]
