"""The producer-id quota (KIP-936) end to end in process: real stages, a scripted broker, the
quota engine on a fake clock. The producer-id windows are shortened to 11 samples of 1 s, so a
fresh window is 10 s and a quota of 0.5 ids/s lets 5 new ids through before the first throttle
(2000 ms for the 6th: (0.6 - 0.5) / 0.5 * 10 s)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from kafka_quota_proxy.protocol.produce import producer_ids
from tests.proxy.conftest import correlation_id, running
from tests.proxy.quota_support import (
    START_MS,
    Script,
    broker_frames,
    connect,
    freeze,
    list_groups,
    metric,
    run,
    scope,
)
from tests.support.managers import produce_bytes, producer_id_rate

T = ProduceRequest.TopicProduceData


def batch(pid: int | None) -> bytes:
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1_000_000)
    if pid is not None:
        b.set_producer_state(pid, 0, 0, False)
    b.append(timestamp=None, key=None, value=b"v", headers=[])
    b.close()
    return bytes(b.buffer())


def produce(pids: list[int | None], version: int = 9, acks: int = 1,
            partitions: int = 1, topics: tuple[str, ...] = ("orders",)) -> Any:
    """One batch per producer id, in partition 0 of the first topic; other partitions get a
    batch without an id."""
    records = b"".join(batch(pid) for pid in pids)
    return ProduceRequest(version=version, transactional_id=None, acks=acks, timeout_ms=1000, topic_data=[
        T(name=name, topic_id=uuid.UUID(int=i + 7), partition_data=[
            T.PartitionProduceData(index=p, records=records if (i, p) == (0, 0) else batch(None))
            for p in range(partitions)])
        for i, name in enumerate(topics)])


def settings(action: str = "throttle", quota: float = 0.5, **quota_section: Any) -> dict[str, Any]:
    return {"quota": {"producer_ids": {"action": action, "window_size_seconds": 1}, **quota_section},
            "quotas": [{"user": "<default>", "producer_ids_rate": quota}]}


def ids_throttle(h: Any) -> float | None:
    return metric(h, "kafka_quota_proxy_throttle_time_ms_total", quota_type="producer_ids",
                  user="ANONYMOUS", client_id="")


def test_new_ids_over_quota_are_throttled_and_seen_ids_are_free() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, **settings()) as h:
            freeze(h)
            c = await connect(h)
            assert (await c.call(produce([1, 2, 3]))).throttle_time_ms == 0
            assert (await c.call(produce([1, 2, 3, 4, 5]))).throttle_time_ms == 0  # 2 new: at the quota
            assert (await c.call(produce([None, 3]))).throttle_time_ms == 0  # nothing new
            response = await c.call(produce([6]))
            assert response.throttle_time_ms == 2000
            # Forwarded all the same: the broker's answer, with the throttle written in.
            assert [p.base_offset for t in response.responses for p in t.partition_responses] == [42]
            assert script.api_keys == [0, 0, 0, 0]
            assert ids_throttle(h) == 2000
            s = scope(h)
            assert metric(h, "kafka_quota_proxy_producer_id_rate", scope=s, user="ANONYMOUS") == 0.6
            assert metric(h, "kafka_quota_proxy_producer_ids_tracked", scope=s, user="ANONYMOUS") == 6
            assert metric(h, "kafka_quota_proxy_producer_id_cache_users", scope=s) == 1
            assert metric(h, "kafka_quota_proxy_producer_id_cache_bytes", scope=s) == 1199
            fp = metric(h, "kafka_quota_proxy_producer_id_false_positive_rate", scope=s, user="ANONYMOUS")
            assert fp is not None and 0 < fp < 1e-9  # 6 ids in a filter sized for 1000
            assert metric(h, "kafka_quota_proxy_quota_limit", quota_type="producer_ids_rate", scope=s,
                          user="ANONYMOUS", client_id="") == 0.5
            c.close()
    run(scenario())


@pytest.mark.parametrize("version", [3, 7, 8, 9, 13])
def test_reject_fails_every_partition_and_forwards_nothing(version: int) -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, **settings("reject")) as h:
            freeze(h)
            c = await connect(h)
            assert (await c.call(produce([1, 2, 3, 4, 5], version))).throttle_time_ms == 0
            forwarded = len(broker_frames(h))
            response = await c.call(produce([6], version, partitions=2, topics=("orders", "audit")))
            assert len(broker_frames(h)) == forwarded  # the broker never saw it
            assert response.throttle_time_ms == 2000
            parts = [(t.topic_id if version >= 13 else t.name, p.index, p.error_code, p.base_offset)
                     for t in response.responses for p in t.partition_responses]
            ident = ([uuid.UUID(int=7), uuid.UUID(int=8)] if version >= 13 else ["orders", "audit"])
            assert parts == [(ident[0], 0, 89, -1), (ident[0], 1, 89, -1),
                             (ident[1], 0, 89, -1), (ident[1], 1, 89, -1)]
            if version >= 8:
                assert {p.error_message for t in response.responses for p in t.partition_responses} == {
                    "1 new producer id(s) would exceed the producer_ids_rate quota of user 'ANONYMOUS'; "
                    "retry after 2000 ms"}
            s = scope(h)
            assert metric(h, "kafka_quota_proxy_producer_id_rejections_total", scope=s, user="ANONYMOUS") == 1
            assert metric(h, "kafka_quota_proxy_producer_ids_tracked", scope=s, user="ANONYMOUS") == 5
            q = h.proxy.engine.scope(s)
            assert producer_id_rate(q).measure("ANONYMOUS", START_MS) == 0.5  # the refused id uncounted
            assert produce_bytes(q).measure("ANONYMOUS", "c", START_MS) == 0.0  # no byte quota: unmeasured
            c.close()
    run(scenario())


def test_a_refused_acks0_produce_is_dropped_without_a_response() -> None:
    script = Script()

    async def scenario() -> None:
        # 50 ids/s: a fresh window holds 500, and the 501st costs a 20 ms throttle.
        async with running(script, **settings("reject", quota=50)) as h:
            freeze(h)
            c = await connect(h)
            assert (await c.call(produce(list(range(500))))).throttle_time_ms == 0
            refused = c.frame(produce([500], acks=0))
            c.writer.write(refused)
            corr = await c.send(list_groups())
            raw, _ = await c.recv(list_groups())
            assert correlation_id(raw) == corr  # the acks=0 request got no response
            assert refused not in broker_frames(h)
            assert script.api_keys == [0, 16]
            assert ids_throttle(h) == 20
            c.close()
    run(scenario())


def test_requests_without_producer_ids_pass_whatever_the_rate() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, **settings("reject")) as h:
            freeze(h)
            c = await connect(h)
            await c.call(produce([1, 2, 3, 4, 5]))
            assert (await c.call(produce([None, None]))).responses[0].partition_responses[0].error_code == 0
            assert (await c.call(produce([1]))).responses[0].partition_responses[0].error_code == 0  # seen
            assert script.api_keys == [0, 0, 0]
            c.close()
    run(scenario())


def test_observe_mode_counts_but_never_refuses() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, **settings("reject", mode="observe")) as h:
            freeze(h)
            c = await connect(h)
            await c.call(produce([1, 2, 3, 4, 5]))
            response = await c.call(produce([6]))
            assert response.throttle_time_ms == 0
            assert response.responses[0].partition_responses[0].error_code == 0
            assert script.api_keys == [0, 0]
            assert ids_throttle(h) == 2000  # what would have been
            c.close()
    run(scenario())


def test_exempt_principals_are_not_counted() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, **settings("reject", exempt_principals=["ANONYMOUS"])) as h:
            freeze(h)
            c = await connect(h)
            await c.call(produce(list(range(50))))
            assert script.api_keys == [0]
            assert len(producer_id_rate(h.proxy.engine.scope(scope(h))).cache) == 0
            c.close()
    run(scenario())


def test_malformed_records_are_left_to_the_broker() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, **settings("reject")) as h:
            freeze(h)
            c = await connect(h)
            bad = ProduceRequest(version=9, transactional_id=None, acks=1, timeout_ms=1000, topic_data=[
                T(name="orders", partition_data=[T.PartitionProduceData(index=0, records=b"x" * 70)])])
            frame = c.frame(bad)
            with pytest.raises(Exception, match="record batch"):
                producer_ids(memoryview(frame), 4 + 2 + 2 + 4 + 2 + 1 + 1, 9)
            await c.call(bad)  # forwarded: the broker answers for the records it cannot read
            assert script.api_keys == [0]
            c.close()
    run(scenario())


def test_cleanup_drops_idle_users() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, **settings()) as h:
            now = freeze(h)
            c = await connect(h)
            await c.call(produce([1]))
            engine = h.proxy.engine
            assert engine.tracks_producer_ids()
            now[0] += 1500  # the user's only filter is 1.5 windows old
            # The cleanup runs every 10 ms while a user is tracked (once a second otherwise).
            await h.wait_for(lambda: not engine.tracks_producer_ids(), timeout=3.0)
            c.close()
    run(scenario())
