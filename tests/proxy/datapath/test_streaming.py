"""Large responses through the proxy: a Fetch written on as it arrives (cut-through), anything
else gathered whole, and Fetch v16/v17 asked for as v15 so that no response needs its tail
rewritten. The scripted broker writes its responses in parts, with pauses between them."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import struct
from typing import Any

import pytest

from kafka_quota_proxy.protocol.headers import RequestHeader
from kafka_quota_proxy.proxy.datapath.upstream import STREAM_FROM
from tests.proxy.conftest import running
from tests.proxy.quota_support import (
    SESSION,
    START_MS,
    connect,
    fetch,
    fetch_response,
    freeze,
    list_groups,
    run,
)
from tests.support.fake_broker import BrokerConn, Chunked, list_groups_v0_body
from tests.support.managers import fetch_bytes

RECORDS = b"r" * (3 * STREAM_FROM)  # a response well over the streaming threshold
PAUSE = 0.3


class Broker:
    """Fetch answered in three parts with pauses; ListGroups at once."""

    def __init__(self, records: bytes = RECORDS, throttle_ms: int = 0) -> None:
        self.records = records
        self.throttle_ms = throttle_ms
        self.versions: list[int] = []

    async def __call__(self, conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | Chunked | None:
        if header.api_key == 1:
            self.versions.append(header.api_version)
            body = fetch_response(header.api_version, self.throttle_ms, self.records)
            third = len(body) // 3
            return Chunked(body, (third, 2 * third), PAUSE)
        return list_groups_v0_body()


async def read_some(reader: asyncio.StreamReader, at_least: int, timeout: float) -> bytes:
    data = b""
    while len(data) < at_least:
        data += await asyncio.wait_for(reader.read(1 << 20), timeout)
    return data


def test_a_large_fetch_is_written_on_as_it_arrives() -> None:
    broker = Broker()

    async def scenario() -> None:
        async with running(broker) as h:
            c = await connect(h)
            expected_body = fetch_response(11, 0, RECORDS)
            loop = asyncio.get_running_loop()
            started = loop.time()
            await c.send(fetch(11))
            # The first third reaches the client while the broker is still pausing.
            first = await read_some(c.reader, len(expected_body) // 3, timeout=PAUSE * 0.9)
            assert loop.time() - started < PAUSE
            rest = await read_some(c.reader, 8 + len(expected_body) - len(first), timeout=5)
            frame = first + rest
            assert frame == struct.pack(">ii", 4 + len(expected_body), 1) + expected_body
            c.close()
    run(scenario())


@pytest.mark.slow  # seconds of CPU: make test, not make check
def test_fetch_v16_and_v17_are_asked_for_as_v15_and_answered_as_asked() -> None:
    broker = Broker(records=b"small")

    async def scenario() -> None:
        async with running(broker) as h:
            c = await connect(h)
            for version in (12, 15, 16, 17):
                response = await c.call(fetch(version))
                assert response.session_id == SESSION
                assert [p.records for t in response.responses for p in t.partitions] == [b"small"]
            assert broker.versions == [12, 15, 15, 15]
            c.close()
    run(scenario())


def test_a_streamed_fetch_over_quota_is_replaced_and_the_rest_dropped() -> None:
    broker = Broker()

    async def scenario() -> None:
        # 19,000 B/s: the ~197 KB response is just over a fresh window's 190,000 bytes.
        async with running(broker, quotas=[{"client-id": "c", "consumer_byte_rate": 19_000}]) as h:
            freeze(h)
            c = await connect(h)
            response = await c.call(fetch(11, max_bytes=10 * STREAM_FROM))
            # Over quota: Kafka's throttled empty response in place of the data.
            assert response.responses == [] and response.session_id == SESSION
            size = len(fetch_response(11, 0, RECORDS)) + 4
            assert response.throttle_time_ms == math.floor((size / 10 - 19_000) / 19_000 * 10_000 + 0.5)
            q = h.proxy.engine.scope(f"127.0.0.1:{h.broker.port}")
            assert fetch_bytes(q).measure("ANONYMOUS", "c", START_MS) == 0.0  # un-recorded
            # The dropped pieces do not leak into the next response.
            assert (await c.call(list_groups(0))).error_code == 0
            c.close()
    run(scenario())


def test_a_large_response_behind_an_unanswered_one_waits_its_turn() -> None:
    """A Fetch answered after a slower request on the same connection: gathered whole, sent
    after the earlier response, never interleaved with it."""
    order: list[str] = []

    async def handler(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | Chunked | None:
        if header.api_key == 1:
            order.append("fetch")
            body = fetch_response(header.api_version, 0, RECORDS)
            return Chunked(body, (len(body) // 2,), 0.05)
        order.append("groups")
        return list_groups_v0_body()

    async def scenario() -> None:
        async with running(handler, sasl={"mode": "none"}) as h:
            c = await connect(h)
            first, second = list_groups(0), fetch(11)
            c.writer.write(c.frame(first) + c.frame(second))
            raw1, r1 = await c.recv(first)
            raw2, r2 = await c.recv(second)
            assert (struct.unpack(">i", raw1[4:8])[0], struct.unpack(">i", raw2[4:8])[0]) == (1, 2)
            assert r1.error_code == 0
            assert [p.records for t in r2.responses for p in t.partitions] == [RECORDS]
            c.close()
    run(scenario())


def test_a_large_non_fetch_response_is_gathered_and_handled_whole() -> None:
    """Metadata responses carry broker addresses to rewrite: one over the threshold is gathered
    whole, then rewritten like any other."""
    from kafka.protocol.metadata.metadata import MetadataRequest

    async def scenario() -> None:
        async with running() as h:
            c = await connect(h)
            # The fake broker answers Metadata itself, with its own address; many topics make
            # the response large.
            h.broker.metadata_topics = [f"topic-{i:05d}-" + "x" * 40 for i in range(2000)]
            request: Any = MetadataRequest[9](topics=None, allow_auto_topic_creation=False)
            corr = await c.send(request)
            raw, response = await c.recv(request)
            assert len(raw) > STREAM_FROM and struct.unpack(">i", raw[4:8])[0] == corr
            assert len(response.topics) == 2000
            assert [(b.host, b.port) for b in response.brokers] == [("127.0.0.1", h.settings.node_port(1))]
            c.close()
    run(scenario())


def test_a_client_gone_mid_stream_harms_nothing(caplog: Any) -> None:
    broker = Broker()

    async def scenario() -> None:
        async with running(broker) as h:
            c = await connect(h)
            await c.send(fetch(11))
            await read_some(c.reader, 1000, timeout=5)
            c.close()  # the rest of the response is still on its way
            await asyncio.sleep(3 * PAUSE)
            other = await connect(h)
            response = await other.call(fetch(11))
            assert [p.records for t in response.responses for p in t.partitions] == [RECORDS]
            other.close()
    run(scenario())
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


# -- splice(2): the rest of a large Fetch moved broker -> client in the kernel ------------------

BIG = bytes(range(256)) * (4 * STREAM_FROM // 256)  # 256 KiB of records, every byte value


def spliced(h: Any) -> float:
    return h.proxy.metrics.spliced_bytes._value.get()  # type: ignore[no-any-return]


def test_the_rest_of_a_large_fetch_is_spliced_exactly_and_in_order() -> None:
    """The first part reaches the proxy through its transport, the rest (after the broker's
    pause) by splice; the ListGroups pipelined behind it comes after it, whole."""
    broker = Broker(records=BIG)

    async def scenario() -> None:
        async with running(broker) as h:
            c = await connect(h)
            first, second = fetch(11), list_groups(0)
            c.writer.write(c.frame(first) + c.frame(second))
            raw1, r1 = await c.recv(first)
            raw2, r2 = await c.recv(second)
            body = fetch_response(11, 0, BIG)
            assert raw1 == struct.pack(">ii", 4 + len(body), 1) + body
            assert [p.records for t in r1.responses for p in t.partitions] == [BIG]
            assert correlation_id_of(raw2) == 2 and r2.error_code == 0
            # Everything after the first third (the broker paused there) went by splice.
            assert len(raw1) - len(raw1) // 3 - 1024 <= spliced(h) < len(raw1)
            assert h.proxy.metrics.api(1).response_bytes == len(raw1)
            # Again on the same connection: the pipe came back to the pool and is reused.
            assert (await c.call(fetch(11))).responses[0].partitions[0].records == BIG
            assert len(h.proxy.pipes._free) == 1
            c.close()
    run(scenario())


def test_splice_off_gives_the_same_bytes_through_the_transport() -> None:
    broker = Broker(records=BIG)

    async def scenario() -> None:
        async with running(broker, splice=False) as h:
            c = await connect(h)
            request = fetch(11)
            await c.send(request)
            raw, _ = await c.recv(request)
            body = fetch_response(11, 0, BIG)
            assert raw == struct.pack(">ii", 4 + len(body), 1) + body
            assert spliced(h) == 0
            c.close()
    run(scenario())


def test_a_broker_gone_mid_splice_closes_only_that_client(caplog: Any) -> None:
    from kafka_quota_proxy.protocol.headers import frame_response

    async def handler(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | Chunked | None:
        if header.api_key != 1:
            return list_groups_v0_body()
        whole = frame_response(header.correlation_id, 0, fetch_response(header.api_version, 0, BIG))
        if conn.frames and parse_client_id(conn.frames[0]) == "cut":
            conn.writer.write(whole[:100_000])
            await conn.writer.drain()
            await asyncio.sleep(0.2)  # the proxy is splicing the rest when the broker goes
            # A FIN after the bytes (not a reset, which could discard what the proxy has not
            # read yet): the client gets exactly what was sent, however loaded the machine.
            conn.writer.transport.close()
            return None
        return Chunked(fetch_response(header.api_version, 0, BIG), (100_000,), 0.05)

    async def scenario() -> None:
        async with running(handler) as h:
            other = await connect(h, client_id="fine")
            c = await connect(h, client_id="cut")
            await c.send(fetch(11))
            got = await read_until_closed(c.reader, timeout=5)
            assert len(got) == 100_000  # all the broker sent, then the connection closed
            response = await other.call(fetch(11))
            assert [p.records for t in response.responses for p in t.partitions] == [BIG]
            assert spliced(h) > 0
            other.close()
    caplog.set_level(logging.INFO, logger="kafka_quota_proxy.connection")
    run(scenario())
    closing = [r.getMessage() for r in caplog.records if r.getMessage().startswith("closing connection")]
    assert len(closing) == 1, closing
    assert re.fullmatch(r"closing connection from 127\.0\.0\.1:\d+ \(ANONYMOUS, bootstrap\): broker "
                        r"connection failed mid-response: connection closed mid-response", closing[0])


async def read_until_closed(reader: asyncio.StreamReader, timeout: float) -> bytes:
    data = b""
    while True:
        chunk = await asyncio.wait_for(reader.read(1 << 20), timeout)
        if not chunk:
            return data
        data += chunk


def correlation_id_of(raw: bytes) -> int:
    return int(struct.unpack(">i", raw[4:8])[0])


def parse_client_id(frame: bytes) -> str:
    from kafka_quota_proxy.protocol.headers import parse_request_header
    return parse_request_header(memoryview(frame)).client_id or ""
