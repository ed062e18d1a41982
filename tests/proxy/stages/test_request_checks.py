"""The request checks on the data path, over the wire: a body that does not parse closes its
connection before the broker sees it (WellFormed), a CreateTopics for more partitions than Kafka
allows is answered POLICY_VIOLATION (CreateTopicsLimit), and other connections carry on."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse

from kafka_quota_proxy.protocol.api_keys import CREATE_TOPICS
from kafka_quota_proxy.protocol.headers import RequestHeader, parse_request_header
from kafka_quota_proxy.proxy.stages.create_topics_limit import (
    MAX_PARTITIONS_PER_REQUEST,
    TOO_MANY_PARTITIONS,
    partitions_requested,
)
from tests.proxy.conftest import correlation_id, is_closed, list_groups, read_frame, request_frame, running
from tests.proxy.quota_support import broker_frames, connect, run
from tests.support.fake_broker import BrokerConn, list_groups_v0_body
from tests.support.frames import FUZZ_CREATE_TOPICS, LIBRDKAFKA_METADATA

# Bodies that do not parse, one per rule: an array count beyond the bytes (Produce v3), a null
# where none is allowed (the fuzz's CreateTopics), a string past the end (Metadata v1), a
# compact count beyond the bytes (Metadata v12).
BAD = [
    request_frame(0, 3, 7, struct.pack(">hhii", -1, 1, 1000, 0x7FFFFFFF)),
    FUZZ_CREATE_TOPICS,
    request_frame(3, 1, 7, struct.pack(">ih", 1, 300) + b"orders"),
    request_frame(3, 12, 7, b"\xff\xff\xff\xff\x07", flexible=True),
]


async def answer_create_topics(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
    if header.api_key != CREATE_TOPICS:
        return list_groups_v0_body()
    request = CreateTopicsRequest.decode(frame[header.body_offset:], version=header.api_version)
    result = CreateTopicsResponse.CreatableTopicResult
    return bytes(CreateTopicsResponse(version=header.api_version, throttle_time_ms=0, topics=[
        result(name=t.name, error_code=0, error_message=None, num_partitions=t.num_partitions,
               replication_factor=t.replication_factor, configs=[]) for t in request.topics]
    ).encode(version=header.api_version))


def create_topics(*partitions: int, version: int = 7) -> Any:
    topic = CreateTopicsRequest.CreatableTopic
    return CreateTopicsRequest(version=version, timeout_ms=1000, validate_only=False, topics=[
        topic(name=f"t{i}", num_partitions=n, replication_factor=1, assignments=[], configs=[])
        for i, n in enumerate(partitions)])


def forwarded_keys(h: Any) -> list[int]:
    return [parse_request_header(memoryview(f)).api_key for f in broker_frames(h)]


@pytest.mark.parametrize("frame", BAD, ids=["count-beyond-bytes", "fuzz-create-topics", "string-past-end",
                                            "compact-count-beyond-bytes"])
def test_a_body_that_does_not_parse_closes_its_connection_before_the_broker_sees_it(
        frame: bytes, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with running() as h:
            good_r, good_w = await h.connect()
            good_w.write(list_groups(1))
            assert (await read_frame(good_r))[8:] == list_groups_v0_body()
            bad_r, bad_w = await h.connect()
            bad_w.write(frame)
            assert await is_closed(bad_r)
            assert h.errors("truncated") + h.errors("malformed") == 1
            # the other connection carries on, and the broker saw only its requests
            good_w.write(list_groups(2))
            assert correlation_id(await read_frame(good_r)) == 2
            assert forwarded_keys(h) == [16, 16]
            good_w.close()
            bad_w.close()
    with caplog.at_level("WARNING", logger="kafka_quota_proxy"):
        run(scenario())
    assert "Traceback" not in caplog.text


def test_other_clients_keep_working_while_bad_requests_arrive() -> None:
    # One client pipelines 200 requests while 40 others each send a body that does not parse,
    # interleaved with its requests: every answer arrives, in order; every bad one is refused.
    async def scenario() -> None:
        async with running() as h:
            good_r, good_w = await h.connect()

            async def bad(frame: bytes) -> bool:
                reader, writer = await h.connect()
                writer.write(frame)
                closed = await is_closed(reader)
                writer.close()
                return closed

            bad_ones = []
            for i in range(1, 201):
                good_w.write(list_groups(i))
                if i % 5 == 0:
                    bad_ones.append(asyncio.create_task(bad(BAD[i % len(BAD)])))
                    await asyncio.sleep(0)
            answers = [correlation_id(await read_frame(good_r)) for _ in range(200)]
            assert answers == list(range(1, 201))
            assert all(await asyncio.gather(*bad_ones))
            assert h.errors("truncated") + h.errors("malformed") == 40
            assert forwarded_keys(h) == [16] * 200
            good_w.close()
    run(scenario())


def test_librdkafkas_metadata_with_bytes_after_its_body_is_forwarded() -> None:
    async def scenario() -> None:
        async with running() as h:
            reader, writer = await h.connect()
            writer.write(LIBRDKAFKA_METADATA)
            await h.wait_for(lambda: bool(broker_frames(h)))
            assert broker_frames(h) == [LIBRDKAFKA_METADATA]
            assert not reader.at_eof()
            writer.close()
    run(scenario())


def test_a_create_topics_over_kafkas_partition_limit_is_refused_with_policy_violation() -> None:
    # The fuzz's request, well-formed: Tansu 0.6.0 creates it and dies at the next Metadata.
    async def scenario() -> None:
        async with running(answer_create_topics) as h:
            c = await connect(h)
            for version in (0, 4, 7):
                response = await c.call(create_topics(825360385, version=version))
                assert [(t.name, t.error_code) for t in response.topics] == [("t0", 44)]
                if version >= 1:
                    assert response.topics[0].error_message == TOO_MANY_PARTITIONS
            # Kafka's count: the whole request over the limit fails whole, topic by topic.
            response = await c.call(create_topics(MAX_PARTITIONS_PER_REQUEST, 1))
            assert [t.error_code for t in response.topics] == [44, 44]
            assert forwarded_keys(h) == []
            # At the limit it goes to the broker, on the same connection.
            response = await c.call(create_topics(MAX_PARTITIONS_PER_REQUEST))
            assert [(t.name, t.error_code, t.num_partitions) for t in response.topics] == [
                ("t0", 0, MAX_PARTITIONS_PER_REQUEST)]
            assert forwarded_keys(h) == [CREATE_TOPICS]
            c.close()
    run(scenario())


def test_partitions_are_counted_as_kafka_counts_them() -> None:
    topic = CreateTopicsRequest.CreatableTopic
    assignment = topic.CreatableReplicaAssignment
    request = CreateTopicsRequest(version=7, timeout_ms=1000, validate_only=False, topics=[
        topic(name="a", num_partitions=7, replication_factor=1, assignments=[], configs=[]),
        topic(name="default", num_partitions=-1, replication_factor=-1, assignments=[], configs=[]),
        topic(name="none", num_partitions=0, replication_factor=1, assignments=[], configs=[]),
        topic(name="bad", num_partitions=-5, replication_factor=1, assignments=[], configs=[]),
        topic(name="assigned", num_partitions=-1, replication_factor=-1, configs=[], assignments=[
            assignment(partition_index=i, broker_ids=[1]) for i in range(3)])])
    assert partitions_requested(request) == 7 + 1 + 0 + 0 + 3
