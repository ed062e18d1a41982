"""Topic quotas end to end, in-process against a scripted broker, on the fake clock: a Produce's
hot topic is refused while its other topic goes on; a Fetch's hot topic is answered empty while
the other keeps its data; the metrics say so."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.metadata import MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from kafka_quota_proxy.config import merge
from kafka_quota_proxy.protocol.error_codes import NOT_ENOUGH_REPLICAS, THROTTLING_QUOTA_EXCEEDED
from kafka_quota_proxy.protocol.headers import RequestHeader
from kafka_quota_proxy.protocol.produce import produce_acks
from kafka_quota_proxy.proxy.cluster import Cluster
from tests.proxy.conftest import running
from tests.proxy.quota_support import (
    SESSION,
    START_MS,
    Script,
    connect,
    fetch,
    freeze,
    metric,
    run,
    scope,
)
from tests.support.fake_broker import BrokerConn
from tests.support.managers import produce_bytes, topic_fetch, topic_produce
from tests.support.usage import topic_totals, usage_records

HOT, COLD = "hot", "cold"
QUOTA = 1000  # bytes/s: 10,000 bytes fill a fresh 10 s window


class TopicScript(Script):
    """Answers a Produce for exactly the topics it carries; a Fetch with `fetched` bytes of
    records for each of the topics hot and cold."""

    def __init__(self) -> None:
        super().__init__()
        self.produced: list[list[str]] = []  # the topics of each Produce the broker saw
        self.fetched = {HOT: 0, COLD: 0}

    async def __call__(self, conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        key, v = header.api_key, header.api_version
        if key == 0:
            request: Any = ProduceRequest.decode(frame[header.body_offset:], version=v)
            self.produced.append([t.name for t in request.topic_data])
            if produce_acks(memoryview(frame), header.body_offset, v) == 0:
                return None
            topic = ProduceResponse.TopicProduceResponse
            part = topic.PartitionProduceResponse
            return bytes(ProduceResponse(version=v, throttle_time_ms=0, responses=[
                topic(name=t.name, partition_responses=[
                    part(index=p.index, error_code=0, base_offset=42, log_append_time_ms=-1,
                         log_start_offset=0)
                    for p in t.partition_data])
                for t in request.topic_data]).encode(version=v))
        if key == 1:
            topic = FetchResponse.FetchableTopicResponse
            part = topic.PartitionData
            return bytes(FetchResponse(version=v, throttle_time_ms=0, error_code=0, session_id=SESSION,
                                       responses=[
                topic(topic=name, topic_id=uuid.UUID(int=7), partitions=[
                    part(partition_index=0, error_code=0, high_watermark=100, last_stable_offset=100,
                         log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1,
                         records=b"r" * size)])
                for name, size in self.fetched.items()]).encode(version=v))
        return await super().__call__(conn, header, frame)


def two_topics(hot: int, cold: int, version: int = 9, acks: int = 1) -> Any:
    topic = ProduceRequest.TopicProduceData
    return ProduceRequest(version=version, transactional_id=None, acks=acks, timeout_ms=1000, topic_data=[
        topic(name=name, partition_data=[topic.PartitionProduceData(index=i, records=b"x" * size)
                                         for i in range(2)])
        for name, size in ((HOT, hot), (COLD, cold)) if size])


def errors(response: Any) -> dict[str, list[int]]:
    return {t.name: [p.error_code for p in t.partition_responses] for t in response.responses}


def test_a_produce_over_its_topic_quota_refuses_that_topic_alone() -> None:
    script = TopicScript()

    async def scenario() -> None:
        async with running(script, quotas=[{"topic": HOT, "producer_byte_rate": QUOTA}]) as h:
            now = freeze(h)
            c = await connect(h)
            # 2 x 6000 bytes of hot records at once: 1200 B/s over a fresh 10 s window, over the
            # quota. This request passes, as on Kafka.
            first = await c.call(two_topics(hot=6000, cold=10))
            assert errors(first) == {HOT: [0, 0], COLD: [0, 0]}
            assert first.throttle_time_ms == 0  # the topic's throttle does not hold the client
            # While the rate is over, the hot topic is refused unseen by the broker; cold goes on.
            now[0] += 1999
            second = await c.call(two_topics(hot=10, cold=10))
            # NOT_ENOUGH_REPLICAS by default: the one error every client measured retries.
            assert errors(second) == {COLD: [0, 0], HOT: [NOT_ENOUGH_REPLICAS] * 2}
            assert second.throttle_time_ms == 0
            # A request of the hot topic alone is answered by the proxy itself.
            alone = await c.call(two_topics(hot=10, cold=0))
            assert errors(alone) == {HOT: [NOT_ENOUGH_REPLICAS] * 2}
            assert {p.error_message for t in alone.responses for p in t.partition_responses} == {
                "The topic's producer_byte_rate quota at the proxy is exceeded; retry later: hot"}
            assert script.produced == [[HOT, COLD], [COLD]]
            # Two seconds on it is still over: the fresh window is still 10 s, so the rate is what it
            # was (Kafka's throttle predicted 2 s assuming a longer window). Each request is
            # judged on the rate itself.
            now[0] += 1
            still = await c.call(two_topics(hot=10, cold=10))
            assert errors(still) == {COLD: [0, 0], HOT: [NOT_ENOUGH_REPLICAS] * 2}
            # Once the burst has aged out of the 11 s the rate covers, the topic is written again.
            now[0] = START_MS + 11_000
            third = await c.call(two_topics(hot=10, cold=10))
            assert errors(third) == {HOT: [0, 0], COLD: [0, 0]}
            assert script.produced[-1] == [HOT, COLD]
            q = h.proxy.engine.scope(scope(h))
            # The refused bytes were never counted: only the 20 bytes just taken.
            assert topic_produce(q).measure(HOT, now[0]) == 20 / 10
            labels = {"quota_type": "topic_produce", "topic": HOT}
            assert metric(h, "kafka_quota_proxy_topic_throttled_requests_total", **labels) == 3
            # Kafka's throttle for the rate as it stood: 12,000 B over a 10.999 s window at
            # +1999 ms (1091 B/s: 1001 ms, twice), then over 10 s at +2000 ms (1200 B/s: 2000 ms).
            throttled_ms = metric(h, "kafka_quota_proxy_topic_throttle_time_ms_total", **labels)
            assert throttled_ms == 1001 + 1001 + 2000
            share = {"quota_type": "producer_byte_rate", "scope": scope(h), "topic": HOT}
            assert metric(h, "kafka_quota_proxy_topic_quota", **share) == QUOTA
            # No Metadata has named the topic's leaders: one broker known, so the whole quota.
            assert metric(h, "kafka_quota_proxy_topic_quota_share", **share) == QUOTA
            assert metric(h, "kafka_quota_proxy_topic_byte_rate", **share) == 20 / 10
            c.close()
    run(scenario())


def idempotent(sequence: int, size: int) -> Any:
    """A Produce of one idempotent batch (producer id 7, epoch 0) to hot partition 0."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=10**7)
    builder.set_producer_state(7, 0, sequence, False)
    builder.append(timestamp=0, key=None, value=b"v" * size, headers=[])
    builder.close()
    topic = ProduceRequest.TopicProduceData
    return ProduceRequest(version=9, transactional_id=None, acks=-1, timeout_ms=1000, topic_data=[
        topic(name=HOT, partition_data=[
            topic.PartitionProduceData(index=0, records=bytes(builder.buffer()))])])


def test_a_later_batch_waits_for_the_refused_one_to_be_retried() -> None:
    # A client has several requests in flight: a batch sent after a refused one must not reach
    # the broker before the refused one's retry, or the broker sees a gap in the sequence.
    script = TopicScript()

    async def scenario() -> None:
        async with running(script, quotas=[{"topic": HOT, "producer_byte_rate": QUOTA}]) as h:
            now = freeze(h)
            c = await connect(h)
            assert errors(await c.call(idempotent(0, 12_000))) == {HOT: [0]}  # takes the rate over
            assert errors(await c.call(idempotent(1, 10))) == {HOT: [NOT_ENOUGH_REPLICAS]}
            now[0] = START_MS + 11_000  # the rate is back under its bound
            # Sequence 2 was sent before the client learnt of 1's refusal: held back.
            assert errors(await c.call(idempotent(2, 10))) == {HOT: [NOT_ENOUGH_REPLICAS]}
            assert errors(await c.call(idempotent(1, 10))) == {HOT: [0]}  # the retry
            assert errors(await c.call(idempotent(2, 10))) == {HOT: [0]}
            assert len(script.produced) == 3
            c.close()
    run(scenario())


def test_the_refusal_error_is_a_setting() -> None:
    script = TopicScript()

    async def scenario() -> None:
        async with running(script, quota={"topic_refusal": "throttling_quota_exceeded"},
                           quotas=[{"topic": HOT, "producer_byte_rate": QUOTA}]) as h:
            freeze(h)
            c = await connect(h)
            await c.call(two_topics(hot=6000, cold=10, version=9))
            second = await c.call(two_topics(hot=10, cold=10, version=9))
            assert errors(second) == {COLD: [0, 0], HOT: [THROTTLING_QUOTA_EXCEEDED] * 2}
            c.close()
    run(scenario())


def test_a_client_is_charged_only_for_the_topics_that_went_on() -> None:
    script = TopicScript()

    async def scenario() -> None:
        async with running(script, quotas=[{"topic": HOT, "producer_byte_rate": QUOTA},
                                           {"client-id": "c", "producer_byte_rate": 10**9}]) as h:
            now = freeze(h)
            c = await connect(h)
            await c.call(two_topics(hot=6000, cold=10))
            q = h.proxy.engine.scope(scope(h))
            before = produce_bytes(q).measure("ANONYMOUS", "c", now[0])
            await c.call(two_topics(hot=5000, cold=10))  # hot refused: 10 KB cut out
            charged = (produce_bytes(q).measure("ANONYMOUS", "c", now[0]) - before) * 10
            assert 0 < charged < 1000
            c.close()
    run(scenario())


def test_acks_0_is_never_refused_but_the_connection_waits() -> None:
    script = TopicScript()

    async def scenario() -> None:
        async with running(script, quotas=[{"topic": HOT, "producer_byte_rate": QUOTA}]) as h:
            now = freeze(h)
            c = await connect(h)
            await c.call(two_topics(hot=6000, cold=10))
            now[0] += 10
            await c.send(two_topics(hot=10, cold=10, acks=0))
            await h.wait_for(lambda: len(script.produced) == 2)
            assert script.produced == [[HOT, COLD], [HOT, COLD]]  # nothing lost
            c.close()
    run(scenario())


def test_observe_mode_counts_but_refuses_nothing() -> None:
    script = TopicScript()

    async def scenario() -> None:
        async with running(script, quota={"mode": "observe"},
                           quotas=[{"topic": HOT, "producer_byte_rate": QUOTA}]) as h:
            freeze(h)
            c = await connect(h)
            await c.call(two_topics(hot=6000, cold=10))
            response = await c.call(two_topics(hot=10, cold=10))
            assert errors(response) == {HOT: [0, 0], COLD: [0, 0]}
            # The first request took the rate over and passed; the second is counted, and passes.
            assert metric(h, "kafka_quota_proxy_topic_throttled_requests_total",
                          quota_type="topic_produce", topic=HOT) == 1
            c.close()
    run(scenario())


def test_exempt_clients_are_not_measured() -> None:
    script = TopicScript()

    async def scenario() -> None:
        async with running(script, quota={"exempt_client_ids": ["c"]},
                           quotas=[{"topic": HOT, "producer_byte_rate": QUOTA}]) as h:
            now = freeze(h)
            c = await connect(h)
            for _ in range(3):
                assert errors(await c.call(two_topics(hot=6000, cold=10))) == {HOT: [0, 0], COLD: [0, 0]}
            assert topic_produce(h.proxy.engine.scope(scope(h))).measure(HOT, now[0]) == 0.0
            c.close()
    run(scenario())


def test_a_fetch_over_its_topic_quota_answers_that_topic_empty() -> None:
    script = TopicScript()
    script.fetched = {HOT: 12_000, COLD: 500}

    async def scenario() -> None:
        async with running(script, quotas=[{"topic": HOT, "consumer_byte_rate": QUOTA}]) as h:
            now = freeze(h)
            c = await connect(h)
            request = fetch(version=11, max_wait_ms=500)
            # 12,000 bytes of hot: 1200 B/s over a fresh window, a 2000 ms throttle. As on Kafka
            # the bytes are taken back and the topic answered empty; cold keeps its data.
            response = await c.call(request)
            records = {t.topic: [p.records for p in t.partitions] for t in response.responses}
            assert records[COLD] == [b"r" * 500]
            assert records[HOT] in ([b""], [None])
            hot = next(t for t in response.responses if t.topic == HOT).partitions[0]
            assert (hot.high_watermark, hot.error_code) == (100, 0)
            assert response.throttle_time_ms == 0  # cold had data: the client is not held
            q = h.proxy.engine.scope(scope(h))
            assert topic_fetch(q).measure(HOT, now[0]) == 0.0
            assert topic_fetch(q).measure(COLD, now[0]) == 0.0  # no quota: not measured
            # With only hot data the response is empty and carries the wait, capped by max_wait.
            script.fetched = {HOT: 12_000, COLD: 0}
            alone = await c.call(request)
            assert alone.throttle_time_ms == 500
            # Within its quota the topic is delivered.
            script.fetched = {HOT: 9_000, COLD: 0}
            within = await c.call(request)
            delivered = [p.records for t in within.responses for p in t.partitions if t.topic == HOT]
            assert delivered == [b"r" * 9000]
            assert metric(h, "kafka_quota_proxy_topic_throttled_requests_total",
                          quota_type="topic_fetch", topic=HOT) == 2
            c.close()
    run(scenario())


def test_the_split_follows_the_metadata_the_proxy_sees() -> None:
    cluster = Cluster(merge({"upstream": "127.0.0.1:9092"}), lambda node_id, sock: None)
    broker, topic, part = (MetadataResponse.MetadataResponseBroker, MetadataResponse.MetadataResponseTopic,
                           MetadataResponse.MetadataResponseTopic.MetadataResponsePartition)

    def metadata(leaders: list[int], error_code: int = 0) -> Any:
        return MetadataResponse(version=12, throttle_time_ms=0, cluster_id="c", controller_id=1, brokers=[
            broker(node_id=n, host=f"10.0.0.{n}", port=9092, rack=None) for n in (1, 2)], topics=[
            topic(error_code=error_code, name=HOT, topic_id=uuid.UUID(int=9), is_internal=False, partitions=[
                part(error_code=0, partition_index=i, leader_id=leader, leader_epoch=0, replica_nodes=[],
                     isr_nodes=[], offline_replicas=[])
                for i, leader in enumerate(leaders)])])

    cluster.observe_metadata(metadata([1, 1, 1, 2]))
    leadership = cluster.leadership
    assert leadership.share(HOT, "10.0.0.1:9092") == 0.75
    assert leadership.named(None, uuid.UUID(int=9).bytes) == HOT
    cluster.observe_metadata(metadata([1, 2, 2, -1]))  # moved, and one partition without a leader
    assert (leadership.share(HOT, "10.0.0.1:9092"), leadership.share(HOT, "10.0.0.2:9092")) == (0.25, 0.5)
    cluster.observe_metadata(metadata([], error_code=3))  # deleted
    assert leadership.share(HOT, "10.0.0.1:9092") is None
    assert cluster.topic_partitions(HOT) is None


def test_a_fetch_answered_empty_for_the_client_quota_gives_its_topics_bytes_back() -> None:
    """A fetch the client's own consumer_byte_rate answers empty delivered nothing of any topic:
    the topics' rates take its bytes back, as the client's does (Kafka's un-record)."""
    script = TopicScript()
    script.fetched = {HOT: 12_000, COLD: 500}

    async def scenario() -> None:
        async with running(script, quotas=[{"topic": HOT, "consumer_byte_rate": 10**6},
                                           {"client-id": "c", "consumer_byte_rate": QUOTA}]) as h:
            now = freeze(h)
            c = await connect(h)
            response = await c.call(fetch(version=11, max_wait_ms=500))
            assert response.throttle_time_ms > 0
            assert all(p.records in (b"", None) for t in response.responses for p in t.partitions)
            assert topic_fetch(h.proxy.engine.scope(scope(h))).measure(HOT, now[0]) == 0.0
            c.close()
    run(scenario())


def counts(produced: int, fetched: int, produce_refused: int, fetch_refused: int) -> dict[str, int]:
    return {"produce_bytes": produced, "fetch_bytes": fetched, "produce_refused_bytes": produce_refused,
            "fetch_refused_bytes": fetch_refused}


def test_the_usage_log_counts_bytes_per_topic(tmp_path: Path) -> None:
    """usage_log.topics: each tenant's record bytes per topic, taken and refused. Without a topic
    quota (the usage stages walk the messages) and with one (its stages count for the log)."""
    script = TopicScript()
    script.fetched = {HOT: 700, COLD: 500}

    async def scenario(directory: Path, quotas: list[dict[str, Any]]) -> None:
        async with running(script, quotas=quotas,
                           usage_log={"dir": str(directory), "instance": "t", "topics": True}) as h:
            freeze(h)
            c = await connect(h)
            await c.call(two_topics(hot=6000, cold=10))
            await c.call(two_topics(hot=10, cold=10))
            await c.call(fetch(version=12))
            await c.call(fetch(version=4))
            c.close()

    run(scenario(tmp_path / "free", []))
    assert topic_totals(usage_records(tmp_path / "free", "t")) == {HOT: counts(12_020, 1400, 0, 0),
                                                                   COLD: counts(40, 1000, 0, 0)}
    # The hot topic's quota refuses the second request's 20 bytes, and every fetch of it.
    script.fetched = {HOT: 12_000, COLD: 500}
    held = [{"topic": HOT, "producer_byte_rate": QUOTA, "consumer_byte_rate": QUOTA}]
    run(scenario(tmp_path / "held", held))
    assert topic_totals(usage_records(tmp_path / "held", "t")) == {HOT: counts(12_000, 0, 20, 24_000),
                                               COLD: counts(40, 1000, 0, 0)}
