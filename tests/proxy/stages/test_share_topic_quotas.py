"""Topic quotas and the usage log's bytes per topic for KIP-932 ShareFetch responses, in-process
against a scripted broker, on the fake clock: a ShareFetch's topics are charged their record bytes
as a Fetch's are, but a topic over its budget keeps its records (the broker acquired them for the
member) and the connection waits out the topic's throttle instead, at most half the records'
acquisition lock (docs/topic-quotas.md, "What a client sees")."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.headers import RequestHeader
from kafka_quota_proxy.proxy.context import ScopeManagers
from tests.proxy.conftest import Harness, running
from tests.proxy.quota_support import (
    LOCK_MS,
    Script,
    arrival,
    connect,
    freeze,
    kafka_throttle,
    list_groups,
    metric,
    run,
    scope,
    share_fetch,
)
from tests.support.fake_broker import BrokerConn
from tests.support.managers import topic_fetch
from tests.support.usage import topic_totals, usage_records

HOT, COLD, UNNAMED = "hot", "cold", "unnamed"
IDS = {HOT: uuid.UUID(int=0x407), COLD: uuid.UUID(int=0xC01D), UNNAMED: uuid.UUID(int=0xFFFF)}
QUOTA = 1000  # bytes/s: 10,000 bytes fill a fresh 10 s window
HOT_QUOTA = [{"topic": HOT, "consumer_byte_rate": QUOTA}]
RESPONSE: Any = codec()[78].response


class ShareTopicScript(Script):
    """Answers a ShareFetch with `shared[topic]` bytes of records for each topic, one partition
    each, every record acquired for the member."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = {HOT: 0, COLD: 0}

    async def __call__(self, conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        if header.api_key != 78:
            return await super().__call__(conn, header, frame)
        topic, v = RESPONSE.ShareFetchableTopicResponse, header.api_version
        part = topic.PartitionData
        return bytes(RESPONSE(
            version=v, throttle_time_ms=0, error_code=0, error_message=None,
            acquisition_lock_timeout_ms=LOCK_MS, node_endpoints=[], responses=[topic(
                topic_id=IDS[name], partitions=[part(
                    partition_index=0, error_code=0, error_message=None, acknowledge_error_code=0,
                    acknowledge_error_message=None,
                    current_leader=part.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1),
                    records=b"r" * size, acquired_records=[part.AcquiredRecords(
                        first_offset=0, last_offset=9, delivery_count=1)])])
                for name, size in self.shared.items()]).encode(version=v))


def named(h: Harness, *topics: str) -> None:
    """What a Metadata response through the proxy tells it: the topics' ids, and that the one
    broker leads each topic's one partition."""
    for topic in topics:
        h.proxy.engine.leadership.observe(topic, [scope(h)], IDS[topic].bytes)


def delivered(response: Any) -> dict[str, list[int]]:
    names = {i: n for n, i in IDS.items()}
    return {names[t.topic_id]: [len(p.records) for p in t.partitions] for t in response.responses}


def managers(h: Harness) -> ScopeManagers:
    return h.proxy.engine.scope(scope(h))


def test_a_share_fetch_over_its_topic_quota_is_delivered_counted_and_waited_out() -> None:
    script = ShareTopicScript()
    script.shared = {HOT: 10_050, COLD: 500}

    async def scenario() -> None:
        async with running(script, quotas=HOT_QUOTA) as h:
            now = freeze(h)
            named(h, HOT, COLD)
            c = await connect(h)
            # 10,050 bytes of hot over a fresh 10 s window: 1005 B/s, Kafka's throttle 50 ms.
            started = asyncio.get_running_loop().time()
            response = await c.call(share_fetch(2))
            assert delivered(response) == {HOT: [10_050], COLD: [500]}  # nothing cut out
            assert response.throttle_time_ms == kafka_throttle(1005, QUOTA) == 50
            assert response.acquisition_lock_timeout_ms == LOCK_MS
            # Delivered, so kept: not taken back as a Fetch's refused topic is.
            assert topic_fetch(managers(h)).measure(HOT, now[0]) == 1005.0
            assert topic_fetch(managers(h)).measure(COLD, now[0]) == 0.0  # no quota: not measured
            labels = {"quota_type": "topic_fetch", "topic": HOT}
            assert metric(h, "kafka_quota_proxy_topic_throttled_requests_total", **labels) == 1
            assert metric(h, "kafka_quota_proxy_topic_throttle_time_ms_total", **labels) == 50
            corr = await c.send(list_groups())  # the connection waits the topic's 50 ms
            assert (await arrival(h, script, corr)) - started >= 0.050 - 0.001
            await c.recv(list_groups())
            # The client quota throttled nothing: the wait is the topic's.
            assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="fetch",
                          user="ANONYMOUS", client_id="c") is None
            c.close()
    run(scenario())


def test_the_wait_is_at_most_half_the_acquisition_lock() -> None:
    """So that the member can still acknowledge the records it was just given."""
    script = ShareTopicScript()
    script.shared = {HOT: 30_000, COLD: 0}

    async def scenario() -> None:
        async with running(script, quotas=HOT_QUOTA) as h:
            freeze(h)
            named(h, HOT)
            c = await connect(h)
            response = await c.call(share_fetch(1))
            assert kafka_throttle(3000, QUOTA) == 20_000
            assert response.throttle_time_ms == LOCK_MS // 2 == 15_000
            assert delivered(response) == {HOT: [30_000], COLD: [0]}
            # The metrics count Kafka's throttle for the rate, as for every topic throttle.
            assert metric(h, "kafka_quota_proxy_topic_throttle_time_ms_total",
                          quota_type="topic_fetch", topic=HOT) == 20_000
            c.close()
    run(scenario())


def test_within_its_quota_the_topic_is_counted_and_nothing_waits() -> None:
    script = ShareTopicScript()
    script.shared = {HOT: 9_000, COLD: 0}

    async def scenario() -> None:
        async with running(script, quotas=HOT_QUOTA) as h:
            now = freeze(h)
            named(h, HOT)
            c = await connect(h)
            assert (await c.call(share_fetch(1))).throttle_time_ms == 0
            now[0] += 5000  # 9000 + 9000 over the 10 s the window still counts: 1800 B/s
            response = await c.call(share_fetch(1))
            assert response.throttle_time_ms == min(kafka_throttle(1800, QUOTA), LOCK_MS // 2) == 8000
            assert topic_fetch(managers(h)).measure(HOT, now[0]) == 1800.0
            c.close()
    run(scenario())


def test_observe_mode_counts_and_holds_nothing() -> None:
    script = ShareTopicScript()
    script.shared = {HOT: 12_000, COLD: 0}

    async def scenario() -> None:
        async with running(script, quota={"mode": "observe"}, quotas=HOT_QUOTA) as h:
            now = freeze(h)
            named(h, HOT)
            c = await connect(h)
            response = await c.call(share_fetch(1))
            assert (response.throttle_time_ms, delivered(response)) == (0, {HOT: [12_000], COLD: [0]})
            assert topic_fetch(managers(h)).measure(HOT, now[0]) == 1200.0
            assert metric(h, "kafka_quota_proxy_topic_throttle_time_ms_total",
                          quota_type="topic_fetch", topic=HOT) == 2000
            c.close()
    run(scenario())


def test_a_topic_id_no_metadata_named_and_an_exempt_client_are_not_measured() -> None:
    script = ShareTopicScript()
    script.shared = {UNNAMED: 12_000}

    async def scenario(config: dict[str, Any], topics: tuple[str, ...]) -> None:
        async with running(script, quotas=[{"topic": "<default>", "consumer_byte_rate": QUOTA}],
                           **config) as h:
            now = freeze(h)
            named(h, *topics)
            c = await connect(h)
            assert (await c.call(share_fetch(1))).throttle_time_ms == 0
            assert topic_fetch(managers(h)).measure(UNNAMED, now[0]) == 0.0
            c.close()

    run(scenario({}, ()))  # its id was never named by a Metadata response
    run(scenario({"quota": {"exempt_client_ids": ["c"]}}, (UNNAMED,)))


def test_a_share_fetch_answered_empty_for_the_client_quota_gives_its_topics_bytes_back() -> None:
    """With `share_fetch_throttle: empty` (Kafka's answer) the client's own quota answers the
    ShareFetch empty: nothing of any topic was delivered, so the topics' rates take it back, as
    for a Fetch."""
    script = ShareTopicScript()
    script.shared = {HOT: 12_000, COLD: 500}

    async def scenario() -> None:
        async with running(script, quota={"share_fetch_throttle": "empty"},
                           quotas=[{"topic": HOT, "consumer_byte_rate": 10**6},
                                   {"client-id": "c", "consumer_byte_rate": QUOTA}]) as h:
            now = freeze(h)
            named(h, HOT, COLD)
            c = await connect(h)
            response = await c.call(share_fetch(1))
            assert response.throttle_time_ms > 0 and response.responses == []
            assert topic_fetch(managers(h)).measure(HOT, now[0]) == 0.0
            c.close()
    run(scenario())


def counts(fetched: int, refused: int = 0) -> dict[str, int]:
    return {"produce_bytes": 0, "fetch_bytes": fetched, "produce_refused_bytes": 0,
            "fetch_refused_bytes": refused}


def test_the_usage_log_counts_share_fetch_bytes_per_topic_as_fetched(tmp_path: Path) -> None:
    """usage_log.topics: a ShareFetch's record bytes per topic are the tenant's fetched bytes,
    as a Fetch's: walked by the usage stage without a topic quota, counted by the topic quota's
    stage with one (a topic over its quota is delivered, so nothing is refused); a ShareFetch the
    client's quota answers empty delivers nothing."""
    script = ShareTopicScript()
    script.shared = {HOT: 700, COLD: 500}

    async def scenario(directory: Path, quotas: list[dict[str, Any]], quota: dict[str, Any],
                       versions: tuple[int, ...] = (1, 2)) -> None:
        async with running(script, quotas=quotas, quota=quota,
                           usage_log={"dir": str(directory), "instance": "t", "topics": True}) as h:
            freeze(h)
            named(h, HOT, COLD)
            c = await connect(h)
            for version in versions:
                await c.call(share_fetch(version))
            c.close()

    run(scenario(tmp_path / "free", [], {}))
    assert topic_totals(usage_records(tmp_path / "free", "t")) == {HOT: counts(1400), COLD: counts(1000)}
    script.shared = {HOT: 5025, COLD: 500}  # the second takes hot over its quota: 1005 B/s
    run(scenario(tmp_path / "held", HOT_QUOTA, {}))
    assert topic_totals(usage_records(tmp_path / "held", "t")) == {HOT: counts(10_050), COLD: counts(1000)}
    client = [{"client-id": "c", "consumer_byte_rate": 100}]
    run(scenario(tmp_path / "empty", client, {"share_fetch_throttle": "empty"}, (2,)))
    records = usage_records(tmp_path / "empty", "t")
    assert sum(r["fetch_bytes"] for r in records) > 0  # the empty answer's own bytes
    assert topic_totals(records) == {}
