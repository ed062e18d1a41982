"""Requests in flight at SIGTERM, made certain: one raw connection pipelines a long-poll Fetch and
then `n` Produce requests in one write. The broker handles a connection's requests one at a time,
so the Produce requests wait behind the Fetch at the broker while the signal arrives; the proxy
must still answer every one of them before it closes the connection.

With `quota`, the client is over its producer_byte_rate as it arrives: the proxy forwards the
first Produce that goes over, then reads nothing more from the client until its throttle ends.
Those frames are never forwarded, so at SIGTERM they must be neither answered nor written.

`slow_reader_then_sigterm` is the case that once lost answers: a client that pipelined past
`max_inflight_requests` (so requests wait unread in the proxy's socket) and reads its large
responses slowly. The proxy answered everything, then closed a socket with unread input, and
the kernel reset the connection, dropping the answers it had not yet sent."""

from __future__ import annotations

import socket
import struct
import time
import uuid
from dataclasses import dataclass, field

from confluent_kafka import Producer
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from devkit.processes import LOOPBACK, ProxyProcess
from devkit.proxy_faults.workload import create_topic, read_from_broker
from devkit.tansu import Broker

CLIENT_ID = "in-flight"
FETCH_CORRELATION_ID = 1_000_000
PRODUCE_VERSION = 7
LONG_POLL_MS = 2500


@dataclass
class InFlightResult:
    sent: int  # Produce requests pipelined
    fetch_answered: bool = False
    answers: list[tuple[int, int, int]] = field(default_factory=list)  # correlation id, error, throttle ms
    closed_cleanly: bool = False  # the proxy closed the connection (FIN) after its last answer
    at_broker: list[int] = field(default_factory=list)  # the request numbers whose record is there
    exit_status: int | None = None
    exit_seconds: float = 0.0  # SIGTERM to the proxy's exit
    log: str = ""


def _record(value: bytes, size: int) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=2**31 - 1)
    builder.append(timestamp=None, key=None, value=value + b" " * max(0, size - len(value)), headers=[])
    builder.close()
    return bytes(builder.buffer())


def _produce(topic: str, i: int, size: int) -> bytes:
    data = ProduceRequest.TopicProduceData
    req = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[data(
        name=topic, partition_data=[data.PartitionProduceData(index=0, records=_record(b"%d" % i, size))])])
    req.with_header(correlation_id=i, client_id=CLIENT_ID)
    return bytes(req.encode(version=PRODUCE_VERSION, header=True, framed=True))


def _long_poll(topic: str) -> bytes:
    fetch = FetchRequest.FetchTopic
    req = FetchRequest(replica_id=-1, max_wait_ms=LONG_POLL_MS, min_bytes=1, max_bytes=1024,
                       isolation_level=0, topics=[fetch(topic=topic, partitions=[fetch.FetchPartition(
                           partition=0, fetch_offset=0, partition_max_bytes=1024,
                           log_start_offset=-1, current_leader_epoch=-1)])])
    req.with_header(correlation_id=FETCH_CORRELATION_ID, client_id=CLIENT_ID)
    return bytes(req.encode(version=4, header=True, framed=True))


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Up to `n` bytes, fewer only at the end of the stream (ConnectionResetError on a reset)."""
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(min(n - len(data), 65536))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _read_answers(sock: socket.socket, result: InFlightResult) -> None:
    sock.settimeout(20)
    while True:
        try:
            head = recv_exactly(sock, 4)
            body = recv_exactly(sock, struct.unpack(">i", head)[0]) if len(head) == 4 else b""
        except ConnectionResetError:
            return
        if len(head) < 4:
            result.closed_cleanly = head == b""
            return
        correlation_id = struct.unpack_from(">i", body)[0]
        if correlation_id == FETCH_CORRELATION_ID:
            result.fetch_answered = True
            continue
        response = ProduceResponse.decode(body[4:], version=PRODUCE_VERSION)
        error = response.responses[0].partition_responses[0].error_code
        result.answers.append((correlation_id, error, response.throttle_time_ms))


def pipelined_then_sigterm(broker: Broker, node_id: int, n: int = 20, record_bytes: int = 100,
                           quota: int | None = None) -> InFlightResult:
    """Pipeline a long poll and `n` Produce requests, SIGTERM the proxy half a second later,
    read every answer until the proxy closes the connection, then look at the broker."""
    topic, idle = f"pf-inflight-{uuid.uuid4().hex[:8]}", f"pf-idle-{uuid.uuid4().hex[:8]}"
    create_topic(broker.address, topic, 1)
    create_topic(broker.address, idle, 1)
    quotas = [{"client-id": CLIENT_ID, "producer_byte_rate": quota}] if quota is not None else []
    proxy = ProxyProcess(broker.address, node_id, extra_config={"quotas": quotas}).start()
    result = InFlightResult(sent=n)
    try:
        assert proxy.proc is not None
        with socket.create_connection((LOOPBACK, proxy.node_port)) as sock:
            sock.sendall(_long_poll(idle) + b"".join(_produce(topic, i, record_bytes) for i in range(n)))
            time.sleep(0.5)  # the proxy has read and forwarded them; the broker holds the long poll
            signalled = time.monotonic()
            proxy.proc.terminate()
            _read_answers(sock, result)
        # Closed as a Kafka client closes on reading the end: the proxy then exits at once.
        result.exit_status = proxy.proc.wait(60)
        result.exit_seconds = time.monotonic() - signalled
    finally:
        proxy.stop()
        result.log = proxy.log_text()
    records = read_from_broker(broker.address, topic, 1)
    result.at_broker = [value for _, value in records[0]]
    return result


@dataclass
class SlowReaderResult:
    sent: int  # Fetch requests pipelined (then one more request the proxy never reads)
    answered: list[int] = field(default_factory=list)  # correlation ids of whole responses read
    ending: str = ""  # "end of stream" (the proxy's FIN), "reset", or "cut short"
    exit_status: int | None = None


def _fetch(topic: str, correlation_id: int) -> bytes:
    fetch = FetchRequest.FetchTopic
    req = FetchRequest(replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=1_048_576,
                       isolation_level=0, topics=[fetch(topic=topic, partitions=[fetch.FetchPartition(
                           partition=0, fetch_offset=0, partition_max_bytes=1_048_576,
                           log_start_offset=-1, current_leader_epoch=-1)])])
    req.with_header(correlation_id=correlation_id, client_id=CLIENT_ID)
    return bytes(req.encode(version=4, header=True, framed=True))


def slow_reader_then_sigterm(broker: Broker, node_id: int, n: int = 20) -> SlowReaderResult:
    """`n` Fetch requests of about 1 MiB answers each, pipelined; one more request once the proxy
    has stopped reading (it has `n` in flight); SIGTERM; only then read, slowly, to the end."""
    topic = f"pf-big-{uuid.uuid4().hex[:8]}"
    create_topic(broker.address, topic, 1)
    producer = Producer({"bootstrap.servers": broker.address, "linger.ms": 20})
    for _ in range(20):
        producer.produce(topic, value=bytes(100_000))
    producer.flush(60)
    proxy = ProxyProcess(broker.address, node_id).start()
    result = SlowReaderResult(sent=n)
    try:
        assert proxy.proc is not None
        with socket.create_connection((LOOPBACK, proxy.node_port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            sock.sendall(b"".join(_fetch(topic, i) for i in range(n)))
            time.sleep(1.0)
            sock.sendall(_fetch(topic, n))  # waits unread: the proxy is at its in-flight bound
            time.sleep(0.5)
            proxy.proc.terminate()
            time.sleep(1.0)
            sock.settimeout(20)
            try:
                while True:
                    head = recv_exactly(sock, 4)
                    if not head:
                        result.ending = "end of stream"
                        break
                    body = recv_exactly(sock, struct.unpack(">i", head)[0]) if len(head) == 4 else b""
                    if len(head) < 4 or len(body) < struct.unpack(">i", head)[0]:
                        result.ending = "cut short"
                        break
                    result.answered.append(struct.unpack_from(">i", body)[0])
            except ConnectionResetError:
                result.ending = "reset"
        result.exit_status = proxy.proc.wait(60)
    finally:
        proxy.stop()
    return result
