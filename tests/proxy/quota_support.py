"""What the in-process quota tests share: a scripted broker, a client that speaks raw Kafka, the
requests they send, and the fake clock's start. The broker clock only drives measurement; muting a
throttled client uses the event loop's real time, so those checks use small throttles and only
lower bounds."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable
from typing import Any

from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest, DescribeClientQuotasRequest
from kafka.protocol.admin.topics import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.headers import RequestHeader
from kafka_quota_proxy.protocol.produce import produce_acks
from tests.proxy.conftest import (
    Harness,
    correlation_id,
    read_frame,
    request_frame,
)
from tests.support.fake_broker import NODE_ID, BrokerConn, list_groups_v0_body

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
        # ShareFetch (78) and ShareAcknowledge (79) answers: records, top-level error, and the
        # (node id, host, port) NodeEndpoints both carry.
        self.share_records = b""
        self.share_error = 0
        self.share_throttle = 0
        self.node_endpoints: list[tuple[int, str, int]] = []
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
        if key == 78:
            return share_fetch_response(v, self.share_throttle, self.share_records, self.share_error,
                                        self.node_endpoints)
        if key == 79:
            return share_acknowledge_response(v, self.node_endpoints)
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


LOCK_MS = 30_000  # the AcquisitionLockTimeoutMs the scripted broker sends (v1+)


def share_fetch_response(version: int, throttle_ms: int, records: bytes, error_code: int = 0,
                         node_endpoints: list[tuple[int, str, int]] | None = None) -> bytes:
    cls: Any = codec()[78].response
    topic = cls.ShareFetchableTopicResponse
    part = topic.PartitionData
    return bytes(cls(version=version, throttle_time_ms=throttle_ms, error_code=error_code,
                     error_message=None, acquisition_lock_timeout_ms=LOCK_MS, responses=[topic(
                         topic_id=uuid.UUID(int=7), partitions=[part(
                             partition_index=0, error_code=0, error_message=None,
                             acknowledge_error_code=0, acknowledge_error_message=None,
                             current_leader=part.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1),
                             records=records, acquired_records=[part.AcquiredRecords(
                                 first_offset=0, last_offset=9, delivery_count=1)])])],
                     node_endpoints=_node_endpoints(cls, node_endpoints)).encode(version=version))


def share_acknowledge_response(version: int, node_endpoints: list[tuple[int, str, int]]) -> bytes:
    cls: Any = codec()[79].response
    topic = cls.ShareAcknowledgeTopicResponse
    part = topic.PartitionData
    return bytes(cls(version=version, throttle_time_ms=0, error_code=0, error_message=None,
                     acquisition_lock_timeout_ms=LOCK_MS, responses=[topic(
                         topic_id=uuid.UUID(int=7), partitions=[part(
                             partition_index=0, error_code=6, error_message=None,
                             current_leader=part.LeaderIdAndEpoch(leader_id=NODE_ID, leader_epoch=3))])],
                     node_endpoints=_node_endpoints(cls, node_endpoints)).encode(version=version))


def _node_endpoints(cls: Any, nodes: list[tuple[int, str, int]] | None) -> list[Any]:
    return [cls.NodeEndpoint(node_id=n, host=host, port=port, rack=None) for n, host, port in nodes or ()]


def records_for_share_fetch_size(version: int, size: int) -> bytes:
    """Records that make the ShareFetch response's quota size (body + 4, Kafka's
    ShareFetchResponse.sizeOf) exactly `size`."""
    return _records_for_size(lambda records: share_fetch_response(version, 0, records), size)


def records_for_fetch_size(version: int, size: int) -> bytes:
    """Records that make the Fetch response's quota size (body + 4, Kafka's sizeOf) exactly `size`."""
    return _records_for_size(lambda records: fetch_response(version, 0, records), size)


def _records_for_size(response: Callable[[bytes], bytes], size: int) -> bytes:
    n = 0
    while True:
        got = len(response(b"r" * n)) + 4
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


def share_fetch(version: int = 1, max_bytes: int = 52_428_800, max_wait_ms: int = 0) -> Any:
    cls: Any = codec()[78].request
    topic = cls.FetchTopic
    return cls(version=version, group_id="g", member_id="m" * 22, share_session_epoch=0,
               max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes, max_records=500,
               batch_size=500, share_acquire_mode=0, is_renew_ack=False, topics=[topic(
                   topic_id=uuid.UUID(int=7), partitions=[topic.FetchPartition(
                       partition_index=0, partition_max_bytes=1_048_576, acknowledgement_batches=[])])],
               forgotten_topics_data=[])


def share_acknowledge(version: int = 1) -> Any:
    cls: Any = codec()[79].request
    topic = cls.AcknowledgeTopic
    part = topic.AcknowledgePartition
    return cls(version=version, group_id="g", member_id="m" * 22, share_session_epoch=1,
               is_renew_ack=False, topics=[topic(topic_id=uuid.UUID(int=7), partitions=[part(
                   partition_index=0, acknowledgement_batches=[part.AcknowledgementBatch(
                       first_offset=0, last_offset=9, acknowledge_types=[1])])])])


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


# --- what several test modules configure and send ---

PRODUCE_QUOTA = [{"client-id": "c", "producer_byte_rate": 500}]
MUTATION_QUOTA = [{"client-id": "c", "controller_mutation_rate": 100}]  # burst 11 * 1 s * 100 = 1100


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
