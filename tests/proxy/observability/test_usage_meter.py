"""The usage log's meter and writer, on a fake wall clock and a temporary directory."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from kafka_quota_proxy.config import ConfigError
from kafka_quota_proxy.config.usage_settings import UsageLogSettings, parse_usage_log
from kafka_quota_proxy.protocol.api_keys import LIST_GROUPS, METADATA, SHARE_FETCH
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.observability.usage_log import Interval, UsageMeter, UsageWriter
from kafka_quota_proxy.quota import usage
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import TIME_MS, QuotaKind, registered
from kafka_quota_proxy.quota.resolution import QuotaStore
from tests.proxy.conftest import request_frame
from tests.support.kinds import LIST_GROUPS_RATE

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
HOUR = 3_600_000


def settings(tmp_path: Path, **kw: Any) -> UsageLogSettings:
    return UsageLogSettings(dir=str(tmp_path), **kw)


def ctx(api_key: int, body: bytes = b"", principal: str = "alice", client_id: str = "app",
        conn: ConnectionInfo | None = None) -> RequestContext:
    version = 3 if api_key == 0 else 1 if api_key == SHARE_FETCH else 0  # ShareFetch is flexible from v1
    frame = memoryview(request_frame(api_key, version, 1, body, client_id=client_id.encode(),
                                     flexible=api_key == SHARE_FETCH))
    info = conn or ConnectionInfo("127.0.0.1:5000", "bootstrap")
    info.principal = principal
    return RequestContext(parse_request_header(frame), frame, info)


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def meter(tmp_path: Path, clock: Clock, store: QuotaStore | None = None, **kw: Any) -> UsageMeter:
    s = settings(tmp_path, **kw)
    return UsageMeter(s, store or QuotaStore(), UsageWriter(s, "p1"), permits=lambda c: 3, wall_ms=clock)


def read_lines(path: Path) -> list[dict[str, Any]]:
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# --- the meter ----------------------------------------------------------------------------------

def test_intervals_are_wall_clock_aligned(tmp_path: Path) -> None:
    clock = Clock(T0 + 12_345)
    m = meter(tmp_path, clock)
    assert m.start_ms == T0 + 10_000
    assert m.seconds_to_boundary() == pytest.approx(7.655)
    m.request(ctx(3))
    clock.now = T0 + 20_001
    m.rotate()
    (interval,) = list(m.writer.queue.queue)
    assert interval.start_ms == T0 + 10_000 and m.start_ms == T0 + 20_000
    m.rotate()  # nothing counted: nothing queued
    assert m.writer.queue.qsize() == 1
    assert m.start_ms == T0 + 30_000  # an early rotation (shutdown) never reuses a start


def test_what_a_request_and_its_response_count(tmp_path: Path) -> None:
    clock = Clock(T0)
    m = meter(tmp_path, clock)
    conn = ConnectionInfo("127.0.0.1:5000", "bootstrap")
    produce = ctx(0, b"\x00\x01" + b"\x00" * 40, conn=conn)
    produce.charge().new_producer_ids = 2
    m.request(produce)
    m.request(ctx(3, conn=conn))  # Metadata, same connection: counted once
    fetch = ctx(1, conn=conn)
    fetch.times.answered = fetch.times.sent = 1.0
    m.request(fetch)
    m.response(fetch, 5000)
    m.request(ctx(19, conn=conn))  # CreateTopics: the permits function's 3 partitions
    m.throttled("alice", "app", "produce", 250)
    m.throttled("alice", "app", "produce", 50)
    m.throttled("alice", "app", "producer_ids", 9)
    t = m.tenants["alice"]["app"]
    counted = dict(zip(m.counters, t.counters, strict=True))
    assert m.counters == ("produce_bytes", "fetch_bytes", "request_time_ms", "partitions_mutated",
                          "new_producer_ids", "connections")  # the registry's order (quota/usage.py)
    assert {name: value for name, value in counted.items() if name != "request_time_ms"} == {
        "produce_bytes": len(produce.frame) - 4, "fetch_bytes": 4996,  # both without their size prefix
        "partitions_mutated": 3, "new_producer_ids": 2, "connections": 1}
    assert dict(zip(usage.GROUPS, t.requests, strict=True)) == {
        "produce": 1, "fetch": 1, "metadata": 1, "group": 0, "transaction": 0, "admin": 1, "other": 0}
    assert t.throttle_ms == [300, 0, 0, 0, 9] and t.throttled == [2, 0, 0, 0, 1]
    assert isinstance(counted["request_time_ms"], float) and counted["request_time_ms"] > 0


def test_each_kind_is_metered_by_the_fact_it_declares(tmp_path: Path) -> None:
    """The meter reads what each kind declares (QuotaKind.metered), a registered kind's as a
    built-in one's: the toy kind's ListGroups requests, one each, and a kind that adds up its
    Metadata requests' time, beside request time's every request; a ShareFetch's response is
    fetched bytes, as a Fetch's."""
    metadata_time = QuotaKind(QuotaKey("metadata_time_percentage"), "metadata_time", extension=True,
                              usage_counter="metadata_time_ms", usage_fact=TIME_MS,
                              usage_apis=frozenset({METADATA}))
    with registered(LIST_GROUPS_RATE), registered(metadata_time):
        m = meter(tmp_path, Clock(T0))
        conn = ConnectionInfo("127.0.0.1:5000", "bootstrap")
        for _ in range(2):
            m.request(ctx(LIST_GROUPS, conn=conn))
        metadata, share_fetch = ctx(METADATA, conn=conn), ctx(SHARE_FETCH, conn=conn)
        for answered in (metadata, share_fetch):
            m.request(answered)
            m.response(answered, 100)
        counted = dict(zip(m.counters, m.tenants["alice"]["app"].counters, strict=True))
    assert m.counters == ("produce_bytes", "fetch_bytes", "request_time_ms", "partitions_mutated",
                          "new_producer_ids", "list_groups_requests", "metadata_time_ms", "connections")
    assert {name: counted[name] for name in ("produce_bytes", "fetch_bytes", "partitions_mutated",
                                             "new_producer_ids", "list_groups_requests", "connections")} == {
        "produce_bytes": 0, "fetch_bytes": 96, "partitions_mutated": 0, "new_producer_ids": 0,
        "list_groups_requests": 2, "connections": 1}
    # a time is a float from the start; the metadata kind's is the Metadata response's alone
    assert isinstance(counted["metadata_time_ms"], float) and isinstance(counted["request_time_ms"], float)
    assert 0 < counted["metadata_time_ms"] < counted["request_time_ms"]


def test_bytes_per_topic_are_counted_only_with_usage_log_topics(tmp_path: Path) -> None:
    """What the topic stages leave in ctx.topic_bytes, (topic, bytes on, bytes refused): Produce
    in its request, Fetch in its response; nothing while usage_log.topics is off."""
    for topics in (True, False):
        m = meter(tmp_path, Clock(T0), topics=topics)
        produce = ctx(0, b"\x00" * 20)
        produce.topic_bytes = [("orders", 1000, 0), ("hot", 0, 800)]
        m.request(produce)
        again = ctx(0, b"\x00" * 20)
        again.topic_bytes = [("hot", 800, 0)]
        m.request(again)
        fetch = ctx(1)
        fetch.times.answered = fetch.times.sent = 1.0
        fetch.topic_bytes = [("orders", 3000, 0), ("hot", 0, 5000)]
        m.request(fetch)
        before = {"orders": [1000, 0, 0, 0], "hot": [800, 0, 800, 0]} if topics else None
        assert m.tenants["alice"]["app"].topics == before  # a Fetch's bytes count with its response
        m.response(fetch, 9000)
        t = m.tenants["alice"]["app"]
        if topics:
            assert t.topics == {"orders": [1000, 3000, 0, 0], "hot": [800, 0, 800, 5000]}
            assert m.topic_count == 2
        else:
            assert t.topics is None and m.topic_count == 0


def test_topics_beyond_the_cap_are_counted_as_unmetered(tmp_path: Path) -> None:
    """The (tenant, topic) pairs of an interval are capped at max_tenants, like the tenants."""
    clock = Clock(T0)
    m = meter(tmp_path, clock, topics=True, max_tenants=3)
    for client in ("a", "b"):
        c = ctx(0, b"\x00" * 20, client_id=client)
        c.topic_bytes = [("t1", 10, 0), ("t2", 20, 0)]
        m.request(c)
    assert m.tenants["alice"]["a"].topics == {"t1": [10, 0, 0, 0], "t2": [20, 0, 0, 0]}
    assert m.tenants["alice"]["b"].topics == {"t1": [10, 0, 0, 0]}
    assert m.topics_unmetered == 1
    clock.now += 10_000
    m.rotate()  # a new interval, a new count
    c = ctx(0, b"\x00" * 20, client_id="b")
    c.topic_bytes = [("t2", 5, 0)]
    m.request(c)
    assert m.tenants["alice"]["b"].topics == {"t2": [5, 0, 0, 0]} and m.topics_unmetered == 1


def test_a_record_carries_its_bytes_per_topic(tmp_path: Path) -> None:
    clock = Clock(T0)
    m = meter(tmp_path, clock, topics=True)
    m.writer.start()
    c = ctx(0, b"\x00" * 20)
    c.topic_bytes = [("orders", 1000, 24)]
    m.request(c)
    clock.now += 10_000
    m.rotate()
    m.writer.close()
    (line,) = read_lines(tmp_path / "dt=2026-01-01" / "hour=00" / "usage-p1.jsonl")
    assert line["v"] == 2 and line["topics"] == {"orders": {
        "produce_bytes": 1000, "fetch_bytes": 0, "produce_refused_bytes": 24, "fetch_refused_bytes": 0}}


def test_tenants_beyond_the_cap_are_not_metered(tmp_path: Path) -> None:
    m = meter(tmp_path, Clock(T0), max_tenants=2)
    for client in ("a", "b", "c", "c", "a"):
        m.request(ctx(3, client_id=client))
    assert sorted(m.tenants["alice"]) == ["a", "b"]
    assert m.unmetered == 2
    assert m.tenants["alice"]["a"].requests[usage.GROUPS.index("metadata")] == 2


def test_a_full_queue_drops_whole_intervals_and_counts_their_records(tmp_path: Path) -> None:
    clock = Clock(T0)
    m = meter(tmp_path, clock, queue_intervals=1)
    for _ in range(2):
        m.request(ctx(3, client_id="a"))
        m.request(ctx(3, client_id="b"))
        clock.now += 10_000
        m.rotate()
    assert m.writer.queue.qsize() == 1 and m.dropped == 2


# --- the writer -----------------------------------------------------------------------------------

def test_records_files_and_gzip_when_the_hour_closes(tmp_path: Path) -> None:
    store = QuotaStore({QuotaEntity(client_id="app"): {QuotaKey.PRODUCER_BYTE_RATE: 1024.0},
                        QuotaEntity(user=DEFAULT): {QuotaKey.PRODUCER_IDS_RATE: 0.5}})
    clock = Clock(T0 + HOUR - 10_000)  # 00:59:50
    m = meter(tmp_path, clock, store)
    m.writer.start()
    m.request(ctx(0, b"\x00" * 20))
    m.throttled("alice", "app", "produce", 7)
    clock.now = T0 + HOUR
    m.rotate()
    m.request(ctx(3, principal="bob", client_id=""))
    clock.now = T0 + HOUR + 10_000
    m.rotate()
    m.writer.close()
    closed = tmp_path / "dt=2026-01-01" / "hour=00" / "usage-p1.jsonl.gz"
    current = tmp_path / "dt=2026-01-01" / "hour=01" / "usage-p1.jsonl"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.jsonl*")) == [
        "dt=2026-01-01/hour=00/usage-p1.jsonl.gz", "dt=2026-01-01/hour=01/usage-p1.jsonl"]
    (first,) = read_lines(closed)
    zero = {t: 0 for t in usage.throttle_types()}
    assert first == {
        "v": 2, "start_ms": T0 + HOUR - 10_000, "interval_s": 10, "instance": "p1", "user": "alice",
        "client_id": "app", "produce_bytes": first["produce_bytes"], "fetch_bytes": 0,
        "request_time_ms": 0, "new_producer_ids": 0, "partitions_mutated": 0, "connections": 1,
        "requests": {"produce": 1, "fetch": 0, "metadata": 0, "group": 0, "transaction": 0, "admin": 0,
                     "other": 0},
        "throttle_ms": {**zero, "produce": 7}, "throttled": {**zero, "produce": 1},
        "quotas": {"producer_byte_rate": 1024.0, "consumer_byte_rate": None, "request_percentage": None,
                   "controller_mutation_rate": None, "producer_ids_rate": 0.5},
        "topics": {}}
    assert first["produce_bytes"] == len(ctx(0, b"\x00" * 20).frame) - 4
    (second,) = read_lines(current)
    assert (second["user"], second["client_id"], second["start_ms"]) == ("bob", "", T0 + HOUR)
    assert second["quotas"]["producer_byte_rate"] is None  # client-id "" has no quota
    assert m.writer.written == 2 and m.writer.errors == 0


def test_a_restart_gzips_the_hour_a_previous_run_left_open(tmp_path: Path) -> None:
    s = settings(tmp_path)
    w = UsageWriter(s, "p1")
    w.start()
    w.submit(Interval(T0, {"u": {"c": _usage()}}, QuotaStore(), *LAYOUT))
    w.close()
    plain = tmp_path / "dt=2026-01-01" / "hour=00" / "usage-p1.jsonl"
    assert plain.exists()
    other = tmp_path / "dt=2026-01-01" / "hour=00" / "usage-p2.jsonl"
    other.write_text("{}\n")  # another instance's file is left alone
    again = UsageWriter(s, "p1")
    again.start()
    again.close()
    assert not plain.exists() and other.exists()
    assert [r["user"] for r in read_lines(plain.with_name(plain.name + ".gz"))] == ["u"]


def test_a_write_error_is_counted_and_the_writer_goes_on(tmp_path: Path) -> None:
    blocked = tmp_path / "dt=2026-01-01"
    blocked.write_text("a file where a directory should be")
    w = UsageWriter(settings(tmp_path), "p1")
    w.start()
    w.submit(Interval(T0, {"u": {"c": _usage()}}, QuotaStore(), *LAYOUT))
    # the next day
    w.submit(Interval(T0 + 86_400_000, {"u": {"c": _usage()}}, QuotaStore(), *LAYOUT))
    w.close()
    assert w.errors == 1 and w.written == 1
    assert [r["start_ms"] for r in read_lines(tmp_path / "dt=2026-01-02/hour=00/usage-p1.jsonl")] == [
        T0 + 86_400_000]


LAYOUT = (usage.throttle_types(), usage.counter_names())


def _usage() -> Any:
    from kafka_quota_proxy.proxy.observability.usage_log import TenantUsage
    t = TenantUsage(len(usage.throttle_types()), [0] * len(usage.counter_names()))
    t.counters[0] = 10  # produce_bytes
    return t


# --- settings ------------------------------------------------------------------------------------

def test_usage_log_settings() -> None:
    assert parse_usage_log(None) is None
    assert parse_usage_log({"dir": "/x"}) == UsageLogSettings(dir="/x", interval_seconds=10, instance=None,
                                                              max_tenants=100_000, queue_intervals=360,
                                                              topics=False)
    assert parse_usage_log({"dir": "/x", "topics": True}).topics is True  # type: ignore[union-attr]


@pytest.mark.parametrize(("raw", "message"), [
    ({}, "usage_log.dir: required"),
    ({"dir": ""}, "usage_log.dir: expected a directory path"),
    ({"dir": "/x", "interval_seconds": 7}, "usage_log.interval_seconds: must divide an hour evenly"),
    ({"dir": "/x", "interval_seconds": 0}, "usage_log.interval_seconds: expected a whole number >= 1"),
    ({"dir": "/x", "instance": "a/b"}, "usage_log.instance: expected 1-100 letters"),
    ({"dir": "/x", "rotate": 1}, "usage_log.rotate: unknown key"),
    ({"dir": "/x", "topics": "yes"}, "usage_log.topics: expected true or false, got 'yes'"),
    ("yes", "usage_log: expected a mapping"),
])
def test_bad_usage_log_settings(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_usage_log(raw)
    assert str(info.value).startswith(message)
