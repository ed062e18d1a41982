"""The store's client and what a sync says to it, apart from when and why (sync.py): how to
connect to Valkey/Redis, one bucket's `SYNC_BUCKET` call, and how a failure is told in a log
line. The calls are pure (bench.store_sync sends the same bucket calls)."""

from __future__ import annotations

from typing import Any

from kafka_quota_proxy.config.store_settings import StoreSettings
from kafka_quota_proxy.proxy.store import scripts
from kafka_quota_proxy.quota.rate import MetricConfig
from kafka_quota_proxy.quota.shared import SyncBatch, bucket_of

# One `TAKE_TURNS` call: its keys, its arguments, the keys it claims in the order it answers.
TurnCall = tuple[list[str], list[Any], list[str]]


def turn_calls(prefix: str, replica: str, buckets: int, stale_ms: float, left: list[str],
               waiting: list[str]) -> list[TurnCall]:
    """One `TAKE_TURNS` call per bucket with claims to give up (`left`) or make (`waiting`): its
    keys, its arguments, and the keys claimed, in the order the answer gives them."""
    if not left and not waiting:
        return []
    modes: dict[str, int] = {key: 0 for key in left}
    for key in waiting:
        modes[key] = 1 if key in modes else 2
    by_bucket: dict[int, list[str]] = {}
    for key in modes:
        by_bucket.setdefault(bucket_of(key, buckets), []).append(key)
    calls = []
    for bucket, keys in sorted(by_bucket.items()):
        args: list[Any] = [replica, int(stale_ms), int(10 * stale_ms), *(modes[k] for k in keys)]
        calls.append((scripts.turn_keys(prefix, bucket, keys), args, [k for k in keys if modes[k]]))
    return calls


def turns_answered(calls: list[TurnCall], outs: list[Any]) -> tuple[set[str], set[str]]:
    """What the `TAKE_TURNS` calls answered: the keys whose queue this replica heads, and those
    where another replica waits too. An answer that is an error is raised."""
    heads: set[str] = set()
    crowded: set[str] = set()
    for (_, _, claimed), out in zip(calls, outs, strict=True):
        if isinstance(out, Exception):
            raise out
        for i, key in enumerate(claimed):
            if int(out[2 * i]):
                heads.add(key)
            if int(out[2 * i + 1]):
                crowded.add(key)
    return heads, crowded


def no_script_error() -> type[Exception]:
    from redis.exceptions import NoScriptError

    return NoScriptError


def connect(settings: StoreSettings) -> Any:
    """A redis-py asyncio client (standalone or Cluster) for `settings.url`."""
    import redis.asyncio as redis
    from redis.asyncio.cluster import RedisCluster

    url = settings.url
    for ours, theirs in (("valkeys://", "rediss://"), ("valkey://", "redis://")):
        if url.startswith(ours):
            url = theirs + url[len(ours):]
    timeout = settings.timeout_ms / 1000
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    # No retries inside the client: a failed sync is retried by the next one, which writes the
    # same absolute counts, and a client retrying with backoff would outlast the sync interval.
    # No socket_timeout either (redis-py's default is 5 s): every call runs inside the sync's own
    # asyncio.timeout, and with one redis-py sends through asyncio.wait_for, which on Python 3.11
    # drops a cancel that lands as the send completes (gh-86296). The sync task then outlived its
    # cancel at shutdown and the worker never stopped (CI; a dump showed it cancelled, syncing).
    kwargs: dict[str, Any] = {"socket_timeout": None, "socket_connect_timeout": timeout,
                              "decode_responses": False, "retry": Retry(NoBackoff(), 0)}
    password = settings.password()
    if password is not None:
        kwargs["password"] = password
    if url.startswith("rediss://") and settings.tls_ca_file:
        kwargs["ssl_ca_certs"] = settings.tls_ca_file
    if settings.cluster:
        return RedisCluster.from_url(url, **kwargs)
    return redis.Redis.from_url(url, **kwargs)


def bucket_call(prefix: str, replica: str, wrote_before: bool, config: MetricConfig, kind: str,
                batch: SyncBatch) -> tuple[list[str], list[Any], list[tuple[str, list[int]]]]:
    """One bucket's `SYNC_BUCKET` call: its keys, its arguments, and the (key, samples) it reads
    in the order the answer gives them. Pure (bench.store_sync sends these same calls)."""
    samples = sorted({s for w in batch.writes.values() for s in w}
                     | {s for r in batch.reads.values() for s in r})
    pos = {s: i + 1 for i, s in enumerate(samples)}
    ttl = (config.samples + 2) * config.window_ms
    args: list[Any] = [replica, ttl, len(samples), 1 if wrote_before else 0]
    writes = [(pos[s], key, v) for key, w in batch.writes.items() for s, v in w.items()]
    args.append(len(writes))
    for p, key, v in writes:
        args += [p, key, v]
    reads = list(batch.reads.items())
    args.append(len(reads))
    for key, wanted in reads:
        args += [key, len(wanted), *(pos[s] for s in wanted)]
    keys = scripts.bucket_keys(prefix, batch.bucket, samples, kind)
    return keys, args, reads


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]
