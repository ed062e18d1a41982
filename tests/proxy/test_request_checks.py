"""The request checks on the data path, over the wire: a body that does not parse closes its
connection before the broker sees it (WellFormed), and other connections carry on."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest

from kafka_quota_proxy.protocol.headers import parse_request_header
from tests.proxy.conftest import correlation_id, is_closed, list_groups, read_frame, request_frame, running
from tests.proxy.quota_support import broker_frames, run
from tests.support.fake_broker import list_groups_v0_body
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
