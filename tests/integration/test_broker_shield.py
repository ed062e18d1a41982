"""The input that killed Tansu in the whole-proxy fuzz, through the proxy to a Tansu of its own
(docs/reliability.md, "Whole-proxy fuzz"): neither the request nor its well-formed twin reaches
Tansu, and Tansu answers Metadata for all topics afterwards, which is where it died."""

from __future__ import annotations

import socket
import struct

import pytest
from confluent_kafka.admin import AdminClient
from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse

from devkit.processes import LOOPBACK, ProxyProcess
from devkit.tansu import Broker
from kafka_quota_proxy.protocol.headers import frame_request
from tests.support.frames import FUZZ_CREATE_TOPICS

pytestmark = pytest.mark.integration


def round_trip(port: int, frame: bytes) -> bytes:
    """The response to `frame` (b"" if the connection is closed instead)."""
    with socket.create_connection((LOOPBACK, port), timeout=10) as sock:
        sock.sendall(frame)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            got = sock.recv(65536)
            if not got:
                return b""
            data += got
        return data


def test_the_fuzz_request_and_its_twin_never_reach_tansu() -> None:
    broker = Broker().start()  # its own: a failure here kills it
    proxy = ProxyProcess(broker.address, broker.node_id())
    try:
        proxy.start()
        assert round_trip(proxy.port, FUZZ_CREATE_TOPICS) == b""  # closed: malformed
        topic = CreateTopicsRequest.CreatableTopic(name="billion", num_partitions=825360385,
                                                   replication_factor=1, assignments=[], configs=[])
        request = CreateTopicsRequest(topics=[topic], timeout_ms=1000, validate_only=False)
        raw = round_trip(proxy.port, frame_request(request, 7, 2, "shield"))
        answer = CreateTopicsResponse.decode(raw[9:], version=7)  # size, correlation id, header tags
        assert [(t.name, t.error_code) for t in answer.topics] == [("billion", 44)]
        metadata = AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=10)
        assert "billion" not in metadata.topics and metadata.brokers
        assert not broker.stopped, broker.log_tail()
        assert proxy.metric("kafka_quota_proxy_protocol_errors_total", kind="malformed") == 1
    finally:
        proxy.stop()
        broker.stop()
