"""The load generator's wire: Kafka requests encoded once, replayed from a ring with fresh
correlation ids, the Metadata lookup of partition leaders, and the checks of sampled responses.

bench.load drives these at a target; bench.throughput uses them to prepare its topics.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from kafka_quota_proxy.protocol.headers import frame_request, response_body_offset

PRODUCE_VERSION = 9  # the newest that still names topics (v13 uses topic ids); flexible
FETCH_VERSION = 12  # likewise for Fetch
METADATA_VERSION = 12
FETCH_MAX_WAIT_MS = 500
API_VERSIONS_VERSION = 3  # what librdkafka and the Java client send first
CORRELATION_ID_AT = 8  # in a framed request: size, api_key, api_version, then the correlation id


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# -- encoding, once -----------------------------------------------------------------------------


def record_batch(records: int, record_bytes: int) -> bytes:
    """One uncompressed v2 record batch of `records` values of `record_bytes` random bytes."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=2**31 - 1)
    value = os.urandom(record_bytes)
    for _ in range(records):
        builder.append(timestamp=None, key=None, value=value, headers=[])
    builder.close()
    return bytes(builder.buffer())


def produce_frame(topic: str, partition: int, batch: bytes, client_id: str, acks: int = 1) -> bytes:
    t = ProduceRequest.TopicProduceData
    req = ProduceRequest(transactional_id=None, acks=acks, timeout_ms=30_000, topic_data=[
        t(name=topic, partition_data=[t.PartitionProduceData(index=partition, records=batch)])])
    return frame_request(req, PRODUCE_VERSION, 0, client_id)


def fetch_frame(topic: str, partition: int, offset: int, max_bytes: int, client_id: str) -> bytes:
    t = FetchRequest.FetchTopic
    # The data is there, so a broker answers at once; but Tansu answers max_wait_ms 0 with no data
    # at all, and a short wait with none now and then when it is busy. So: a long wait, never used.
    wanted = t.FetchPartition(partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                              log_start_offset=-1, partition_max_bytes=max_bytes)
    req = FetchRequest(replica_id=-1, max_wait_ms=FETCH_MAX_WAIT_MS, min_bytes=1, max_bytes=max_bytes,
                       isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=[],
                       rack_id="", topics=[t(topic=topic, partitions=[wanted])])
    return frame_request(req, FETCH_VERSION, 0, client_id)


def metadata_frame(topic: str, client_id: str) -> bytes:
    req = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                          allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    return frame_request(req, METADATA_VERSION, 0, client_id)


def api_versions_frame(client_id: str) -> bytes:
    req = ApiVersionsRequest(client_software_name="bench-load", client_software_version="1")
    return frame_request(req, API_VERSIONS_VERSION, 0, client_id)


@dataclass(slots=True)
class Ring:
    """`count` requests of `size` bytes each, back to back; request i has correlation id i.

    A connection sends request n % count as its n-th request, so with fewer than `count` in
    flight every correlation id in flight is distinct."""

    data: memoryview
    size: int
    count: int

    @classmethod
    def of(cls, frames: Sequence[bytes], count: int) -> Ring:
        size = len(frames[0])
        if any(len(f) != size for f in frames):
            raise ValueError("every request in a ring must have the same size")
        buf = bytearray(size * count)
        for i in range(count):
            at = i * size
            buf[at:at + size] = frames[i % len(frames)]
            buf[at + CORRELATION_ID_AT:at + CORRELATION_ID_AT + 4] = i.to_bytes(4, "big")
        return cls(memoryview(buf), size, count)

    def take(self, first: int, n: int) -> list[memoryview]:
        """Requests first, first+1, ..., first+n-1 (wrapping), as at most a few slices."""
        out = []
        while n > 0:
            slot = first % self.count
            run = min(n, self.count - slot)
            out.append(self.data[slot * self.size:(slot + run) * self.size])
            first += run
            n -= run
        return out

    def frame(self, n: int) -> memoryview:
        return self.take(n, 1)[0]


# -- bootstrap ----------------------------------------------------------------------------------


def round_trip(sock: socket.socket, frame: bytes | memoryview) -> bytes:
    """Send one framed request on a blocking socket and read its whole response frame."""
    sock.sendall(frame)
    return read_frame(sock)


def read_frame(sock: socket.socket) -> bytes:
    head = _read_exactly(sock, 4)
    return head + _read_exactly(sock, int.from_bytes(head, "big"))


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("connection closed mid-response")
        got += k
    return bytes(buf)


def leaders(bootstrap: str, topic: str, via_bootstrap: bool = False) -> dict[int, tuple[str, int]]:
    """partition -> (host, port) of its leader, as Metadata on the bootstrap address tells it
    (`via_bootstrap`: the bootstrap address itself, for a single broker behind a plain relay)."""
    req = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                          allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    with socket.create_connection(host_port(bootstrap), timeout=10) as sock:
        frame = round_trip(sock, frame_request(req, METADATA_VERSION, 1, "bench-load"))
    msg = MetadataResponse.decode(frame[response_body_offset(frame, 1):], version=METADATA_VERSION)
    brokers = {b.node_id: (b.host, b.port) for b in msg.brokers}
    for t in msg.topics:
        if t.name == topic:
            if t.error_code:
                raise RuntimeError(f"Metadata for {topic}: error {t.error_code}")
            if via_bootstrap:
                return {p.partition_index: host_port(bootstrap) for p in t.partitions}
            return {p.partition_index: brokers[p.leader_id] for p in t.partitions}
    raise RuntimeError(f"Metadata has no topic {topic}")


# -- response checks ----------------------------------------------------------------------------


def check_produce(frame: bytes, correlation_id: int) -> str | None:
    """None if `frame` is a successful Produce response to `correlation_id`, else what is wrong."""
    if int.from_bytes(frame[4:8], "big") != correlation_id:
        return f"correlation id {int.from_bytes(frame[4:8], 'big')}, expected {correlation_id}"
    msg = ProduceResponse.decode(frame[response_body_offset(frame, 1):], version=PRODUCE_VERSION)
    for topic in msg.responses:
        for p in topic.partition_responses:
            if p.error_code:
                return f"produce error {p.error_code} on {topic.name}[{p.index}]"
    return None


def check_metadata(frame: bytes, correlation_id: int) -> str | None:
    if int.from_bytes(frame[4:8], "big") != correlation_id:
        return f"correlation id {int.from_bytes(frame[4:8], 'big')}, expected {correlation_id}"
    msg = MetadataResponse.decode(frame[response_body_offset(frame, 1):], version=METADATA_VERSION)
    if not msg.topics or msg.topics[0].error_code:
        return f"metadata error for the topic: {msg.topics}"
    return None


def check_fetch(frame: bytes, correlation_id: int) -> str | None:
    if int.from_bytes(frame[4:8], "big") != correlation_id:
        return f"correlation id {int.from_bytes(frame[4:8], 'big')}, expected {correlation_id}"
    msg = FetchResponse.decode(frame[response_body_offset(frame, 1):], version=FETCH_VERSION)
    if msg.error_code:
        return f"fetch error {msg.error_code}"
    if not msg.responses:
        return "fetch returned no partitions"
    for topic in msg.responses:
        for p in topic.partitions:
            if p.error_code:
                return f"fetch error {p.error_code} on {topic.topic}[{p.partition_index}]"
            if not p.records:
                return f"fetch returned no records for {topic.topic}[{p.partition_index}]"
    return None


Check = Callable[[bytes, int], "str | None"]
