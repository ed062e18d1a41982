"""Synthetic usage logs, in the proxy's record format and file layout, with known outliers.

Deterministic for a seed; each hour has its own random stream, so hours are written in parallel.
The population it models and the outliers it injects: docs/analytics.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from kafka_quota_proxy.analytics.measures import MEASURES
from kafka_quota_proxy.analytics.readable import round_up_bytes
from kafka_quota_proxy.quota import usage
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import BUILT_IN_KEYS
from kafka_quota_proxy.quota.resolution import QuotaResolver, QuotaStore

DEFAULT_START = "2026-01-05"  # a Monday
MANIFEST = "generator-manifest.json"
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
MEDIAN_PRODUCE_BPS = 200 * 1024
MEDIAN_FETCH_BPS = 400 * 1024
FETCH_POLLS_PER_S = 2
PRODUCER_IDS_QUOTA = 0.1
ANONYMOUS_SHARE = 0.3
SECOND_CLIENT_SHARE = 0.2
MUTATION_CHANCE = 0.02
OUTLIER_IDS_PER_HOUR = 20
TOPICS = 8  # tenants write and read topics events-00 .. events-07
RECORD_SHARE = 0.97  # of a Produce request's or Fetch response's bytes, its record sets'


class GenerateError(ValueError):
    """Bad generator parameters, said in one line."""


@dataclass(frozen=True, slots=True)
class TenantProfile:
    """One tenant's behaviour: base rates (B/s), daily shape, and what makes it an outlier."""

    user: str
    client_id: str
    produce_bps: float
    fetch_bps: float
    batch_bytes: float
    ms_per_request: float
    amplitude: float
    phase_h: float
    producers: int
    deploy_hour: int
    quotas: dict[str, float | None]
    outlier: dict[str, float] = field(default_factory=dict)  # measure -> factor
    write_topic: str = ""  # the topic its Produce bytes go to
    read_topic: str = ""  # the topic its Fetch bytes come from


@dataclass(frozen=True, slots=True)
class Plan:
    """What to generate: the time span, interval, seed, instance and tenant profiles."""

    start_ms: int
    hours: int
    interval_s: int
    seed: int
    instance: str
    tenants: tuple[TenantProfile, ...]
    quotas: tuple[tuple[QuotaEntity, dict[QuotaKey, float]], ...]

    @property
    def records(self) -> int:
        return self.hours * (3600 // self.interval_s) * len(self.tenants)


def parse_start(text: str) -> int:
    try:
        day = dt.date.fromisoformat(text)
    except ValueError:
        raise GenerateError(f"--start: expected YYYY-MM-DD, got {text!r}") from None
    return int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp() * 1000)


def make_plan(tenants: int = 100, days: int = 7, interval_s: int = 10, start: str = DEFAULT_START,
              outliers: int = 3, seed: int = 1, instance: str = "proxy-a") -> Plan:
    """The tenants and their profiles; checks the parameters."""
    if tenants < 1:
        raise GenerateError(f"--tenants: expected at least 1, got {tenants}")
    if days < 1:
        raise GenerateError(f"--days: expected at least 1, got {days}")
    if interval_s < 1 or 3600 % interval_s:
        raise GenerateError(f"--interval-seconds: must divide an hour (1, 2, 5, 10, 15, 30, 60, ...), "
                            f"got {interval_s}")
    if not 0 <= outliers <= tenants:
        raise GenerateError(f"--outliers: expected 0 to {tenants}, got {outliers}")
    if not instance or "/" in instance:
        raise GenerateError(f"--instance: expected a name without '/', got {instance!r}")
    rng = np.random.default_rng(seed)
    names = _names(rng, tenants)
    quotas = _quotas(names)
    profiles = [_profile(rng, user, client, consumer_only, quotas)
                for user, client, consumer_only in names]
    profiles = _inject_outliers(rng, profiles, outliers, [c for _, _, c in names])
    # By position, not drawn: the random stream (and so every tenant's profile) is as it was.
    profiles = [dataclasses.replace(p, write_topic=f"events-{i % TOPICS:02d}",
                                    read_topic=f"events-{(3 * i + 1) % TOPICS:02d}")
                for i, p in enumerate(profiles)]
    return Plan(parse_start(start), days * 24, interval_s, seed, instance, tuple(profiles),
                tuple(quotas.items()))


def _names(rng: np.random.Generator, n: int) -> list[tuple[str, str, bool]]:
    """(user, client_id, consume-only) per tenant."""
    names: list[tuple[str, str, bool]] = []
    for i in range(n):
        previous = names[-1] if names else None
        if previous and previous[0] != "ANONYMOUS" and not previous[2] and rng.random() < SECOND_CLIENT_SHARE:
            names.append((previous[0], f"{previous[0]}-consumer", True))
        elif rng.random() < ANONYMOUS_SHARE:
            names.append(("ANONYMOUS", f"anon-{i:03d}", False))
        else:
            names.append((f"svc-{i:03d}", f"svc-{i:03d}-app", False))
    return names


def _quotas(names: list[tuple[str, str, bool]]) -> dict[QuotaEntity, dict[QuotaKey, float]]:
    return {
        QuotaEntity(user=DEFAULT, client_id=DEFAULT): {
            QuotaKey.PRODUCER_BYTE_RATE: float(round_up_bytes(10 * MEDIAN_PRODUCE_BPS)),
            QuotaKey.CONSUMER_BYTE_RATE: float(round_up_bytes(10 * MEDIAN_FETCH_BPS))},
        QuotaEntity(user=DEFAULT): {QuotaKey.PRODUCER_IDS_RATE: PRODUCER_IDS_QUOTA},
    }


def _profile(rng: np.random.Generator, user: str, client: str, consumer_only: bool,
             quotas: dict[QuotaEntity, dict[QuotaKey, float]]) -> TenantProfile:
    store = QuotaStore(quotas)
    in_force = {k.value: QuotaResolver(store, k).resolve(user, client).quota for k in usage.quota_keys()}
    return TenantProfile(
        user=user, client_id=client,
        produce_bps=0.0 if consumer_only else MEDIAN_PRODUCE_BPS * rng.uniform(0.6, 1.4),
        fetch_bps=MEDIAN_FETCH_BPS * rng.uniform(0.6, 1.4),
        batch_bytes=64 * 1024 * rng.uniform(0.8, 1.25),
        ms_per_request=rng.uniform(0.3, 0.5),
        amplitude=rng.uniform(0.2, 0.6),
        phase_h=rng.uniform(0, 24),
        producers=0 if consumer_only else int(rng.integers(1, 5)),
        deploy_hour=int(rng.integers(0, 24)),
        quotas=in_force)


def _inject_outliers(rng: np.random.Generator, profiles: list[TenantProfile], k: int,
                     consumer_only: list[bool]) -> list[TenantProfile]:
    # Outliers are producing tenants, so every measure is open to them; measures go round so that
    # no measure gets more than its share.
    candidates = [i for i, c in enumerate(consumer_only) if not c]
    if k > len(candidates):
        raise GenerateError(f"--outliers: only {len(candidates)} tenants produce, asked for {k}")
    chosen = sorted(rng.choice(candidates, size=k, replace=False).tolist()) if k else []
    # the built-in kinds' measures, whose demand the profiles model (registered kinds have none)
    order = [m.name for m in MEASURES if m.key in BUILT_IN_KEYS]
    turn = int(rng.integers(0, len(order)))
    out = list(profiles)
    for i in chosen:
        allowed = [m for m in order if m != "producer_ids" or profiles[i].user != "ANONYMOUS"]
        count = 1 + int(rng.random() < 0.5)
        measures: dict[str, float] = {}
        while len(measures) < count:
            m = order[turn % len(order)]
            turn += 1
            if m in allowed:
                measures[m] = float(rng.uniform(6, 10))
        out[i] = _with_outlier(profiles[i], measures)
    return out


def _with_outlier(p: TenantProfile, measures: dict[str, float]) -> TenantProfile:
    changes: dict[str, Any] = {"outlier": measures}
    if "produce" in measures:
        changes["produce_bps"] = MEDIAN_PRODUCE_BPS * measures["produce"]
    if "fetch" in measures:
        changes["fetch_bps"] = MEDIAN_FETCH_BPS * measures["fetch"]
    if "request" in measures:
        changes["ms_per_request"] = 0.4 * measures["request"]
    return dataclasses.replace(p, **changes)


# ---- one hour of records ----------------------------------------------------------------------


_FIELDS = ("start_ms", "produce_bytes", "fetch_bytes", "request_time_ms", "new_producer_ids",
           "partitions_mutated", "connections", "r_produce", "r_fetch", "r_metadata", "r_group", "r_admin",
           "t_produce", "t_fetch", "n_produce", "n_fetch", "topic_produce", "topic_fetch")
_MARK = 987_650_000


def _template(plan: Plan, p: TenantProfile) -> tuple[str, list[int]]:
    """The JSON line of quota.usage.record with printf slots where the values go, and the order
    (indexes into _FIELDS) in which the slots appear."""
    marks = {name: _MARK + i for i, name in enumerate(_FIELDS)}
    # a registered kind's counter is 0: the profiles model the built-in kinds' demand
    counters: dict[str, float] = {c: marks.get(c, 0) for c in usage.counter_names()}
    counters["request_time_ms"] = marks["request_time_ms"] + 0.5
    rec = usage.record(marks["start_ms"], plan.interval_s, plan.instance, p.user, p.client_id, counters,
                       {g: marks[f"r_{g}"] for g in ("produce", "fetch", "metadata", "group", "admin")},
                       {"produce": marks["t_produce"], "fetch": marks["t_fetch"]},
                       {"produce": marks["n_produce"], "fetch": marks["n_fetch"]}, p.quotas,
                       _topics(p, marks["topic_produce"], marks["topic_fetch"]))
    text = json.dumps(rec, separators=(",", ":")).replace("%", "%%")
    spelled = {name: str(marks[name]) for name in _FIELDS}
    spelled["request_time_ms"] = str(marks["request_time_ms"] + 0.5)
    order = sorted(range(len(_FIELDS)), key=lambda i: text.index(spelled[_FIELDS[i]]))
    for name, mark in spelled.items():
        text = text.replace(mark, "%.3f" if name == "request_time_ms" else "%d")
    return text, order


def _topics(p: TenantProfile, produced: int, fetched: int) -> dict[str, list[int]]:
    """The record's bytes per topic: its Produce's to its write topic, its Fetch's from its read
    topic (one entry if they are the same topic)."""
    topics = {p.write_topic: [produced, 0, 0, 0]}
    read = topics.setdefault(p.read_topic, [0, 0, 0, 0])
    read[1] = fetched
    return topics


def _values(plan: Plan, p: TenantProfile, times: np.ndarray, rng: np.random.Generator,
            first_hour: bool) -> list[np.ndarray]:
    """The record values of one tenant over one hour's intervals, in _FIELDS order."""
    interval = plan.interval_s
    k = len(times)
    hour_of_day = (times % DAY_MS) / HOUR_MS
    weekend = ((times // DAY_MS + 3) % 7) >= 5  # 1970-01-01 was a Thursday
    level = (1 + p.amplitude * np.sin(2 * np.pi * (hour_of_day - p.phase_h) / 24)) * np.where(weekend, 0.5, 1)
    noise = rng.lognormal(0.0, 0.15, size=(3, k))
    produce, t_produce = _held_to_quota(p.produce_bps * level * noise[0] * interval,
                                        p.quotas["producer_byte_rate"], interval)
    fetch, t_fetch = _held_to_quota(p.fetch_bps * level * noise[1] * interval,
                                    p.quotas["consumer_byte_rate"], interval)
    r_produce = np.where(produce > 0, np.ceil(produce / p.batch_bytes), 0)
    r_fetch = rng.poisson(FETCH_POLLS_PER_S * interval, k)
    # A request outlier busy-polls Metadata: several calls a second instead of one in 30 s.
    r_metadata = rng.poisson(interval * p.outlier["request"] if "request" in p.outlier else interval / 30, k)
    r_group = np.full(k, interval // 3)
    mutated = _mutations(p, rng, k)
    r_admin = (mutated > 0).astype(np.int64)
    requests = r_produce + r_fetch + r_metadata + r_group + r_admin
    request_time = requests * p.ms_per_request * noise[2]
    deploy = (hour_of_day.astype(np.int64) == p.deploy_hour) & (times % HOUR_MS == 0)
    ids = np.where(deploy, p.producers, 0)
    if "producer_ids" in p.outlier:
        ids = ids + rng.poisson(OUTLIER_IDS_PER_HOUR * p.outlier["producer_ids"] * interval / 3600, k)
    connections = np.where(deploy, p.producers, 0)
    if first_hour:
        connections[0] += p.producers + 1
    return [times, produce, fetch, request_time, ids, mutated, connections, r_produce, r_fetch, r_metadata,
            r_group, r_admin, t_produce, t_fetch, _throttled(r_produce, t_produce, interval),
            _throttled(r_fetch, t_fetch, interval), np.floor(produce * RECORD_SHARE),
            np.floor(fetch * RECORD_SHARE)]


def _held_to_quota(demand: np.ndarray, quota: float | None, interval: int) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, throttle_ms) as the proxy would record a demand: over quota, the client gets the
    quota's worth through and is throttled for the excess, at most the whole interval."""
    demand = np.rint(demand)
    if quota is None:
        return demand, np.zeros_like(demand)
    allowed = quota * interval
    over = demand > allowed
    throttle = np.where(over, np.minimum(np.rint((demand - allowed) / quota * 1000), interval * 1000), 0)
    return np.where(over, np.floor(allowed), demand), throttle


def _throttled(requests: np.ndarray, throttle_ms: np.ndarray, interval: int) -> np.ndarray:
    share = throttle_ms / (interval * 1000)
    return np.where(throttle_ms > 0, np.maximum(1, np.rint(requests * share)), 0)


def _mutations(p: TenantProfile, rng: np.random.Generator, k: int) -> np.ndarray:
    if "mutations" in p.outlier:
        per_interval = rng.integers(1, 2 * round(p.outlier["mutations"]) + 1, k)
        return np.where(rng.random(k) < 0.5, per_interval, 0)
    return (rng.random(k) < MUTATION_CHANCE).astype(np.int64)


def hour_lines(plan: Plan, hour: int) -> list[str]:
    """The JSON lines of hour `hour` (0-based from the start), interval by interval."""
    rng = np.random.default_rng([plan.seed, hour])
    start = plan.start_ms + hour * HOUR_MS
    times = start + np.arange(3600 // plan.interval_s, dtype=np.int64) * plan.interval_s * 1000
    timed = _FIELDS.index("request_time_ms")
    per_tenant = []
    for p in plan.tenants:
        columns = _values(plan, p, times, rng, hour == 0)
        template, order = _template(plan, p)
        ordered = [columns[i].tolist() if i == timed else columns[i].astype(np.int64).tolist() for i in order]
        per_tenant.append((template, list(zip(*ordered, strict=True))))
    return [template % rows[i] for i in range(len(times)) for template, rows in per_tenant]


def hour_path(out: Path, plan: Plan, hour: int, closed: bool) -> Path:
    start = dt.datetime.fromtimestamp((plan.start_ms + hour * HOUR_MS) / 1000, tz=dt.UTC)
    name = f"usage-{plan.instance}.jsonl" + (".gz" if closed else "")
    return out / f"dt={start:%Y-%m-%d}" / f"hour={start:%H}" / name


def write_hour(plan: Plan, out: Path, hour: int) -> int:
    """Write one hour's file (gzipped unless it is the last hour); returns the record count."""
    lines = hour_lines(plan, hour)
    closed = hour < plan.hours - 1
    path = hour_path(out, plan, hour, closed)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = ("\n".join(lines) + "\n").encode()
    tmp = path.with_name(path.name + ".tmp")
    if closed:
        with gzip.open(tmp, "wb", compresslevel=1) as f:
            f.write(data)
    else:
        tmp.write_bytes(data)
    tmp.replace(path)
    return len(lines)


def manifest(plan: Plan, records: int, seconds: float) -> dict[str, Any]:
    return {
        "seed": plan.seed,
        "tenants": len(plan.tenants),
        "hours": plan.hours,
        "interval_s": plan.interval_s,
        "start_ms": plan.start_ms,
        "instance": plan.instance,
        "records": records,
        "seconds": round(seconds, 3),
        "quotas": [{**dict(e.items()), **{k.value: v for k, v in values.items()}}
                   for e, values in plan.quotas],
        "outliers": [{"user": p.user, "client_id": p.client_id, "measures": p.outlier}
                     for p in plan.tenants if p.outlier],
    }


def generate(out: str | Path, plan: Plan, workers: int | None = None) -> dict[str, Any]:
    """Write the plan's log under `out` and its manifest; returns the manifest."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    if workers is None:
        workers = min(os.cpu_count() or 1, plan.hours) if plan.records > 500_000 else 1
    if workers <= 1:
        records = sum(write_hour(plan, out, h) for h in range(plan.hours))
    else:
        # spawn, not fork: the caller may hold a JVM gateway and its threads.
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            records = sum(pool.map(write_hour, [plan] * plan.hours, [out] * plan.hours, range(plan.hours)))
    result = manifest(plan, records, time.perf_counter() - began)
    (out / MANIFEST).write_text(json.dumps(result, indent=2) + "\n")
    return result


def records_per_second(result: dict[str, Any]) -> float:
    return result["records"] / result["seconds"] if result["seconds"] else math.inf
