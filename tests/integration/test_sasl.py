"""SASL through the proxy with real clients. Tansu cannot verify SASL here (its memory engine
holds no users), so the proxy's terminating mode is the authority, and passthrough inspection
is tested by a passthrough proxy in front of a terminating one."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.errors import KafkaError
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.sasl import SaslHandshakeRequest

from devkit.processes import ProxyProcess
from devkit.tansu import Broker
from kafka_quota_proxy.config.credentials_file import save_credentials
from kafka_quota_proxy.identity.credentials import CredentialStore

pytestmark = pytest.mark.integration

PASSWORD = "alice-Secret-1"
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sasl") / "users.yaml"
    store = CredentialStore()
    store.add("alice", PASSWORD)
    store.add("alice@EXAMPLE.COM", PASSWORD)
    store.add("proxy-svc", "svc-Secret-2")
    save_credentials(store, path)
    return path


def _terminating(broker: Broker, node_id: int, users: Path, **extra: object) -> ProxyProcess:
    return ProxyProcess(broker.address, node_id, extra_config={
        "sasl": {"mode": "terminate", "credentials_file": str(users)},
        "quotas": [{"user": "alice", "producer_byte_rate": 10_485_760}], **extra}).start()


@pytest.fixture(scope="module")
def terminating(broker: Broker, broker_node_id: int, users_file: Path) -> Iterator[ProxyProcess]:
    p = _terminating(broker, broker_node_id, users_file)
    try:
        yield p
    finally:
        p.stop()


def _conf(proxy: ProxyProcess, mechanism: str, password: str = PASSWORD, user: str = "alice") -> dict:
    return {"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}


def _create(proxy: ProxyProcess, topic: str) -> None:
    admin = AdminClient(_conf(proxy, "SCRAM-SHA-512"))
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)


def _alice_measured(proxy: ProxyProcess) -> float:
    return proxy.metric("kafka_quota_proxy_quota_limit", quota_type="producer_byte_rate",
                        scope=f"127.0.0.1:{proxy.upstream.rsplit(':', 1)[1]}", user="alice",
                        client_id="")


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_through_terminating_proxy(terminating: ProxyProcess, topic_name: str,
                                                   mechanism: str) -> None:
    conf = _conf(terminating, mechanism)
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(30)
    p = Producer(conf)
    for i in range(20):
        p.produce(topic_name, b"c%d" % i)
    assert p.flush(30) == 0
    c = Consumer({**conf, "group.id": "g", "enable.auto.commit": False})
    c.assign([TopicPartition(topic_name, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 20 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert got == [b"c%d" % i for i in range(20)]
    # Quotas apply to the principal the client authenticated as (user quota: tags (alice, "")).
    assert _alice_measured(terminating) == 10_485_760


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_through_terminating_proxy(terminating: ProxyProcess, topic_name: str,
                                                mechanism: str) -> None:
    sasl = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
            "sasl_plain_username": "alice", "sasl_plain_password": PASSWORD}
    _create(terminating, topic_name)
    producer = KafkaProducer(bootstrap_servers=terminating.bootstrap, **sasl)
    for i in range(10):
        producer.send(topic_name, b"k%d" % i)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=terminating.bootstrap, consumer_timeout_ms=10000, **sasl)
    consumer.assign([KpTopicPartition(topic_name, 0)])
    consumer.seek_to_beginning()
    got = [m.value for m, _ in zip(consumer, range(10), strict=False)]
    consumer.close()
    assert got == [b"k%d" % i for i in range(10)]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_aiokafka_through_terminating_proxy(terminating: ProxyProcess, topic_name: str,
                                            mechanism: str) -> None:
    sasl = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
            "sasl_plain_username": "alice", "sasl_plain_password": PASSWORD}
    _create(terminating, topic_name)

    async def scenario() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=terminating.bootstrap, **sasl)
        await producer.start()
        try:
            for i in range(10):
                await producer.send_and_wait(topic_name, b"a%d" % i)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=terminating.bootstrap, **sasl)
        await consumer.start()
        try:
            tp = AioTopicPartition(topic_name, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            got: list[bytes] = []
            async with asyncio.timeout(30):
                while len(got) < 10:
                    batch = await consumer.getmany(tp, timeout_ms=1000)
                    got += [m.value for m in batch.get(tp, [])]
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(scenario()) == [b"a%d" % i for i in range(10)]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_wrong_password_is_rejected_and_never_logged(terminating: ProxyProcess, mechanism: str) -> None:
    before = terminating.metric("kafka_quota_proxy_authentication_failures_total", mechanism=mechanism)
    producer = KafkaProducer  # kafka-python raises at once on authentication failure
    with pytest.raises(KafkaError) as failed:
        producer(bootstrap_servers=terminating.bootstrap, security_protocol="SASL_PLAINTEXT",
                 sasl_mechanism=mechanism, sasl_plain_username="alice",
                 sasl_plain_password="not-the-Password", request_timeout_ms=5000,
                 max_block_ms=5000).send("x", b"x").get(timeout=10)
    assert "uthentication" in str(failed.value) or "Timeout" in type(failed.value).__name__
    assert terminating.metric("kafka_quota_proxy_authentication_failures_total",
                              mechanism=mechanism) > before
    log = terminating.log_text()
    assert "not-the-Password" not in log and PASSWORD not in log
    assert "authentication failed from 127.0.0.1:" in log


def _frame(request: object, version: int, correlation_id: int) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="raw")  # type: ignore[attr-defined]
    return bytes(request.encode(version=version, header=True, framed=True))  # type: ignore[attr-defined]


def _read(s: socket.socket) -> bytes:
    head = s.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return b""
    return s.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)


def test_requests_before_authentication_close_the_connection(terminating: ProxyProcess) -> None:
    with socket.create_connection(("127.0.0.1", terminating.port), timeout=10) as s:
        s.sendall(_frame(MetadataRequest(topics=[]), 1, 1))
        assert _read(s) == b""  # closed, as a broker's SASL listener does
    assert "before SASL authentication" in terminating.log_text()


def test_legacy_handshake_v0_with_bare_plain_token(terminating: ProxyProcess) -> None:
    with socket.create_connection(("127.0.0.1", terminating.port), timeout=10) as s:
        s.sendall(_frame(SaslHandshakeRequest(mechanism="PLAIN"), 0, 1))
        assert struct.unpack_from(">ih", _read(s), 0) == (1, 0)  # correlation id 1, error NONE
        token = b"\x00alice\x00" + PASSWORD.encode()
        s.sendall(struct.pack(">i", len(token)) + token)  # no Kafka header: a bare token
        assert s.recv(4, socket.MSG_WAITALL) == b"\x00\x00\x00\x00"  # PLAIN answers an empty token
        s.sendall(_frame(MetadataRequest(topics=[]), 1, 2))
        response = _read(s)
        assert struct.unpack_from(">i", response, 0)[0] == 2  # authenticated: Metadata answered


def test_kerberos_style_names_map_to_short_principals(broker: Broker, broker_node_id: int,
                                                      users_file: Path, topic_name: str) -> None:
    proxy = ProxyProcess(broker.address, broker_node_id, extra_config={
        "sasl": {"mode": "terminate", "credentials_file": str(users_file),
                 "kerberos_rules": ["RULE:[1:$1@$0](.*@EXAMPLE.COM)s/@.*//", "DEFAULT"]},
        "quotas": [{"user": "alice", "producer_byte_rate": 10_485_760}]}).start()
    try:
        p = Producer(_conf(proxy, "SCRAM-SHA-512", user="alice@EXAMPLE.COM"))
        p.produce(topic_name, b"x")
        assert p.flush(30) == 0
        assert "authenticated as alice" in proxy.log_text()
        assert _alice_measured(proxy) == 10_485_760
    finally:
        proxy.stop()


def test_passthrough_binds_what_the_broker_accepted(broker: Broker, broker_node_id: int,
                                                    users_file: Path, topic_name: str) -> None:
    inner = _terminating(broker, broker_node_id, users_file)
    # The outer proxy's own metadata refresh needs credentials at a SASL-only broker; client
    # connections still carry the client's own authentication.
    outer = ProxyProcess(inner.bootstrap, broker_node_id, extra_config={
        "sasl": {"mode": "passthrough"},
        "upstream_sasl": {"mechanism": "SCRAM-SHA-512", "username": "proxy-svc",
                          "password": "svc-Secret-2"},
        "quotas": [{"user": "alice", "producer_byte_rate": 10_485_760}]})
    try:
        outer.start()  # inside the try: a start that fails must not leave the inner proxy running
        for mechanism in MECHANISMS:
            p = Producer(_conf(outer, mechanism))
            p.produce(topic_name, b"x")
            assert p.flush(30) == 0
        assert outer.log_text().count("authenticated as alice") >= 3
        # Spoofing: claiming 'mallory' with a bad password binds nothing at the outer proxy.
        with pytest.raises(KafkaError):
            KafkaProducer(bootstrap_servers=outer.bootstrap, security_protocol="SASL_PLAINTEXT",
                          sasl_mechanism="PLAIN", sasl_plain_username="mallory",
                          sasl_plain_password="guess", max_block_ms=5000).send("x", b"x").get(10)
        assert "authenticated as mallory" not in outer.log_text()
        # A SaslAuthenticate without a handshake claims nothing either.
        with socket.create_connection(("127.0.0.1", outer.port), timeout=10) as s:
            from kafka.protocol.sasl import SaslAuthenticateRequest

            s.sendall(_frame(SaslAuthenticateRequest(auth_bytes=b"\x00mallory\x00x"), 1, 1))
            _read(s)
        assert "authenticated as mallory" not in outer.log_text()
        # Legacy SaslHandshake v0: the bare tokens pass through and the claim binds once the
        # broker answers them.
        with socket.create_connection(("127.0.0.1", outer.port), timeout=10) as s:
            s.sendall(_frame(SaslHandshakeRequest(mechanism="PLAIN"), 0, 1))
            assert struct.unpack_from(">ih", _read(s), 0) == (1, 0)
            token = b"\x00alice\x00" + PASSWORD.encode()
            s.sendall(struct.pack(">i", len(token)) + token)
            assert s.recv(4, socket.MSG_WAITALL) == b"\x00\x00\x00\x00"
            s.sendall(_frame(MetadataRequest(topics=[]), 1, 2))
            assert struct.unpack_from(">i", _read(s), 0)[0] == 2
        assert outer.log_text().count("authenticated as alice") >= 4
    finally:
        outer.stop()
        inner.stop()


def test_upstream_service_credentials(broker: Broker, broker_node_id: int, users_file: Path,
                                      topic_name: str, tmp_path: Path) -> None:
    inner = _terminating(broker, broker_node_id, users_file)
    secret = tmp_path / "svc.password"
    secret.write_text("svc-Secret-2\n")
    outer = ProxyProcess(inner.bootstrap, broker_node_id, extra_config={
        "sasl": {"mode": "terminate", "credentials_file": str(users_file)},
        "upstream_sasl": {"mechanism": "SCRAM-SHA-256", "username": "proxy-svc",
                          "password_file": str(secret)}}).start()
    try:
        p = Producer(_conf(outer, "PLAIN"))
        p.produce(topic_name, b"x")
        assert p.flush(30) == 0
        assert "authenticated as alice" in outer.log_text()
        assert "authenticated as proxy-svc" in inner.log_text()  # the brokers see the service
        assert "svc-Secret-2" not in outer.log_text() + inner.log_text()
    finally:
        outer.stop()
        inner.stop()
