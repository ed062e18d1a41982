"""Quota enforcement end to end: an in-process Proxy in front of a scripted broker, the real stages,
and the quota engine on a fake clock, so every throttle is Kafka's number to the millisecond.

The clock only drives measurement. Muting a throttled client uses the event loop's real time, so
those checks use small throttles and only lower bounds: a muted client's next request cannot reach
the broker before the throttle has run out.
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    DescribeClientQuotasRequest,
)
from kafka.protocol.admin.topics import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from devkit.processes import free_port
from kafka_quota_proxy.config import load_file, merge
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.fetch import read_fetch_request
from kafka_quota_proxy.protocol.headers import RequestHeader, frame_response
from kafka_quota_proxy.protocol.produce import produce_acks
from kafka_quota_proxy.proxy.reload import reload_config
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from tests.proxy.conftest import (
    Harness,
    correlation_id,
    is_closed,
    read_frame,
    request_frame,
    running,
    serving,
)
from tests.support.fake_broker import NODE_ID, BrokerConn, FakeBroker, list_groups_v0_body

START_MS = 1_000_000  # the fake clock's start; any value works, samples start at the first event
SESSION = 0x5E55


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def freeze(h: Harness) -> list[int]:
    """Replace the quota engine's clock; the test moves time by changing now[0]."""
    now = [START_MS]
    h.proxy.engine.clock = lambda: now[0]
    return now


def kafka_throttle(measured: float, quota: float, window_ms: float = 10_000) -> int:
    """QuotaUtils.throttleTime: round((O - T) / T * window); a fresh window is (N-1)*W = 10 s."""
    return math.floor((measured - quota) / quota * window_ms + 0.5)


def metric(h: Harness, name: str, **labels: str) -> float | None:
    return h.proxy.metrics.registry.get_sample_value(name, labels)


def scope(h: Harness) -> str:
    return f"127.0.0.1:{h.broker.port}"  # quota.scope broker: the upstream broker's address


# --- the scripted broker ------------------------------------------------------------------------

class Script:
    """What the fake broker answers, and when each request reached it (loop time)."""

    def __init__(self) -> None:
        self.produce_throttle = 0
        self.fetch_throttle = 0
        self.fetch_records = b""
        self.delay = 0.0  # before answering ListGroups
        self.produce_delay = 0.0  # before answering Produce
        self.arrivals: dict[int, float] = {}  # correlation id -> loop time at the broker
        self.api_keys: list[int] = []

    async def __call__(self, conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        self.arrivals[header.correlation_id] = asyncio.get_running_loop().time()
        self.api_keys.append(header.api_key)
        key, v = header.api_key, header.api_version
        if key == 0:
            if produce_acks(memoryview(frame), header.body_offset, v) == 0:
                return None
            if self.produce_delay:
                await asyncio.sleep(self.produce_delay)
            return produce_response(v, self.produce_throttle)
        if key == 1:
            return fetch_response(v, self.fetch_throttle, self.fetch_records)
        if key == 16:
            if self.delay:
                await asyncio.sleep(self.delay)
            return list_groups_response(v)
        if key == 19:
            request: Any = CreateTopicsRequest.decode(frame[header.body_offset:], version=v)
            cls: Any = CreateTopicsResponse
            return bytes(cls(version=v, throttle_time_ms=0, topics=[
                cls.CreatableTopicResult(name=t.name, error_code=0, num_partitions=t.num_partitions,
                                         replication_factor=t.replication_factor)
                for t in request.topics]).encode(version=v))
        if key == 20:
            request = DeleteTopicsRequest.decode(frame[header.body_offset:], version=v)
            cls = DeleteTopicsResponse
            return bytes(cls(version=v, throttle_time_ms=0, responses=[
                cls.DeletableTopicResult(name=t.name, topic_id=t.topic_id, error_code=0)
                for t in request.topics]).encode(version=v))
        return list_groups_v0_body()


def produce_response(version: int, throttle_ms: int) -> bytes:
    topic = ProduceResponse.TopicProduceResponse
    part = topic.PartitionProduceResponse
    ident = {"topic_id": uuid.UUID(int=7)} if version >= 13 else {"name": "orders"}
    return bytes(ProduceResponse(version=version, throttle_time_ms=throttle_ms, responses=[
        topic(**ident, partition_responses=[part(index=0, error_code=0, base_offset=42,
                                                 log_append_time_ms=-1, log_start_offset=0)])]
    ).encode(version=version))


def fetch_response(version: int, throttle_ms: int, records: bytes) -> bytes:
    topic = FetchResponse.FetchableTopicResponse
    part = topic.PartitionData
    return bytes(FetchResponse(version=version, throttle_time_ms=throttle_ms, error_code=0,
                               session_id=SESSION, responses=[topic(
                                   topic="orders", topic_id=uuid.UUID(int=7), partitions=[
                                       part(partition_index=0, error_code=0, high_watermark=100,
                                            last_stable_offset=100, log_start_offset=0,
                                            aborted_transactions=None, preferred_read_replica=-1,
                                            records=records)])]).encode(version=version))


def records_for_fetch_size(version: int, size: int) -> bytes:
    """Records that make the Fetch response's quota size (body + 4, Kafka's sizeOf) exactly `size`."""
    n = 0
    while True:
        got = len(fetch_response(version, 0, b"r" * n)) + 4
        if got == size:
            return b"r" * n
        assert got < size, f"cannot hit {size} exactly"
        n += max(1, size - got - 4)  # small last steps: a length varint may grow by a byte


def list_groups_response(version: int) -> bytes:
    cls: Any = codec()[16].response
    return bytes(cls(version=version, throttle_time_ms=0, error_code=0, groups=[]).encode(version=version))


# --- the client side ----------------------------------------------------------------------------

class Client:
    """One client connection speaking kafka-python's request classes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 client_id: str = "c") -> None:
        self.reader = reader
        self.writer = writer
        self.client_id = client_id
        self.correlation = 0

    def frame(self, msg: Any, client_id: str | None = None) -> bytes:
        key, version = msg.API_KEY, msg.API_VERSION
        self.correlation += 1
        return request_frame(key, version, self.correlation, bytes(msg.encode(version=version)),
                             client_id=(client_id or self.client_id).encode(),
                             flexible=codec()[key].is_flexible(version))

    async def send(self, msg: Any, client_id: str | None = None) -> int:
        self.writer.write(self.frame(msg, client_id))
        await self.writer.drain()
        return self.correlation

    async def recv(self, msg: Any) -> tuple[bytes, Any]:
        """The next response, raw and decoded as the response to `msg`."""
        raw = await read_frame(self.reader)
        spec = codec()[msg.API_KEY]
        at = 8 + spec.response_header_version(msg.API_VERSION)  # header v1: one empty tag byte
        return raw, spec.response.decode(raw[at:], version=msg.API_VERSION)

    async def call(self, msg: Any, client_id: str | None = None) -> Any:
        corr = await self.send(msg, client_id)
        raw, response = await self.recv(msg)
        assert correlation_id(raw) == corr
        return response

    def close(self) -> None:
        self.writer.close()


async def connect(h: Harness, client_id: str = "c") -> Client:
    reader, writer = await h.connect()
    return Client(reader, writer, client_id)


def produce(version: int = 7, size: int | None = None, acks: int = 1) -> Any:
    """A Produce request; with `size`, its Kafka request size (header + body, client-id "c") is
    exactly that many bytes."""
    topic = ProduceRequest.TopicProduceData
    ident = {"topic_id": uuid.UUID(int=7)} if version >= 13 else {"name": "orders"}

    def build(n: int) -> Any:
        return ProduceRequest(version=version, transactional_id=None, acks=acks, timeout_ms=1000,
                              topic_data=[topic(**ident, partition_data=[
                                  topic.PartitionProduceData(index=0, records=b"x" * n)])])
    if size is None:
        return build(100)
    n = 0
    while True:
        msg = build(n)
        got = len(request_frame(0, version, 1, bytes(msg.encode(version=version)), client_id=b"c",
                                flexible=version >= 9)) - 4
        if got == size:
            return msg
        assert got < size, f"cannot hit {size} exactly"
        n += max(1, size - got - 4)


def fetch(version: int = 11, max_bytes: int = 52_428_800, replica_id: int = -1,
          max_wait_ms: int = 0) -> Any:
    topic = FetchRequest.FetchTopic
    kw: dict[str, Any] = {}
    if version >= 15:
        if replica_id >= 0:
            kw["replica_state"] = FetchRequest.ReplicaState(replica_id=replica_id, replica_epoch=3)
    else:
        kw["replica_id"] = replica_id
    return FetchRequest(version=version, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes,
                        isolation_level=0, session_id=0, session_epoch=-1, topics=[topic(
                            topic="orders", topic_id=uuid.UUID(int=7), partitions=[
                                topic.FetchPartition(partition=0, fetch_offset=0,
                                                     partition_max_bytes=1_048_576)])],
                        forgotten_topics_data=[], rack_id="", **kw)


def list_groups(version: int = 1) -> Any:
    return codec()[16].request(version=version, states_filter=[], types_filter=[])


def api_versions() -> Any:
    return ApiVersionsRequest(version=3, client_software_name="test", client_software_version="1")


def create_topics(version: int, topics: list[tuple[str, int, int]]) -> Any:
    """topics: (name, num_partitions, number of explicit assignments) each."""
    cls: Any = CreateTopicsRequest
    t = cls.CreatableTopic
    return cls(version=version, timeout_ms=1000, validate_only=False, topics=[
        t(name=name, num_partitions=num if not assigned else -1,
          replication_factor=1 if not assigned else -1,
          assignments=[t.CreatableReplicaAssignment(partition_index=i, broker_ids=[NODE_ID])
                       for i in range(assigned)], configs=[])
        for name, num, assigned in topics])


async def arrival(h: Harness, script: Script, corr: int) -> float:
    await h.wait_for(lambda: corr in script.arrivals)
    return script.arrivals[corr]


def broker_frames(h: Harness) -> list[bytes]:
    return [f for c in h.broker.client_conns() for f in c.frames]


# --- Produce ------------------------------------------------------------------------------------

PRODUCE_QUOTA = [{"client-id": "c", "producer_byte_rate": 500}]


@pytest.mark.parametrize("version", [3, 7, 9, 13])
def test_produce_over_quota_gets_kafkas_throttle_and_is_muted(version: int) -> None:
    script = Script()
    size = 5040  # 504 B/s over a fresh 10 s window against 500 B/s

    async def scenario() -> None:
        async with running(script, quotas=PRODUCE_QUOTA) as h:
            freeze(h)
            c = await connect(h)
            loop = asyncio.get_running_loop()
            started = loop.time()
            response = await c.call(produce(version, size))
            expected = kafka_throttle(size / 10, 500)
            assert expected == 80
            assert response.throttle_time_ms == expected
            # The broker's partition results are the client's, untouched.
            assert [p.base_offset for t in response.responses for p in t.partition_responses] == [42]
            q = h.proxy.engine.scope(scope(h))
            assert q.produce.measure("ANONYMOUS", "c", START_MS) == size / 10

            # The next request is not read until the throttle has run out.
            corr = await c.send(list_groups())
            assert (await arrival(h, script, corr)) - started >= expected / 1000 - 0.001
            await c.recv(list_groups())
            c.close()
    run(scenario())


def test_produce_v0_carries_no_throttle_but_is_muted() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=PRODUCE_QUOTA) as h:
            freeze(h)
            c = await connect(h)
            started = asyncio.get_running_loop().time()
            request = produce(0, 5040)
            await c.send(request)
            raw, _ = await c.recv(request)
            assert raw[8:] == produce_response(0, 0)  # v0 has no throttle_time_ms: unchanged
            corr = await c.send(list_groups())
            assert (await arrival(h, script, corr)) - started >= 0.080 - 0.001
            c.close()
    run(scenario())


@pytest.mark.parametrize(("broker_ms", "client_sees"), [(5000, 5000), (30, 80), (80, 80)])
def test_produce_throttle_is_the_larger_of_brokers_and_proxys(broker_ms: int, client_sees: int) -> None:
    script = Script()
    script.produce_throttle = broker_ms

    async def scenario() -> None:
        async with running(script, quotas=PRODUCE_QUOTA) as h:
            freeze(h)
            c = await connect(h)
            assert (await c.call(produce(7, 5040))).throttle_time_ms == client_sees
            # The proxy's own throttle (80 ms) is what it counts and mutes for.
            assert metric(h, "kafka_quota_proxy_throttle_time_ms_total", quota_type="produce",
                          user="ANONYMOUS", client_id="c") == 80
            (conn,) = h.proxy.connections
            assert conn._muted_until > 0
            c.close()
    run(scenario())


def test_produce_throttle_follows_the_window() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=PRODUCE_QUOTA) as h:
            now = freeze(h)
            c = await connect(h)
            assert (await c.call(produce(7, 5000))).throttle_time_ms == 0  # exactly at the quota
            now[0] += 500
            # 10000 B over 0.5 s elapsed plus the 10 s every window starts with: 10.5 s
            expected = kafka_throttle(10_000 / 10.5, 500, window_ms=10_500)
            assert (await c.call(produce(7, 5000))).throttle_time_ms == expected == 9500
            c.close()
    run(scenario())


@pytest.mark.parametrize("broker_delay", [0.0, 0.2])
def test_requests_pipelined_behind_one_over_quota_wait_for_its_throttle(broker_delay: float) -> None:
    """A client that writes several requests at once: the Produce that goes over quota is the
    last one read. What came in the same write waits unread, as it would in a broker's socket,
    until that Produce has been answered and its throttle has passed."""
    script = Script()
    script.produce_delay = broker_delay

    async def scenario() -> None:
        async with running(script, quotas=PRODUCE_QUOTA) as h:
            freeze(h)
            c = await connect(h)
            loop = asyncio.get_running_loop()
            first, second, groups = produce(7, 4000), produce(7, 1040), list_groups()
            c.writer.write(c.frame(first) + c.frame(second) + c.frame(groups))
            await c.writer.drain()
            raw1, r1 = await c.recv(first)
            answered = loop.time()
            assert r1.throttle_time_ms == 0  # 400 B/s: under the quota
            raw2, r2 = await c.recv(second)
            second_answered = loop.time()
            assert r2.throttle_time_ms == kafka_throttle(5040 / 10, 500) == 80
            raw3, r3 = await c.recv(groups)
            assert [correlation_id(r) for r in (raw1, raw2, raw3)] == [1, 2, 3]
            assert script.api_keys == [0, 0, 16]
            # ListGroups reached the broker only after the second Produce's response (held by
            # the broker for broker_delay) and then its 80 ms throttle.
            assert script.arrivals[3] >= second_answered + 0.080 - 0.005
            assert second_answered - answered >= broker_delay - 0.005
            assert r3.throttle_time_ms == 0
            c.close()
    run(scenario())


def test_produce_acks0_over_quota_is_muted_without_a_response() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=PRODUCE_QUOTA) as h:
            freeze(h)
            c = await connect(h)
            started = asyncio.get_running_loop().time()
            request = produce(3, 5040, acks=0)
            frame = c.frame(request)
            c.writer.write(frame)
            await h.wait_for(lambda: broker_frames(h) == [frame])  # forwarded as sent
            corr = await c.send(list_groups())
            assert (await arrival(h, script, corr)) - started >= 0.080 - 0.001
            raw, response = await c.recv(list_groups())
            assert correlation_id(raw) == corr  # the acks=0 request got no response
            assert response.throttle_time_ms == 0
            assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="produce",
                          user="ANONYMOUS", client_id="c") == 1
            assert metric(h, "kafka_quota_proxy_throttle_time_ms_total", quota_type="produce",
                          user="ANONYMOUS", client_id="c") == 80
            c.close()
    run(scenario())


# --- Fetch --------------------------------------------------------------------------------------

FETCH_QUOTA = [{"client-id": "c", "consumer_byte_rate": 100}]
# Kafka caps max_bytes at Q*(N-1)*W = 1000 here; the proxy caps at Q*W (QuotaCharge._fetch_cap says why).
FETCH_CAP = 100 * 1


@pytest.mark.parametrize("version", [7, 11, 12, 16])
def test_fetch_over_quota_gets_the_throttled_empty_response(version: int) -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=FETCH_QUOTA) as h:
            freeze(h)
            c = await connect(h)
            q = h.proxy.engine.scope(scope(h))

            script.fetch_records = records_for_fetch_size(version, 500)
            request = fetch(version)
            sent = [c.frame(request)]
            c.writer.write(sent[0])
            _, first = await c.recv(request)
            assert first.throttle_time_ms == 0
            assert [len(p.records) for t in first.responses for p in t.partitions] == [
                len(script.fetch_records)]
            assert q.fetch.measure("ANONYMOUS", "c", START_MS) == 50.0

            script.fetch_records = records_for_fetch_size(version, 505)
            started = asyncio.get_running_loop().time()
            sent.append(c.frame(request))
            c.writer.write(sent[1])
            _, second = await c.recv(request)
            expected = kafka_throttle((500 + 505) / 10, 100)
            assert expected == 50
            assert (second.throttle_time_ms, second.error_code, second.session_id) == (expected, 0, SESSION)
            assert second.responses == []
            # The bytes the client never got are taken back.
            assert q.fetch.measure("ANONYMOUS", "c", START_MS) == 50.0
            assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="fetch",
                          user="ANONYMOUS", client_id="c") == 1

            # Each forwarded Fetch had max_bytes capped and nothing else changed (but for the
            # version, v16 and v17 being asked for as v15: see proxy/stages/fetch_as_v15.py).
            received = broker_frames(h)
            assert len(received) == 2
            for original, forwarded in zip(sent, received, strict=True):
                body_offset = len(original) - len(bytes(request.encode(version=version)))
                info = read_fetch_request(memoryview(forwarded), body_offset, version)
                at = info.max_bytes_at
                assert at is not None and info.max_bytes == FETCH_CAP
                assert read_fetch_request(memoryview(original), body_offset, version).max_bytes == 52_428_800
                if version >= 16:
                    original = original[:6] + b"\x00\x0f" + original[8:]
                assert forwarded[:at] + forwarded[at + 4:] == original[:at] + original[at + 4:]

            corr = await c.send(list_groups())  # muted for the 50 ms
            assert (await arrival(h, script, corr)) - started >= 0.050 - 0.001
            await c.recv(list_groups())
            c.close()
    run(scenario())


def test_fetch_under_the_cap_is_forwarded_unchanged() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=FETCH_QUOTA) as h:
            freeze(h)
            c = await connect(h)
            request = fetch(11, max_bytes=FETCH_CAP - 1)
            frame = c.frame(request)
            c.writer.write(frame)
            await c.recv(request)
            assert broker_frames(h) == [frame]
            c.close()
    run(scenario())


@pytest.mark.parametrize("version", [11, 15])
def test_follower_fetch_is_untouched(version: int) -> None:
    script = Script()
    script.fetch_records = b"r" * 50_000  # far over the quota

    async def scenario() -> None:
        async with running(script, quotas=FETCH_QUOTA) as h:
            freeze(h)
            c = await connect(h)
            request = fetch(version, replica_id=2)
            frame = c.frame(request)
            c.writer.write(frame)
            raw, response = await c.recv(request)
            assert broker_frames(h) == [frame]  # max_bytes not capped
            assert raw[8 + (version >= 12):] == fetch_response(version, 0, script.fetch_records)
            assert response.throttle_time_ms == 0
            q = h.proxy.engine.scope(scope(h))
            assert len(q.fetch.sensors) == 0 and len(q.request.sensors) == 0
            c.close()
    run(scenario())


def test_throttled_fetch_keeps_a_larger_broker_throttle() -> None:
    script = Script()
    script.fetch_throttle = 3000

    async def scenario() -> None:
        async with running(script, quotas=FETCH_QUOTA) as h:
            freeze(h)
            c = await connect(h)
            script.fetch_records = records_for_fetch_size(11, 1005)
            response = await c.call(fetch(11))
            assert response.responses == []
            assert response.throttle_time_ms == 3000  # max(broker's 3000, proxy's 50)
            assert metric(h, "kafka_quota_proxy_throttle_time_ms_total", quota_type="fetch",
                          user="ANONYMOUS", client_id="c") == 50
            c.close()
    run(scenario())


# --- request quota ------------------------------------------------------------------------------

def test_request_quota_throttles_slow_requests_for_at_most_one_window() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=[{"client-id": "c", "request_percentage": 2}]) as h:
            freeze(h)
            c = await connect(h)
            q = h.proxy.engine.scope(scope(h))
            versions = await c.call(api_versions())
            assert versions.throttle_time_ms == 0
            assert len(q.request.sensors) == 0  # ApiVersions is not charged

            # A fast request: its time (proxy and broker) is charged, well under 2 % of a thread.
            assert (await c.call(list_groups())).throttle_time_ms == 0
            charged = q.request.measure("ANONYMOUS", "c", START_MS)
            assert 0 < charged < 2

            # 300 ms of broker time: 30 %-s over a fresh 10 s window is 3 %, and
            # (3 - 2) / 2 * 10 s is far over the bound of one window.
            script.delay = 0.3
            response = await c.call(list_groups())
            assert response.throttle_time_ms == 1000
            assert q.request.measure("ANONYMOUS", "c", START_MS) >= 3.0
            assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="request",
                          user="ANONYMOUS", client_id="c") == 1
            c.close()
    run(scenario())


# --- controller mutations -----------------------------------------------------------------------

MUTATION_QUOTA = [{"client-id": "c", "controller_mutation_rate": 100}]  # burst 11 * 1 s * 100 = 1100
# 1000 partitions, 110 explicit assignments, and num_partitions -1 (the broker default, 1): 1111
BIG = [("t1", 1000, 0), ("t2", 0, 110), ("t3", -1, 0)]


def test_strict_create_topics_over_quota_is_refused_by_the_proxy() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=MUTATION_QUOTA) as h:
            now = freeze(h)
            c = await connect(h)
            q = h.proxy.engine.scope(scope(h))
            first = await c.call(create_topics(6, BIG))
            # The bucket was not below zero: accepted in full, forwarded, not throttled.
            assert first.throttle_time_ms == 0
            assert [t.error_code for t in first.topics] == [0, 0, 0]
            assert q.mutation.tokens("ANONYMOUS", "c", now[0]) == 1100 - 1111
            assert script.api_keys == [19]

            refused = await c.call(create_topics(6, [("x", 1, 0), ("y", 2, 0)]))
            assert refused.throttle_time_ms == 110  # round(11 / 100 * 1000)
            assert [(t.name, t.error_code, t.error_message) for t in refused.topics] == [
                ("x", 89, "The throttling quota has been exceeded."),
                ("y", 89, "The throttling quota has been exceeded.")]
            assert q.mutation.tokens("ANONYMOUS", "c", now[0]) == -11  # nothing recorded

            now[0] += 60  # 6 tokens back: 5 short
            again = await c.call(create_topics(7, [("x", 1, 0)]))
            assert again.throttle_time_ms == 50
            assert [t.error_code for t in again.topics] == [89]
            assert script.api_keys == [19]  # neither refusal reached the broker
            assert metric(h, "kafka_quota_proxy_throttled_requests_total",
                          quota_type="controller_mutation", user="ANONYMOUS", client_id="c") == 2
            c.close()
    run(scenario())


def test_permissive_create_topics_is_forwarded_and_throttled() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=MUTATION_QUOTA) as h:
            now = freeze(h)
            c = await connect(h)
            response = await c.call(create_topics(5, BIG))
            assert response.throttle_time_ms == 110
            assert [t.error_code for t in response.topics] == [0, 0, 0]
            assert script.api_keys == [19]
            q = h.proxy.engine.scope(scope(h))
            assert q.mutation.tokens("ANONYMOUS", "c", now[0]) == -11
            c.close()
    run(scenario())


def test_delete_topics_by_id_are_charged() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=MUTATION_QUOTA) as h:
            now = freeze(h)
            c = await connect(h)
            cls: Any = DeleteTopicsRequest
            request = cls(version=6, timeout_ms=1000, topics=[
                cls.DeleteTopicState(name=None, topic_id=uuid.UUID(int=i)) for i in range(1, 13)])
            response = await c.call(request)
            assert [t.error_code for t in response.responses] == [0] * 12
            # Partition counts by id are unknown to the proxy: one permit per topic, as for a name
            # it has not seen in a Metadata response.
            q = h.proxy.engine.scope(scope(h))
            assert q.mutation.tokens("ANONYMOUS", "c", now[0]) == 1100 - 12
            c.close()
    run(scenario())


# --- connections --------------------------------------------------------------------------------

def test_connections_over_the_ip_creation_rate_are_closed_unserved() -> None:
    async def scenario() -> None:
        # window_num 2: a fresh window is 1 s, so 10/s admits 10 connections at one instant.
        async with running(quota={"window_num": 2},
                           quotas=[{"ip": "<default>", "connection_creation_rate": 10}]) as h:
            freeze(h)
            clients: list[Client] = []
            for _ in range(12):  # one at a time, so the proxy admits them in this order
                clients.append(await connect(h))
                await h.wait_for(lambda: metric(
                    h, "kafka_quota_proxy_connections_accepted_total") == len(clients))
            for c in clients:
                await c.send(list_groups(0))
            served = [correlation_id(await read_frame(c.reader)) for c in clients[:10]]
            assert served == [1] * 10
            for c in clients[10:]:
                assert await is_closed(c.reader)
            assert len(h.broker.client_conns()) == 10
            assert len(broker_frames(h)) == 10
            # Each refusal: rate 11/s against 10/s -> (11-10)/10 * 1000 ms, and it is not counted.
            assert metric(h, "kafka_quota_proxy_connection_accept_throttle_time_ms_total",
                          ip="127.0.0.1") == 200
            assert h.proxy.engine.connections.measure("127.0.0.1", START_MS) == 10.0
            for c in clients:
                c.close()
    run(scenario())


def test_max_connections_per_ip_closes_the_excess_at_once() -> None:
    async def scenario() -> None:
        async with running(quota={"max_connections_per_ip": 2}) as h:
            first, second = await connect(h), await connect(h)
            third = await connect(h)
            await third.send(list_groups(0))
            assert await is_closed(third.reader)
            assert (await first.call(list_groups(0))) is not None
            assert (await second.call(list_groups(0))) is not None
            assert len(broker_frames(h)) == 2
            first.close()
            await h.wait_for(lambda: len(h.proxy.connections) == 1)
            fourth = await connect(h)  # a slot is free again
            assert (await fourth.call(list_groups(0))) is not None
            second.close()
            fourth.close()
    run(scenario())


# --- rollout switches ---------------------------------------------------------------------------

def test_observe_mode_counts_throttles_but_changes_nothing() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quota={"mode": "observe"}, quotas=[
                {"client-id": "c", "producer_byte_rate": 500, "consumer_byte_rate": 100}]) as h:
            freeze(h)
            c = await connect(h)
            for n in (1, 2):
                request = produce(7, 5040)
                corr = await c.send(request)
                raw, _ = await c.recv(request)
                assert raw == frame_response(corr, 0, produce_response(7, 0))
                assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="produce",
                              user="ANONYMOUS", client_id="c") == n
            script.fetch_records = b"r" * 5000
            request = fetch(11)
            frame = c.frame(request)
            c.writer.write(frame)
            raw, _ = await c.recv(request)
            assert raw[8:] == fetch_response(11, 0, script.fetch_records)
            assert broker_frames(h)[-1] == frame  # max_bytes not capped either
            assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="fetch",
                          user="ANONYMOUS", client_id="c") == 1
            (conn,) = h.proxy.connections
            assert conn._muted_until == 0.0  # never muted
            assert metric(h, "kafka_quota_proxy_quota_mode", mode="observe") == 1.0
            c.close()
    run(scenario())


@pytest.mark.parametrize("switch", [{"exempt_client_ids": ["c"]}, {"exempt_principals": ["ANONYMOUS"]}])
def test_exempt_clients_are_never_measured(switch: dict[str, Any]) -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quota=switch, quotas=[
                {"client-id": "<default>", "producer_byte_rate": 500, "request_percentage": 1}]) as h:
            freeze(h)
            c = await connect(h)
            for _ in range(3):
                assert (await c.call(produce(7, 20_000))).throttle_time_ms == 0
            q = h.proxy.engine.scope(scope(h))
            assert len(q.produce.sensors) == 0 and len(q.request.sensors) == 0
            assert q.produce.quota("ANONYMOUS", "c") == 500  # the quota exists, it just is not applied
            c.close()
    run(scenario())


def test_mode_off_measures_nothing() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quota={"mode": "off", "window_num": 2}, quotas=[
                *PRODUCE_QUOTA, {"ip": "<default>", "connection_creation_rate": 1}]) as h:
            freeze(h)
            clients = [await connect(h) for _ in range(3)]  # over 1/s: all served when off
            for c in clients:
                assert (await c.call(produce(7, 20_000))).throttle_time_ms == 0
            assert list(h.proxy.engine.scopes()) == []
            assert h.proxy.engine.connections.measure("127.0.0.1", START_MS) == 0.0
            assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="produce",
                          user="ANONYMOUS", client_id="c") is None
            for c in clients:
                c.close()
    run(scenario())


# --- DescribeClientQuotas / AlterClientQuotas ---------------------------------------------------

def alter(entries: list[tuple[list[tuple[str, str | None]], list[tuple[str, float, bool]]]],
          version: int = 1, validate_only: bool = False) -> Any:
    cls: Any = AlterClientQuotasRequest
    e = cls.EntryData
    return cls(version=version, validate_only=validate_only, entries=[
        e(entity=[e.EntityData(entity_type=t, entity_name=n) for t, n in entity],
          ops=[e.OpData(key=k, value=v, remove=r) for k, v, r in ops])
        for entity, ops in entries])


def describe(components: list[tuple[str, int, str | None]], strict: bool = True, version: int = 1) -> Any:
    cls: Any = DescribeClientQuotasRequest
    return cls(version=version, strict=strict, components=[
        cls.ComponentData(entity_type=t, match_type=m, match=n) for t, m, n in components])


def entries(response: Any) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
    assert response.error_code == 0, response.error_message
    return {tuple((e.entity_type, e.entity_name) for e in entry.entity):
            {v.key: v.value for v in entry.values} for entry in response.entries}


def alter_results(response: Any) -> list[tuple[int, str | None]]:
    return [(e.error_code, e.error_message) for e in response.entries]


def test_quota_apis_over_the_wire() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script) as h:
            freeze(h)
            c = await connect(h)
            versions = await c.call(api_versions())
            listed = {(a.api_key, a.min_version, a.max_version) for a in versions.api_keys}
            assert {(48, 0, 1), (49, 0, 1)} <= listed  # the fake broker lists neither

            # No quota yet: not throttled.
            assert (await c.call(produce(7, 5040))).throttle_time_ms == 0

            # kafka-configs --alter --entity-type clients --entity-name c --add-config ...
            result = await c.call(alter([([("client-id", "c")], [("producer_byte_rate", 500.0, False)])]))
            assert alter_results(result) == [(0, None)]
            # ... --entity-type clients --entity-default
            result = await c.call(alter([([("client-id", None)], [("consumer_byte_rate", 2000.0, False)])],
                                        version=0))
            assert alter_results(result) == [(0, None)]

            exact = await c.call(describe([("client-id", 0, "c")]))
            assert entries(exact) == {(("client-id", "c"),): {"producer_byte_rate": 500.0}}
            default = await c.call(describe([("client-id", 1, None)], version=0))
            assert entries(default) == {(("client-id", None),): {"consumer_byte_rate": 2000.0}}
            specified = await c.call(describe([("client-id", 2, None)]))
            assert entries(specified) == {(("client-id", "c"),): {"producer_byte_rate": 500.0},
                                          (("client-id", None),): {"consumer_byte_rate": 2000.0}}
            assert entries(await c.call(describe([("user", 2, None)]))) == {}

            # In force for the next request. The earlier 5040 B were not recorded (no
            # producer_byte_rate had ever been set), so this is a fresh window.
            assert (await c.call(produce(7, 5040))).throttle_time_ms == kafka_throttle(504, 500) == 80

            # Removing it lifts the throttle.
            result = await c.call(alter([([("client-id", "c")], [("producer_byte_rate", 0.0, True)])]))
            assert alter_results(result) == [(0, None)]
            assert (await c.call(produce(7, 50_000))).throttle_time_ms == 0

            # A user and client-id entity, described as kafka-configs --entity-type users
            # --entity-name alice --entity-type clients [--entity-default] sends it.
            result = await c.call(alter([
                ([("user", "alice"), ("client-id", None)], [("request_percentage", 25.0, False)]),
                ([("user", "alice")], [("producer_byte_rate", 1e6, False)])]))
            assert alter_results(result) == [(0, None), (0, None)]
            both = await c.call(describe([("user", 0, "alice"), ("client-id", 1, None)]))
            assert entries(both) == {(("user", "alice"), ("client-id", None)): {"request_percentage": 25.0}}
            any_client = await c.call(describe([("user", 0, "alice"), ("client-id", 2, None)]))
            assert entries(any_client) == entries(both)
            assert entries(await c.call(describe([("user", 0, "alice")]))) == {
                (("user", "alice"),): {"producer_byte_rate": 1e6}}

            # Kafka's validation, and a bad filter.
            result = await c.call(alter([([("client-id", "c")], [("producer_byte_rate", 10.5, False)]),
                                         ([("user", "")], [("producer_byte_rate", 10.0, False)])]))
            assert [code for code, _ in alter_results(result)] == [42, 42]
            bad = await c.call(describe([("other", 2, None)]))
            assert (bad.error_code, bad.entries) == (35, None)
            assert script.api_keys.count(48) == 0 and script.api_keys.count(49) == 0
            c.close()
    run(scenario())


def test_validate_only_changes_nothing() -> None:
    async def scenario() -> None:
        async with running() as h:
            c = await connect(h)
            result = await c.call(alter([([("user", "alice")], [("request_percentage", 25.0, False)])],
                                        validate_only=True))
            assert alter_results(result) == [(0, None)]
            assert h.proxy.quotas.entries() == {}
            c.close()
    run(scenario())


def test_alter_principals_refuses_everyone_else() -> None:
    async def scenario() -> None:
        async with running(quota={"alter_principals": ["admin"]},
                           quotas=PRODUCE_QUOTA) as h:
            c = await connect(h)
            request = alter([([("client-id", "c")], [("producer_byte_rate", 9e9, False)]),
                             ([("user", None)], [("consumer_byte_rate", 1.0, False)])])
            result = await c.call(request)
            assert alter_results(result) == [(31, "Cluster authorization failed.")] * 2
            assert [[(e.entity_type, e.entity_name) for e in entry.entity] for entry in result.entries] == [
                [("client-id", "c")], [("user", None)]]
            assert h.proxy.quotas.entries() == {QuotaEntity(client_id="c"): {
                QuotaKey.PRODUCER_BYTE_RATE: 500.0}}
            c.close()
    run(scenario())


@pytest.mark.parametrize(("api_key", "version", "name"), [
    (19, 6, "CreateTopicsRequest"), (20, 5, "DeleteTopicsRequest"), (37, 3, "CreatePartitionsRequest"),
    (48, 1, "DescribeClientQuotasRequest"), (49, 0, "AlterClientQuotasRequest")])
def test_a_body_that_does_not_decode_closes_that_connection(api_key: int, version: int, name: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with running(quotas=MUTATION_QUOTA) as h:
            c = await connect(h)
            c.writer.write(request_frame(api_key, version, 1, b"\x02\x05abc", client_id=b"c",
                                         flexible=codec()[api_key].is_flexible(version)))
            assert await is_closed(c.reader)
            assert h.errors("malformed") == 1
            assert broker_frames(h) == []
    with caplog.at_level("WARNING", logger="kafka_quota_proxy"):
        run(scenario())
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    assert f"(ANONYMOUS, bootstrap): malformed: cannot decode {name} v{version}: " in warning


# --- the config file, the state file, reload ----------------------------------------------------

def write_config(path: Path, broker: FakeBroker, listen: int, node: int, **extra: Any) -> None:
    values = {"upstream": [f"127.0.0.1:{broker.port}"], "listen": f"127.0.0.1:{listen}",
              "node_ports": {NODE_ID: node}, **extra}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(values), encoding="utf-8")
    tmp.replace(path)  # atomic, so the proxy's own watcher never sees half a file


@asynccontextmanager
async def from_file(path: Path, broker: FakeBroker) -> AsyncIterator[Harness]:
    settings = merge(load_file(path))
    assert settings.config_path == str(path)
    async with serving(settings, broker) as h:
        yield h


def effective(h: Harness) -> dict[QuotaEntity, dict[str, float]]:
    return {e: {k.value: v for k, v in values.items()} for e, values in h.proxy.quotas.entries().items()}


C, D, E = QuotaEntity(client_id="c"), QuotaEntity(client_id="d"), QuotaEntity(client_id="e")


def test_api_quotas_persist_and_layer_over_the_file(tmp_path: Path) -> None:
    script = Script()
    path = tmp_path / "proxy.yaml"
    state = tmp_path / "proxy.yaml.quota-state.json"

    async def scenario() -> None:
        broker = await FakeBroker(script).start()
        listen, node = free_port(), free_port()
        write_config(path, broker, listen, node, quotas=[
            {"client-id": "c", "producer_byte_rate": 500, "consumer_byte_rate": 4000},
            {"client-id": "d", "producer_byte_rate": 700}])
        async with from_file(path, broker) as h:
            assert effective(h) == {C: {"producer_byte_rate": 500, "consumer_byte_rate": 4000},
                                    D: {"producer_byte_rate": 700}}
            assert not state.exists()
            c = await connect(h)
            result = await c.call(alter([
                ([("client-id", "c")], [("producer_byte_rate", 800.0, False),
                                        ("consumer_byte_rate", 0.0, True)]),
                ([("client-id", "e")], [("producer_byte_rate", 900.0, False)])]))
            assert alter_results(result) == [(0, None), (0, None)]
            assert effective(h) == {C: {"producer_byte_rate": 800}, D: {"producer_byte_rate": 700},
                                    E: {"producer_byte_rate": 900}}
            saved = json.loads(state.read_text())
            assert saved == {"version": 1, "entities": [
                {"entity": {"client-id": "c"}, "values": {"producer_byte_rate": 800.0},
                 "removed": ["consumer_byte_rate"]},
                {"entity": {"client-id": "e"}, "values": {"producer_byte_rate": 900.0}, "removed": []}]}
            c.close()

        # A new proxy from the same file: the API's quotas are in force again.
        async with from_file(path, broker) as h:
            freeze(h)
            assert effective(h) == {C: {"producer_byte_rate": 800}, D: {"producer_byte_rate": 700},
                                    E: {"producer_byte_rate": 900}}
            c = await connect(h)
            size = 8080  # 808 B/s against 800
            assert (await c.call(produce(7, size))).throttle_time_ms == kafka_throttle(808, 800) == 100
            described = await c.call(describe([], strict=False))
            assert entries(described) == {(("client-id", "c"),): {"producer_byte_rate": 800.0},
                                          (("client-id", "d"),): {"producer_byte_rate": 700.0},
                                          (("client-id", "e"),): {"producer_byte_rate": 900.0}}

            # The file changes only what the API never touched.
            write_config(path, broker, listen, node, quotas=[
                {"client-id": "c", "producer_byte_rate": 100, "consumer_byte_rate": 5000},
                {"client-id": "d", "producer_byte_rate": 300}])
            assert reload_config(str(path), h.proxy)
            assert effective(h) == {C: {"producer_byte_rate": 800}, D: {"producer_byte_rate": 300},
                                    E: {"producer_byte_rate": 900}}
            c.close()
        await broker.stop()
    run(scenario())


def test_reload_applies_new_quotas_and_refuses_a_bad_file(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    script = Script()
    path = tmp_path / "proxy.yaml"

    async def scenario() -> None:
        broker = await FakeBroker(script).start()
        listen, node = free_port(), free_port()
        write_config(path, broker, listen, node, quotas=PRODUCE_QUOTA)
        async with from_file(path, broker) as h:
            now = freeze(h)
            c = await connect(h)
            assert (await c.call(produce(7, 5040))).throttle_time_ms == 80

            write_config(path, broker, listen, node, quotas=[{"client-id": "c", "producer_byte_rate": 1000}])
            assert reload_config(str(path), h.proxy)
            assert effective(h) == {C: {"producer_byte_rate": 1000}}
            now[0] += 20_000  # past the window: a fresh measurement
            assert (await c.call(produce(7, 10_080))).throttle_time_ms == kafka_throttle(1008, 1000) == 80

            for bad, problem in (("quotas: [{client-id: c, producer_byte_rate: 10.5}]\n", "quotas[0]"),
                                 ("quotas: [{client-id: c, producer_byte_rat: 10}]\n", "unknown key"),
                                 ("quotas: [\n", "not valid YAML")):
                path.write_text(f"upstream: 127.0.0.1:{broker.port}\n" + bad, encoding="utf-8")
                caplog.clear()  # the proxy's own watcher cannot run until the next await
                assert not reload_config(str(path), h.proxy)
                (refused,) = [r.getMessage() for r in caplog.records]
                assert refused.startswith("config reload refused, the last good quotas stay in force")
                assert problem in refused
                assert effective(h) == {C: {"producer_byte_rate": 1000}}

            # The quota switches apply at run time too.
            write_config(path, broker, listen, node, quota={"mode": "observe"}, quotas=PRODUCE_QUOTA)
            assert reload_config(str(path), h.proxy)
            assert h.proxy.engine.settings.mode == "observe"
            assert effective(h) == {C: {"producer_byte_rate": 500}}
            # On the connection already charged (it keeps its way to its sensor), each switch
            # holds from the next request on.
            now[0] += 20_000
            assert (await c.call(produce(7, 10_080))).throttle_time_ms == 0  # observed only
            # (Enforced last: a throttled client is not read again until its throttle is over.)
            for mode, expected in (("off", 0), ("observe", 0), ("enforce", kafka_throttle(1008, 500))):
                write_config(path, broker, listen, node, quota={"mode": mode}, quotas=PRODUCE_QUOTA)
                assert reload_config(str(path), h.proxy)
                now[0] += 20_000
                assert (await c.call(produce(7, 10_080))).throttle_time_ms == expected, mode
            c.close()
        await broker.stop()
    with caplog.at_level("ERROR", logger="kafka_quota_proxy"):
        run(scenario())


def test_reload_reports_what_needs_a_restart(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "proxy.yaml"

    async def scenario() -> None:
        broker = await FakeBroker().start()
        listen, node = free_port(), free_port()
        write_config(path, broker, listen, node, quotas=PRODUCE_QUOTA)
        async with from_file(path, broker) as h:
            write_config(path, broker, listen, node, quotas=PRODUCE_QUOTA, quota={
                "window_num": 5, "state_file": str(tmp_path / "elsewhere.json"), "mode": "observe"})
            caplog.clear()  # the proxy's own watcher cannot run until the next await
            assert reload_config(str(path), h.proxy)
            warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert warnings == ["config reload: quota.window_num, quota.state_file changed; "
                                "restart the proxy to apply"]
            settings = h.proxy.engine.settings
            assert (settings.window_num, settings.state_file, settings.mode) == (11, None, "observe")
            assert h.proxy.quota_control.state_path == tmp_path / "proxy.yaml.quota-state.json"
        await broker.stop()
    with caplog.at_level("WARNING", logger="kafka_quota_proxy"):
        run(scenario())


# --- metrics ------------------------------------------------------------------------------------

def test_quota_metrics_after_traffic() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=PRODUCE_QUOTA) as h:
            freeze(h)
            c = await connect(h)
            assert (await c.call(produce(7, 5040))).throttle_time_ms == 80
            labels = {"scope": scope(h), "user": "", "client_id": "c"}
            assert metric(h, "kafka_quota_proxy_byte_rate", quota_type="producer_byte_rate",
                          **labels) == 504.0
            assert metric(h, "kafka_quota_proxy_quota_limit", quota_type="producer_byte_rate",
                          **labels) == 500.0
            assert metric(h, "kafka_quota_proxy_throttle_time_ms_total", quota_type="produce",
                          user="ANONYMOUS", client_id="c") == 80
            assert metric(h, "kafka_quota_proxy_configured_quota", quota_type="producer_byte_rate",
                          user="", client_id="c", ip="") == 500.0
            assert metric(h, "kafka_quota_proxy_quota_entities_dropped_total") == 0
            c.close()
    run(scenario())


def test_capped_tracker_counts_dropped_entities() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quota={"max_tracked_entities": 1},
                           quotas=[{"client-id": "<default>", "producer_byte_rate": 1_000_000}]) as h:
            freeze(h)
            c = await connect(h)
            for n, client_id in enumerate(("a", "b", "z", "a")):
                assert (await c.call(produce(7), client_id=client_id)).throttle_time_ms == 0
                assert metric(h, "kafka_quota_proxy_quota_entities_dropped_total") == [0, 1, 2, 2][n]
            q = h.proxy.engine.scope(scope(h))
            assert [key for key, _ in q.produce.sensors.entries(START_MS)] == [("Produce", "", "a")]
            c.close()
    run(scenario())
