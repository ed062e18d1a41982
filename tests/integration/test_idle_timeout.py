"""connections_max_idle_ms in front of Tansu: a request the broker holds for longer than the idle
timeout (a long-poll Fetch) is answered on its connection, which is closed as idle only after."""

from __future__ import annotations

import socket
import struct
import time

from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer.fetch import FetchRequest

from bench.wire import read_frame
from devkit.processes import LOOPBACK, ProxyProcess
from devkit.tansu import Broker
from kafka_quota_proxy.protocol.headers import frame_request

IDLE_MS = 1000
WAIT_MS = 3000  # three idle timeouts


def long_poll(topic: str, correlation_id: int) -> bytes:
    """A Fetch v12 at the end of an empty partition: the broker holds it for max_wait_ms."""
    t = FetchRequest.FetchTopic
    wanted = t.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                              partition_max_bytes=1 << 20)
    req = FetchRequest(replica_id=-1, max_wait_ms=WAIT_MS, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                       session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                       topics=[t(topic=topic, partitions=[wanted])])
    return frame_request(req, 12, correlation_id, "idle-test")


def test_a_fetch_held_by_the_broker_is_not_cut_as_idle(broker: Broker, broker_node_id: int,
                                                        topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.address})
    for f in admin.create_topics([NewTopic(topic_name, 1, 1)]).values():
        f.result(30)
    proxy = ProxyProcess(broker.address, broker_node_id, extra_config={
        "connections_max_idle_ms": IDLE_MS, "log_level": "DEBUG"}).start()
    try:
        with socket.create_connection((LOOPBACK, proxy.port), timeout=30) as sock:
            for correlation_id in (1, 2):  # twice: the second after the first's answer
                sent = time.monotonic()
                sock.sendall(long_poll(topic_name, correlation_id))
                answer = read_frame(sock)
                held = time.monotonic() - sent
                assert struct.unpack_from(">i", answer, 4)[0] == correlation_id
                assert held >= WAIT_MS / 1000 - 0.5, held  # Tansu held it; the proxy did not cut it
            quiet_since = time.monotonic()
            assert sock.recv(1) == b""  # then idle: the proxy ends the connection
            closed_after = time.monotonic() - quiet_since
        assert IDLE_MS / 1000 <= closed_after < IDLE_MS / 1000 + 4, closed_after
        assert proxy.metric("kafka_quota_proxy_idle_connections_closed_total") == 1
        assert "no byte read or written for 1000 ms (connections_max_idle_ms)" in proxy.log_text()
    finally:
        proxy.stop()
