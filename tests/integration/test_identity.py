"""Identity end to end: TLS and mTLS listeners, principals from certificates and source addresses,
the PROXY protocol, and Kafka's quota precedence with real principals, against a real Tansu."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trustme
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from aiokafka.helpers import create_ssl_context
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import NewTopic as KpNewTopic
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from prometheus_client.parser import text_string_to_metric_families

from devkit.processes import LOOPBACK, ProxyProcess
from devkit.tansu import Broker
from tests.support.certs import CertFiles, Pki

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

MAPPING_RULES = "RULE:^CN=([a-zA-Z0-9.-]*),.*$/$1/L,DEFAULT"
PROXY_V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"


# --- helpers ---------------------------------------------------------------------------------


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def samples(proxy: ProxyProcess, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of one metric: (labels, value)."""
    out = []
    for family in text_string_to_metric_families(proxy.metrics()):
        for sample in family.samples:
            if sample.name == name:
                out.append((dict(sample.labels), sample.value))
    return out


def quota_limits(proxy: ProxyProcess, quota_type: str = "producer_byte_rate") -> set[tuple[str, str, float]]:
    """(user tag, client-id tag, quota) of each measured entity of one quota type."""
    return {(labels["user"], labels["client_id"], value)
            for labels, value in samples(proxy, "kafka_quota_proxy_quota_limit")
            if labels["quota_type"] == quota_type}


def measured(proxy: ProxyProcess, quota_type: str = "producer_byte_rate") -> set[tuple[str, str]]:
    """(user tag, client-id tag) of each shared sensor of one byte-rate quota type."""
    return {(labels["user"], labels["client_id"])
            for labels, _ in samples(proxy, "kafka_quota_proxy_byte_rate")
            if labels["quota_type"] == quota_type}


def create_topic_at_broker(broker: Broker, name: str) -> None:
    """Straight at the broker, so no quota of the proxy under test is charged for it."""
    admin = AdminClient({"bootstrap.servers": broker.address})
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name].result(timeout=30)


def ssl_conf(pki: Pki, client: CertFiles | None = None) -> dict[str, str]:
    conf = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca_file)}
    if client is not None:
        conf |= {"ssl.certificate.location": str(client.cert), "ssl.key.location": str(client.key)}
    return conf


def produce_one(bootstrap: str, topic: str, client_id: str, **conf: str) -> None:
    results: list[KafkaError | None] = []
    p = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "acks": 1,
                  "message.timeout.ms": 15000, **conf})
    p.produce(topic, b"x", on_delivery=lambda err, _msg: results.append(err))
    assert p.flush(20) == 0
    assert results == [None]


def metadata_frame(correlation_id: int, client_id: str = "raw-client") -> bytes:
    request = MetadataRequest(topics=None)
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(version=1, header=True, framed=True))


def read_frame(sock: socket.socket) -> bytes | None:
    """One size-prefixed frame, or None if the peer closed (or reset) the connection first."""
    def exactly(n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            try:
                chunk = sock.recv(n - len(data))
            except (ConnectionResetError, ssl.SSLError):
                return None
            if not chunk:
                return None
            data += chunk
        return data
    size = exactly(4)
    if size is None:
        return None
    return exactly(struct.unpack(">i", size)[0])


def metadata(sock: socket.socket, correlation_id: int) -> Any:
    """Send Metadata v1, return the decoded response (AssertionError if the connection closes)."""
    sock.sendall(metadata_frame(correlation_id))
    frame = read_frame(sock)
    assert frame is not None, "connection closed instead of a Metadata response"
    assert struct.unpack(">i", frame[:4])[0] == correlation_id
    return MetadataResponse.decode(frame[4:], version=1)


def proxy_brokers(response: Any) -> list[tuple[int, str, int]]:
    return [(b.node_id, b.host, b.port) for b in response.brokers]


def tls_connect(proxy: ProxyProcess, pki: Pki, client: CertFiles | None = None) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    if client is not None:
        ctx.load_cert_chain(str(client.cert), str(client.key))
    raw = socket.create_connection((LOOPBACK, proxy.port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname=LOOPBACK)


def peer_serial(sock: ssl.SSLSocket) -> int:
    cert = sock.getpeercert()
    assert cert is not None
    return int(str(cert["serialNumber"]), 16)


def proxy_v1(source: str, port: int) -> bytes:
    return f"PROXY TCP4 {source} 127.0.0.1 {port} 9092\r\n".encode()


def proxy_v2(source: str, port: int) -> bytes:
    addresses = socket.inet_aton(source) + socket.inet_aton(LOOPBACK) + struct.pack(">HH", port, 9092)
    # version 2, command PROXY; AF_INET, STREAM
    return PROXY_V2_SIGNATURE + bytes([0x21, 0x11]) + struct.pack(">H", len(addresses)) + addresses


def start_proxy(broker: Broker, node_id: int, config: dict[str, Any]) -> ProxyProcess:
    return ProxyProcess(broker.address, node_id, extra_config=config).start()


def rewrite_config(proxy: ProxyProcess, **changes: Any) -> None:
    """Change the proxy's config file and wait for its reload to be logged."""
    assert proxy.config_path is not None
    before = proxy.log_text().count("config reloaded")
    proxy.extra_config.update(changes)
    proxy.config_path.write_text(yaml.safe_dump(proxy.config()))
    wait_until(lambda: proxy.log_text().count("config reloaded") > before, 10, "the config reload")


def quota(entity: dict[str, str], **values: float) -> dict[str, Any]:
    return {**entity, **values}


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_proxy(broker: Broker, broker_node_id: int, pki: Pki) -> Iterator[ProxyProcess]:
    server = pki.server("tls-listener")
    p = start_proxy(broker, broker_node_id, {"tls": {"cert_file": str(server.cert),
                                                     "key_file": str(server.key)}})
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def mtls_server(pki: Pki) -> CertFiles:
    return pki.server("mtls-listener")


@pytest.fixture(scope="module")
def mtls_proxy(broker: Broker, broker_node_id: int, pki: Pki,
               mtls_server: CertFiles) -> Iterator[ProxyProcess]:
    p = start_proxy(broker, broker_node_id, {
        "tls": {"cert_file": str(mtls_server.cert), "key_file": str(mtls_server.key),
                "ca_file": str(pki.ca_file), "client_auth": "required"},
        "ssl_principal_mapping_rules": MAPPING_RULES,
        "quotas": [quota({"user": "alice"}, producer_byte_rate=1048576),
                   quota({"user": "CN=Eve Smith,OU=Clients,O=Example"}, producer_byte_rate=524288)],
    })
    try:
        yield p
    finally:
        p.stop()


# --- 1. TLS listener ---------------------------------------------------------------------------


def test_tls_confluent_kafka(tls_proxy: ProxyProcess, pki: Pki, topic_name: str) -> None:
    conf: dict[str, Any] = {"bootstrap.servers": tls_proxy.bootstrap, **ssl_conf(pki)}
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=1)])[topic_name] \
        .result(timeout=30)
    md = admin.list_topics(timeout=10)
    assert {(b.host, b.port) for b in md.brokers.values()} == {(LOOPBACK, tls_proxy.node_port)}

    delivered: list[int | None] = []
    producer = Producer({**conf, "acks": "all"})
    for i in range(5):
        producer.produce(topic_name, b"c%d" % i,
                         on_delivery=lambda err, msg: delivered.append(-1 if err else msg.offset()))
    assert producer.flush(20) == 0
    assert delivered == [0, 1, 2, 3, 4]

    consumer = Consumer({**conf, "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    values: list[bytes | None] = []
    deadline = time.monotonic() + 20
    while len(values) < 5 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            values.append(msg.value())
    consumer.close()
    assert values == [b"c%d" % i for i in range(5)]


def test_tls_kafka_python(tls_proxy: ProxyProcess, pki: Pki, topic_name: str) -> None:
    conf: dict[str, Any] = {"bootstrap_servers": tls_proxy.bootstrap, "security_protocol": "SSL",
                            "ssl_cafile": str(pki.ca_file)}
    admin = KafkaAdminClient(**conf)
    admin.create_topics([KpNewTopic(topic_name, 1, 1)])
    brokers = admin.describe_cluster()["brokers"]
    admin.close()
    assert [(b["host"], b["port"]) for b in brokers] == [(LOOPBACK, tls_proxy.node_port)]

    producer = KafkaProducer(acks="all", **conf)
    futures = [producer.send(topic_name, value=b"k%d" % i) for i in range(5)]
    producer.flush(20)
    assert [f.get(timeout=20).offset for f in futures] == [0, 1, 2, 3, 4]
    producer.close(5)

    consumer = KafkaConsumer(enable_auto_commit=False, consumer_timeout_ms=10000, **conf)
    consumer.assign([KpTopicPartition(topic_name, 0)])
    consumer.seek_to_beginning()
    values = []
    for msg in consumer:
        values.append(msg.value)
        if len(values) == 5:
            break
    consumer.close()
    assert values == [b"k%d" % i for i in range(5)]


def test_tls_aiokafka(tls_proxy: ProxyProcess, pki: Pki, topic_name: str) -> None:
    async def scenario() -> tuple[list[bytes], set[tuple[str, int]]]:
        conf: dict[str, Any] = {"bootstrap_servers": tls_proxy.bootstrap, "security_protocol": "SSL",
                                "ssl_context": create_ssl_context(cafile=str(pki.ca_file))}
        async with asyncio.timeout(60):
            admin = AIOKafkaAdminClient(**conf)
            await admin.start()
            try:
                await admin.create_topics([AioNewTopic(topic_name, 1, 1)])
            finally:
                await admin.close()
            producer = AIOKafkaProducer(acks="all", **conf)
            await producer.start()
            try:
                for i in range(5):
                    await producer.send_and_wait(topic_name, b"a%d" % i)
            finally:
                await producer.stop()
            consumer = AIOKafkaConsumer(enable_auto_commit=False, **conf)
            await consumer.start()
            try:
                tp = AioTopicPartition(topic_name, 0)
                consumer.assign([tp])
                await consumer.seek_to_beginning(tp)
                values: list[bytes] = []
                while len(values) < 5:
                    batch = await consumer.getmany(tp, timeout_ms=1000)
                    values += [m.value for m in batch.get(tp, [])]
                brokers = {(b.host, b.port) for b in consumer._client.cluster.brokers()}
            finally:
                await consumer.stop()
        return values, brokers

    values, brokers = asyncio.run(scenario())
    assert values == [b"a%d" % i for i in range(5)]
    assert brokers == {(LOOPBACK, tls_proxy.node_port)}


def test_plaintext_client_on_tls_listener_is_closed(tls_proxy: ProxyProcess, pki: Pki) -> None:
    with socket.create_connection((LOOPBACK, tls_proxy.port), timeout=10) as s:
        s.sendall(metadata_frame(1))
        received = b""
        while True:  # whatever comes back before the close is at most a TLS alert, never Kafka
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    assert received == b"" or received[0] == 0x15, received  # 0x15: a TLS alert record
    assert tls_proxy.proc is not None and tls_proxy.proc.poll() is None
    with tls_connect(tls_proxy, pki) as s:  # and TLS clients are still served
        assert proxy_brokers(metadata(s, 2)) == [(tls_proxy.node_id, LOOPBACK, tls_proxy.node_port)]


# --- 2. mTLS ----------------------------------------------------------------------------------


def test_mtls_principal_from_certificate_picks_the_quota(
        broker: Broker, mtls_proxy: ProxyProcess, pki: Pki, topic_name: str) -> None:
    create_topic_at_broker(broker, topic_name)
    alice = pki.client("Alice", "Example")
    produce_one(mtls_proxy.bootstrap, topic_name, "mtls-app", **ssl_conf(pki, alice))
    # CN=Alice,OU=Clients,O=Example -> "alice" by the rule; a user-only quota shares (alice, "").
    assert quota_limits(mtls_proxy) == {("alice", "", 1048576.0)}
    assert measured(mtls_proxy) == {("alice", "")}
    # A CN the rule does not match falls through to DEFAULT, the whole DN; the user tag is
    # Kafka's sanitized form of it, while the quota names the principal as it is.
    produce_one(mtls_proxy.bootstrap, topic_name, "mtls-app", **ssl_conf(pki, pki.client("Eve Smith")))
    assert quota_limits(mtls_proxy) == {("alice", "", 1048576.0),
                                        ("CN%3DEve%20Smith%2COU%3DClients%2CO%3DExample", "", 524288.0)}


def test_mtls_client_without_certificate_is_refused(mtls_proxy: ProxyProcess, pki: Pki) -> None:
    refused = False
    try:
        with tls_connect(mtls_proxy, pki) as s:
            # TLS 1.3: the client's handshake can finish before the server checks the
            # certificate; the server's alert then ends the connection at the first read.
            s.sendall(metadata_frame(1))
            refused = read_frame(s) is None
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        refused = True
    assert refused
    # librdkafka without a certificate never gets metadata either.
    admin = AdminClient({"bootstrap.servers": mtls_proxy.bootstrap, "log_level": 2, **ssl_conf(pki)})
    with pytest.raises(KafkaException) as caught:
        admin.list_topics(timeout=3)
    assert caught.value.args[0].code() == KafkaError._TRANSPORT
    assert mtls_proxy.proc is not None and mtls_proxy.proc.poll() is None


def test_server_certificate_reload(mtls_proxy: ProxyProcess, pki: Pki, mtls_server: CertFiles) -> None:
    client = pki.client("reloader")
    with tls_connect(mtls_proxy, pki, client) as old:
        assert peer_serial(old) == mtls_server.serial
        assert proxy_brokers(metadata(old, 1)) == [(mtls_proxy.node_id, LOOPBACK, mtls_proxy.node_port)]
        fresh = pki.reissue(mtls_server)
        assert fresh.serial != mtls_server.serial
        time.sleep(2.6)  # the watcher polls every 2 s

        def new_connection_serial() -> bool:
            with tls_connect(mtls_proxy, pki, client) as new:
                metadata(new, 1)
                return peer_serial(new) == fresh.serial
        wait_until(new_connection_serial, 6, "new connections to present the new certificate", 0.5)
        assert "listener certificate reloaded" in mtls_proxy.log_text()
        # The connection made before the reload keeps its session and keeps working.
        assert peer_serial(old) == mtls_server.serial
        assert proxy_brokers(metadata(old, 2)) == [(mtls_proxy.node_id, LOOPBACK, mtls_proxy.node_port)]


# --- 3. principals_by_cidr --------------------------------------------------------------------


def test_principal_by_source_cidr(broker: Broker, broker_node_id: int, topic_name: str) -> None:
    create_topic_at_broker(broker, topic_name)
    p = start_proxy(broker, broker_node_id, {
        "principals_by_cidr": {"127.0.0.0/8": "team-local"},
        "quotas": [quota({"user": "team-local"}, producer_byte_rate=2097152)],
    })
    try:
        produce_one(p.bootstrap, topic_name, "cidr-app")
        assert quota_limits(p) == {("team-local", "", 2097152.0)}
    finally:
        p.stop()


# --- 4. PROXY protocol ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pp_proxy(broker: Broker, broker_node_id: int) -> Iterator[ProxyProcess]:
    p = start_proxy(broker, broker_node_id, {
        "proxy_protocol": True,
        "principals_by_cidr": {"10.1.0.0/16": "team-a", "10.2.0.0/16": "team-b"},
        "quotas": [quota({"user": "team-a"}, request_percentage=50),
                   quota({"user": "team-b"}, request_percentage=25)],
    })
    try:
        yield p
    finally:
        p.stop()


def pp_connect(proxy: ProxyProcess, header: bytes, port: int | None = None,
               more: bool = False) -> socket.socket:
    """A connection that starts with `header`; with `more`, the kernel holds the header back to
    send it in one segment with what is written next (Linux MSG_MORE)."""
    s = socket.create_connection((LOOPBACK, port or proxy.port), timeout=10)
    s.sendall(header, getattr(socket, "MSG_MORE", 0) if more else 0)
    return s


def test_proxy_protocol_v1_gives_the_real_address(pp_proxy: ProxyProcess) -> None:
    with pp_connect(pp_proxy, proxy_v1("10.1.2.3", 5555)) as s:
        response = metadata(s, 11)
        assert proxy_brokers(response) == [(pp_proxy.node_id, LOOPBACK, pp_proxy.node_port)]
        assert metadata(s, 12).brokers == response.brokers  # the connection keeps working
    assert quota_limits(pp_proxy, "request_percentage") >= {("team-a", "", 50.0)}
    # A request the proxy cannot read after the header: the warning names the real client.
    with pp_connect(pp_proxy, proxy_v1("10.1.2.3", 5556) + b"\xff\xff\xff\xff") as s:
        assert read_frame(s) is None
    line = wait_until(lambda: [ln for ln in pp_proxy.log_text().splitlines() if "10.1.2.3:5556" in ln],
                      5, "a log line naming 10.1.2.3")
    assert "closing connection from 10.1.2.3:5556 (team-a, bootstrap)" in line[0]


def test_proxy_protocol_v2_binary_header(pp_proxy: ProxyProcess) -> None:
    # Straight to the node listener this time: every listener expects the header.
    with pp_connect(pp_proxy, proxy_v2("10.2.3.4", 6000), pp_proxy.node_port) as s:
        assert proxy_brokers(metadata(s, 21)) == [(pp_proxy.node_id, LOOPBACK, pp_proxy.node_port)]
    assert quota_limits(pp_proxy, "request_percentage") >= {("team-b", "", 25.0)}
    users = {labels["user"] for labels, _ in samples(pp_proxy, "kafka_quota_proxy_request_time_percent")}
    assert "team-b" in users and "ANONYMOUS" not in users


def test_connection_without_proxy_header_is_closed(pp_proxy: ProxyProcess) -> None:
    before = pp_proxy.log_text().count("proxy_protocol")
    with socket.create_connection((LOOPBACK, pp_proxy.port), timeout=10) as s:
        s.sendall(metadata_frame(31))
        assert read_frame(s) is None
    wait_until(lambda: pp_proxy.log_text().count("proxy_protocol") > before, 5, "the warning")
    time.sleep(0.2)
    new = [ln for ln in pp_proxy.log_text().splitlines() if "proxy_protocol" in ln][before:]
    assert len(new) == 1 and "WARNING" in new[0], new
    assert pp_proxy.metric("kafka_quota_proxy_protocol_errors_total", kind="proxy_protocol") == 1.0
    assert pp_proxy.proc is not None and pp_proxy.proc.poll() is None


def test_connection_rate_quota_applies_to_the_proxied_address(broker: Broker, broker_node_id: int) -> None:
    p = start_proxy(broker, broker_node_id, {
        "proxy_protocol": True,
        "quotas": [quota({"ip": "10.1.2.3"}, connection_creation_rate=1)],
    })

    def served(source: str, correlation_id: int) -> tuple[bool, float]:
        """Whether a Metadata request on a new connection is answered, and how long that took."""
        start = time.monotonic()
        with pp_connect(p, proxy_v1(source, 40000 + correlation_id)) as s:
            s.sendall(metadata_frame(correlation_id))
            return read_frame(s) is not None, time.monotonic() - start

    try:
        # 1/s measured over at least (N-1)*W = 10 s: connection k is over the limit once
        # k/10 > 1, so ten pass, and the eleventh is closed unserved after min(0.1*10 s, 1 s).
        outcomes: list[tuple[bool, float]] = []
        while len(outcomes) < 20 and [ok for ok, _ in outcomes[-3:]] != [False] * 3:
            outcomes.append(served("10.1.2.3", len(outcomes) + 1))
        first_refused = [ok for ok, _ in outcomes].index(False)
        assert first_refused in (10, 11), outcomes  # 11 only if the burst straddled a window edge
        assert [ok for ok, _ in outcomes[first_refused:]] == [False] * 3, outcomes
        # The delay, (O-T)/T * window, shrinks as the window grows past 10 s: only the first
        # refusal, straight after the burst, is sure to wait most of a second.
        assert 0.5 < outcomes[first_refused][1] < 3, outcomes
        assert all(took < 3 for _, took in outcomes), outcomes
        # The limit is on 10.1.2.3, not on the balancer's (127.0.0.1) nor another client's address.
        assert served("10.1.2.4", 99)[0]
        delays = p.metric("kafka_quota_proxy_connection_accept_throttle_time_ms_total", ip="10.1.2.3")
        assert 500 < delays <= 3 * 1000.0
        assert p.metric("kafka_quota_proxy_connection_accept_throttle_time_ms_total", ip="10.1.2.4") == 0
    finally:
        p.stop()


def test_proxy_protocol_before_tls(broker: Broker, broker_node_id: int, pki: Pki) -> None:
    """Behind a load balancer the PROXY header comes in the clear, before the TLS handshake."""
    server = pki.server("pp-tls-listener")
    p = start_proxy(broker, broker_node_id, {
        "proxy_protocol": True,
        "tls": {"cert_file": str(server.cert), "key_file": str(server.key),
                "ca_file": str(pki.ca_file), "client_auth": "required"},
        # No DEFAULT: a subject no rule maps is refused, as Kafka fails the SSL authentication.
        "ssl_principal_mapping_rules": "RULE:^CN=([a-zA-Z0-9.-]*),OU=Clients,O=Example$/$1/L",
        "quotas": [quota({"user": "carol"}, request_percentage=40)],
    })
    carol, dave = pki.client("Carol"), pki.client("Dave", "Other")

    def connect(header: bytes, client: CertFiles, port: int | None = None) -> ssl.SSLSocket:
        ctx = ssl.create_default_context(cafile=str(pki.ca_file))
        ctx.load_cert_chain(str(client.cert), str(client.key))
        # The header and the ClientHello arrive together: the proxy must not read past the header.
        return ctx.wrap_socket(pp_connect(p, header, port, more=True), server_hostname=LOOPBACK)

    try:
        with connect(proxy_v1("10.1.2.3", 5557), carol) as s:
            assert proxy_brokers(metadata(s, 1)) == [(p.node_id, LOOPBACK, p.node_port)]
            s.sendall(b"\xff\xff\xff\xff")  # then something unreadable, to be logged
            assert read_frame(s) is None
        with connect(proxy_v2("10.2.3.4", 6001), carol, p.node_port) as s:
            assert proxy_brokers(metadata(s, 2)) == [(p.node_id, LOOPBACK, p.node_port)]
        assert quota_limits(p, "request_percentage") == {("carol", "", 40.0)}
        line = wait_until(lambda: [ln for ln in p.log_text().splitlines() if "10.1.2.3:5557" in ln],
                          5, "a log line naming 10.1.2.3")
        assert "closing connection from 10.1.2.3:5557 (carol, bootstrap)" in line[0]

        # CN=Dave,OU=Clients,O=Other: no rule maps it, so the connection is closed unserved.
        with connect(proxy_v1("10.1.2.5", 5558), dave) as s:
            s.sendall(metadata_frame(3))
            assert read_frame(s) is None
        wait_until(lambda: "closing connection from 10.1.2.5:5558 (ANONYMOUS, bootstrap): no principal "
                           "for the client certificate" in p.log_text(), 5, "the refusal")

        # A TLS handshake without the PROXY header first is refused like any other stream.
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            with tls_connect(p, pki, carol) as s:
                s.sendall(metadata_frame(4))
                s.recv(1)
        assert p.metric("kafka_quota_proxy_protocol_errors_total", kind="proxy_protocol") == 1.0
        assert p.proc is not None and p.proc.poll() is None
    finally:
        p.stop()


# --- 5. Quota precedence with real principals -------------------------------------------------


def test_quota_precedence_with_mtls_principals(
        broker: Broker, broker_node_id: int, pki: Pki, topic_name: str) -> None:
    """Section 4 of the reference: the eight levels, the shared-sensor tags, the sticky flags."""
    create_topic_at_broker(broker, topic_name)
    server = pki.server("precedence-listener")
    certs = {u: pki.client(u.upper()) for u in ("u1", "u2", "u3", "u4")}
    tls = {"tls": {"cert_file": str(server.cert), "key_file": str(server.key),
                   "ca_file": str(pki.ca_file), "client_auth": "required"},
           "ssl_principal_mapping_rules": MAPPING_RULES}

    def entry(user: str | None, client: str | None, value: int) -> dict[str, Any]:
        e = ({"user": user} if user else {}) | ({"client-id": client} if client else {})
        return quota(e, producer_byte_rate=value)

    def produce(proxy: ProxyProcess, user: str, client_id: str) -> None:
        produce_one(proxy.bootstrap, topic_name, client_id, **ssl_conf(pki, certs[user]))

    # Phase 1: user+client-id and user quotas (mixed flags): levels 1 to 5.
    p = start_proxy(broker, broker_node_id, {**tls, "quotas": [
        entry("u1", "c1", 101), entry("u1", "<default>", 102), entry("u2", None, 103),
        entry("<default>", "c1", 104), entry("<default>", "<default>", 105)]})
    try:
        for user, client in (("u1", "c1"), ("u1", "c2"), ("u2", "ca"), ("u2", "cb"), ("u3", "c1"),
                             ("u3", "c9")):
            produce(p, user, client)
        assert quota_limits(p) == {
            ("u1", "c1", 101.0),  # 1 /users/u1/clients/c1
            ("u1", "c2", 102.0),  # 2 /users/u1/clients/<default>
            ("u2", "", 103.0),  # 3 /users/u2, one sensor shared by every client of u2
            ("u3", "c1", 104.0),  # 4 /users/<default>/clients/c1
            ("u3", "c9", 105.0),  # 5 /users/<default>/clients/<default>
        }
        assert measured(p) == {("u1", "c1"), ("u1", "c2"), ("u2", ""), ("u3", "c1"), ("u3", "c9")}

        # Phase 2, same proxy: only /users/<default>. The flags stay mixed, and the walk
        # reaches level 6, so (u3, any client) is measured as (u3, ""). Limits are looked up
        # from each live sensor's tags: the (u,c) sensors of phase 1 now have none, and u2's
        # shared sensor now gets the user default too.
        rewrite_config(p, quotas=[entry("<default>", None, 106)])
        produce(p, "u3", "cx")
        assert quota_limits(p) == {("u2", "", 106.0), ("u3", "", 106.0)}

        # Phase 3, same proxy: only client-id quotas: levels 7 and 8, measured as ("", c).
        rewrite_config(p, quotas=[entry(None, "c1", 107), entry(None, "<default>", 108)])
        produce(p, "u1", "c1")
        produce(p, "u1", "c5")
        assert quota_limits(p) == {("", "c1", 107.0), ("", "c5", 108.0)}

        # Phase 4, same proxy: only /users/u1. The sticky mixed flags walk the levels, so u4,
        # with no user quota at all, is measured per client-id, and unlimited.
        rewrite_config(p, quotas=[entry("u1", None, 109)])
        produce(p, "u1", "c7")
        produce(p, "u4", "c7")
        assert quota_limits(p) == {("u1", "", 109.0)}
        assert {("u1", ""), ("", "c7")} <= measured(p)
        assert not any(user == "u4" for user, _ in measured(p))
    finally:
        p.stop()

    # The same file on a fresh proxy: only the user flag is on, so every principal is measured
    # as (u, ""), u4 included (unlimited, so no limit series for it).
    p = start_proxy(broker, broker_node_id, {**tls, "quotas": [entry("u1", None, 109)]})
    try:
        produce(p, "u1", "c7")
        produce(p, "u4", "c7")
        assert quota_limits(p) == {("u1", "", 109.0)}
        assert measured(p) == {("u1", ""), ("u4", "")}
    finally:
        p.stop()


def test_upstream_tls_to_a_tls_broker(tls_proxy: ProxyProcess, broker_node_id: int, pki: Pki,
                                      topic_name: str) -> None:
    """A proxy that reaches its broker over TLS (here the TLS-listening proxy stands in for a
    TLS broker: Tansu's TLS listener would need its own certificates set up the same way)."""
    outer = ProxyProcess(tls_proxy.bootstrap, broker_node_id, extra_config={
        "upstream_tls": {"ca_file": str(pki.ca_file), "check_hostname": True}}).start()
    try:
        admin = AdminClient({"bootstrap.servers": outer.bootstrap})
        admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(30)
        p = Producer({"bootstrap.servers": outer.bootstrap, "acks": "all"})
        for i in range(5):
            p.produce(topic_name, b"t%d" % i)
        assert p.flush(30) == 0
        md = admin.list_topics(timeout=10)
        assert {(b.host, b.port) for b in md.brokers.values()} == {(LOOPBACK, outer.node_port)}
    finally:
        outer.stop()
    # A CA that did not sign the broker's certificate: the proxy refuses to connect.
    wrong_ca = trustme.CA()
    bad_ca = pki.directory / "wrong-ca.pem"
    wrong_ca.cert_pem.write_to_path(str(bad_ca))
    refused = ProxyProcess(tls_proxy.bootstrap, broker_node_id, extra_config={
        "upstream_tls": {"ca_file": str(bad_ca)}}).start(wait_for_broker=False)
    try:
        deadline = time.monotonic() + 10
        while "CERTIFICATE_VERIFY_FAILED" not in refused.log_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "CERTIFICATE_VERIFY_FAILED" in refused.log_text()
    finally:
        refused.stop()
