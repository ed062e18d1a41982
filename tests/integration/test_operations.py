"""Operating the proxy process: bad clients beside good ones, SIGTERM, a broker that is not
there yet, metrics, and the command line."""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer.fetch import FetchRequest

from devkit.processes import ProxyProcess, free_port, wait_for_port
from devkit.tansu import Broker

pytestmark = pytest.mark.integration

BAD_INPUTS = [
    b"GET / HTTP/1.1\r\nHost: kafka\r\n\r\n",
    struct.pack(">i", -1) + b"x",
    struct.pack(">i", 200_000_000),
    struct.pack(">i", 6) + b"\x00\x03\x00\x00\x00\x00",
    struct.pack(">ihhih", 10, 999, 0, 7, 0),
]


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_garbage_clients_are_dropped_while_a_producer_carries_on(
        broker: Broker, broker_node_id: int, topic_name: str) -> None:
    proxy = ProxyProcess(broker.address, broker_node_id).start()
    try:
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
        admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(30)
        errors: list[object] = []
        delivered: list[int] = []
        stop = threading.Event()

        def produce() -> None:
            p = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "linger.ms": 2,
                          "enable.idempotence": True})
            i = 0
            while not stop.is_set():
                p.produce(topic_name, value=str(i).encode(),
                          on_delivery=lambda err, msg: errors.append(err) if err
                          else delivered.append(msg.offset()))
                p.poll(0.001)
                i += 1
            assert p.flush(30) == 0

        worker = threading.Thread(target=produce)
        worker.start()
        time.sleep(1.0)
        for data in BAD_INPUTS:
            with socket.create_connection(("127.0.0.1", proxy.port)) as s:
                s.sendall(data)
                assert _closed_by_peer(s)
        time.sleep(1.0)
        stop.set()
        worker.join(60)
        assert errors == []
        assert len(delivered) > 100
        assert delivered == list(range(len(delivered)))  # none lost, none reordered
        log = proxy.log_text()
        warnings = [line for line in log.splitlines() if " WARNING " in line]
        assert len(warnings) == len(BAD_INPUTS)
        assert all("closing connection from 127.0.0.1:" in w for w in warnings)
        assert "Traceback" not in log
        errors_total = sum(proxy.metric("kafka_quota_proxy_protocol_errors_total", kind=k) for k in
                           ("negative_frame_length", "frame_too_large", "truncated", "unknown_api_key"))
        assert errors_total == len(BAD_INPUTS)
    finally:
        proxy.stop()


def _long_poll_fetch(topic: str, correlation_id: int, wait_ms: int) -> bytes:
    req = FetchRequest(replica_id=-1, max_wait_ms=wait_ms, min_bytes=1, max_bytes=1024,
                       isolation_level=0, topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                           FetchRequest.FetchTopic.FetchPartition(
                               partition=0, fetch_offset=0, partition_max_bytes=1024,
                               log_start_offset=-1, current_leader_epoch=-1)])])
    req.with_header(correlation_id=correlation_id, client_id="drain-test")
    return bytes(req.encode(version=4, header=True, framed=True))


def test_sigterm_lets_in_flight_requests_finish(broker: Broker, broker_node_id: int,
                                                 topic_name: str) -> None:
    proxy = ProxyProcess(broker.address, broker_node_id).start()
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(30)
    with socket.create_connection(("127.0.0.1", proxy.node_port)) as s:
        s.sendall(_long_poll_fetch(topic_name, 77, wait_ms=2500))  # the broker holds it 2.5 s
        time.sleep(0.5)
        started = time.monotonic()
        assert proxy.proc is not None
        proxy.proc.terminate()
        s.settimeout(15)
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        response = s.recv(size, socket.MSG_WAITALL)
        assert struct.unpack_from(">i", response, 0)[0] == 77  # the long poll got its answer
        assert time.monotonic() - started >= 1.0  # ...from the broker, after the signal
        assert _closed_by_peer(s)
    assert proxy.proc.wait(15) == 0
    log = proxy.log_text()
    # The long poll's connection plus the admin client's idle one(s).
    assert re.search(r"shutting down: draining [1-3] connection\(s\), up to 30s", log)
    assert "stopped" in log
    assert "Traceback" not in log


def test_broker_unreachable_at_start_then_appears(broker_node_id: int) -> None:
    late = Broker()  # a port with nothing listening yet
    proxy = ProxyProcess(late.address, broker_node_id).start(wait_for_broker=False)
    try:
        time.sleep(2.0)
        assert proxy.proc is not None and proxy.proc.poll() is None  # still running
        assert "cannot reach any upstream broker" in proxy.log_text()
        late.start()
        wait_for_port(proxy.node_port, timeout=40, proc=proxy.proc)
        md = AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=20)
        assert {(b.host, b.port) for b in md.brokers.values()} == {("127.0.0.1", proxy.node_port)}
    finally:
        proxy.stop()
        late.stop()


def test_metrics_count_requests_bytes_latency_and_connections(proxy: ProxyProcess,
                                                              topic_name: str) -> None:
    before = proxy.metric("kafka_quota_proxy_requests_total", api="Produce")
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(30)
    p = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "linger.ms": 0})
    for _ in range(20):
        p.produce(topic_name, value=b"x" * 100)
        p.flush(10)
    assert proxy.metric("kafka_quota_proxy_requests_total", api="Produce") - before == 20
    assert proxy.metric("kafka_quota_proxy_request_bytes_total", api="Produce") >= 20 * 100
    assert proxy.metric("kafka_quota_proxy_response_bytes_total", api="Produce") > 0
    assert proxy.metric("kafka_quota_proxy_upstream_latency_seconds_count", api="Produce") >= 20
    assert proxy.metric("kafka_quota_proxy_requests_total", api="Metadata") >= 1
    assert proxy.metric("kafka_quota_proxy_connections_open") >= 1
    assert proxy.metric("kafka_quota_proxy_connections_accepted_total") >= 2


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kafka_quota_proxy", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize(("text", "message"), [
    ("upstream: b:9092\nlisten: 0.0.0.0:9092\nlisten_port: 1\n", "listen_port: unknown key"),
    ("upstream: b:9092\nmax_frame_bytes: -3\n", "max_frame_bytes: expected a whole number >= 1, got -3"),
    ("upstream: [b:9092, 'nope']\n", "upstream: expected HOST:PORT, got 'nope'"),
    ("listen: 0.0.0.0:9092\n", "upstream: required"),
    ("upstream: b:9092\nnode_ports: {1: 70000}\n", "node_ports.1: port must be in 1..65535"),
    ("upstream: b:9092\nlog_level: LOUD\n", "log_level: expected one of"),
    ("upstream: b:9092\nsplice: sometimes\n", "splice: expected true or false, got 'sometimes'"),
    ("upstream: [b:9092\n", "config: not valid YAML at line 2"),
    ("- just\n- a list\n", "config: the top level must be a mapping"),
])
def test_check_config_names_the_bad_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = _cli("check-config", str(path))
    assert result.returncode == 2
    assert result.stderr.startswith(f"kafka-quota-proxy: config error: {path}: {message}")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_check_config_accepts_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "good.yaml"
    path.write_text("upstream: [k1:9092, k2:9092]\nlisten: 0.0.0.0:19092\nadvertised_host: proxy.example\n")
    result = _cli("check-config", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"{path}: OK",
        "  listen 0.0.0.0:19092, upstream k1:9092, k2:9092",
        "  clients are told host proxy.example; broker N on port 19093+N",
        "  1 worker process",
        "  quota management: alter by nobody; describe by nobody; and ANONYMOUS from loopback "
        "(no client authentication configured)",
        "  quota state: this process's own (no store:)",
    ]


@pytest.mark.parametrize(("args", "message"), [
    (["--upstream", "b:9092", "--listen", "nope"], "--listen: expected HOST:PORT, got 'nope'"),
    (["--upstream", "b:9092", "--log-level", "LOUD"], "--log-level: expected one of"),
    (["--listen", "127.0.0.1:9999"], "upstream: required"),
    (["--upstream", "b:9092", "--config", "/nonexistent.yaml"], "/nonexistent.yaml: config: cannot read"),
])
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = _cli(*args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"kafka-quota-proxy: config error: {message}")
    assert "Traceback" not in result.stderr


def test_flags_override_the_file(tmp_path: Path, broker: Broker) -> None:
    from kafka_quota_proxy.cli.main import settings_from_args

    path = tmp_path / "p.yaml"
    path.write_text(f"upstream: {broker.address}\nlisten: 127.0.0.1:1111\nlog_level: DEBUG\n")
    port = free_port()
    s = settings_from_args(["--config", str(path), "--listen", f"127.0.0.1:{port}"])
    assert (s.listen.port, s.log_level, s.upstream[0].port) == (port, "DEBUG", broker.port)
