"""Record the fuzz corpus from real client traffic through the proxy.

    python -m tests.fuzz.record [--out tests/fuzz/corpus] [--keep-streams DIR]
    python -m tests.fuzz.record --made [--out tests/fuzz/corpus]

Starts Tansu (devkit/tansu.py) and two proxies (devkit/processes.py): a plain one, and one that
terminates SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) from a credentials file. Each proxy
advertises 127.0.0.2, where a recording relay listens on the proxy's own ports and forwards to
it on 127.0.0.1, so every connection a client makes, to the bootstrap or to the broker port,
goes through the relay. confluent-kafka, kafka-python and aiokafka then produce (idempotent,
acks=0, compressed), consume in groups, commit, read metadata, create topics, describe and
alter client quotas (the requests kafka-configs.sh sends) and log in with every mechanism.

The recorded streams are cut into frames, each response paired with its request by
correlation id, and written one input a file (named by SHA-1, as libFuzzer names them) in the
formats tests/fuzz/targets.py describes. Small caps per API key and version keep the corpus to
a few hundred small files. OAUTHBEARER tokens and PROXY headers are made here (no client sends
them to this setup); the PROXY ones carry a recorded Kafka stream behind the header. The Kafka 4
APIs Tansu lacks (share groups, KIP-848 and streams groups, DescribeQuorum) are made from their
schemas (tests/fuzz/made.py). `--made` records nothing: it adds the made inputs, and the inputs
the targets added since the last recording take from the recorded ones, to the corpus as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import shutil
import struct
import tempfile
import threading
import time
import uuid
from base64 import urlsafe_b64encode
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devkit.processes import LOOPBACK, ProxyProcess
from devkit.tansu import Broker
from kafka_quota_proxy.config.credentials_file import save_credentials
from kafka_quota_proxy.identity.credentials import CredentialStore
from kafka_quota_proxy.protocol.api_keys import (
    ALTER_CLIENT_QUOTAS,
    DESCRIBE_CLIENT_QUOTAS,
    FETCH,
    PRODUCE,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    SHARE_FETCH,
)
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.framing import FrameDecoder
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.protocol.rewrite import carries_addresses
from kafka_quota_proxy.protocol.throttle import carries_throttle
from tests.fuzz import made
from tests.fuzz.targets import RESPONSE_PREFIX, SASL_ROLES, SCRAM_SEPARATOR, TARGETS

CORPUS = Path(__file__).parent / "corpus"
RELAY_HOST = "127.0.0.2"  # the relays listen here; the proxies on LOOPBACK, same ports
PASSWORD = "alice-Secret-1"
MAX_FILE = 16384
PER_KIND = 4  # inputs per (target, API key, version)


# ---- the recording relay ------------------------------------------------------------------


@dataclass
class Recorded:
    """One relayed connection: what the client sent and what came back."""

    port: int
    sent: bytearray = field(default_factory=bytearray)
    received: bytearray = field(default_factory=bytearray)


class RecordingRelay:
    """TCP relays on RELAY_HOST:port -> LOOPBACK:port, on an event loop in a thread."""

    def __init__(self) -> None:
        self.connections: list[Recorded] = []
        self.loop = asyncio.new_event_loop()
        self._servers: list[asyncio.AbstractServer] = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def listen(self, port: int) -> None:
        fut: Future[None] = asyncio.run_coroutine_threadsafe(self._listen(port), self.loop)
        fut.result(10)

    async def _listen(self, port: int) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            rec = Recorded(port)
            self.connections.append(rec)
            try:
                up_reader, up_writer = await asyncio.open_connection(LOOPBACK, port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(self._pipe(reader, up_writer, rec.sent),
                                 self._pipe(up_reader, writer, rec.received))

        self._servers.append(await asyncio.start_server(handle, RELAY_HOST, port))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, log: bytearray) -> None:
        try:
            while data := await reader.read(65536):
                log += data
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        for server in self._servers:
            self.loop.call_soon_threadsafe(server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


# ---- the client sessions ------------------------------------------------------------------


def _confluent(bootstrap: str, topic: str, sasl: dict[str, str] | None = None) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, **(sasl or {})}
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    admin.list_topics(timeout=10)
    try:
        admin.describe_configs([ConfigResource("topic", topic)])  # what the broker makes of it
    except Exception:  # noqa: BLE001 - recorded either way
        pass
    for extra in ({"enable.idempotence": True, "acks": "all", "compression.type": "none"},
                  {"acks": 0}, {"acks": 1, "compression.type": "gzip", "linger.ms": 5}):
        p = Producer({**conf, **extra})
        for i in range(12):
            p.produce(topic, key=b"k%d" % (i % 3), value=b"confluent-%d" % i, headers={"h": b"v"})
        p.flush(30)
    c = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    got, deadline = 0, time.monotonic() + 40
    while got < 24 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got += 1
    c.commit(asynchronous=False) if got else None
    c.close()


def _kafka_python(bootstrap: str, topic: str, sasl: dict[str, str] | None = None) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    extra: dict[str, Any] = dict(sasl or {})
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **extra)
    try:
        admin.create_topics([NewTopic(topic + "-kp", 1, 1)])
        for call in (admin.list_topics, admin.describe_cluster, admin.list_groups,
                     lambda: admin.describe_topics([topic])):
            try:
                call()
            except Exception:  # noqa: BLE001 - what Tansu lacks is recorded as its error
                pass
    finally:
        admin.close()
    for producer_conf in ({"acks": "all", "enable_idempotence": True}, {"acks": 0},
                          {"acks": 1, "compression_type": "gzip"}):
        producer = KafkaProducer(bootstrap_servers=bootstrap, **producer_conf, **extra)
        for i in range(8):
            producer.send(topic, key=b"k", value=b"kafka-python-%d" % i)
        producer.flush(30)
        producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"kp-{topic}",
                             auto_offset_reset="earliest", consumer_timeout_ms=8000, **extra)
    for n, _ in enumerate(consumer):
        if n >= 20:
            break
    consumer.commit()
    consumer.close()


def _aiokafka(bootstrap: str, topic: str, sasl: dict[str, str] | None = None) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    extra: dict[str, Any] = dict(sasl or {})

    async def scenario() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip", **extra)
        await producer.start()
        try:
            for i in range(8):
                await producer.send_and_wait(topic, b"aiokafka-%d" % i, key=b"a")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"aio-{topic}",
                                    auto_offset_reset="earliest", **extra)
        await consumer.start()
        try:
            got, deadline = 0, time.monotonic() + 40
            while got < 8 and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=1000)
                got += sum(len(v) for v in batches.values())
            await consumer.commit()
        finally:
            await consumer.stop()

    asyncio.run(scenario())


def _quota_requests(bootstrap: str) -> None:
    """What kafka-configs.sh sends: Alter (set, delete, default, bad) and Describe, v0 and v1."""
    from tests.support.clients import alter_quota, describe_quotas

    for version in (0, 1):
        alter_quota(bootstrap, [("user", "alice")], "producer_byte_rate", 1048576, version)
        alter_quota(bootstrap, [("client-id", None)], "consumer_byte_rate", 2097152, version)
        alter_quota(bootstrap, [("user", "bob"), ("client-id", "app")], "request_percentage", 50, version)
        alter_quota(bootstrap, [("ip", "10.0.0.1")], "connection_creation_rate", 10, version)
        alter_quota(bootstrap, [("user", "alice")], "producer_byte_rate", None, version)
        alter_quota(bootstrap, [("user", "carol")], "no_such_key", 1, version)
        describe_quotas(bootstrap, [("user", 0, "alice")], True, version)
        describe_quotas(bootstrap, [("client-id", 1, None)], False, version)
        describe_quotas(bootstrap, [("user", 2, None), ("client-id", 2, None)], False, version)
        describe_quotas(bootstrap, [], False, version)


# ---- cutting the recording into inputs ----------------------------------------------------


class Corpus:
    """Inputs per target, deduplicated, at most PER_KIND per (target, kind)."""

    def __init__(self) -> None:
        self.inputs: dict[str, dict[str, bytes]] = defaultdict(dict)
        self._kinds: dict[tuple[str, object], int] = defaultdict(int)

    def add(self, target: str, data: bytes, kind: object = None, cap: int = PER_KIND) -> None:
        if len(data) > MAX_FILE or (target, kind) in self._kinds and self._kinds[(target, kind)] >= cap:
            return
        name = hashlib.sha1(data).hexdigest()
        if name not in self.inputs[target]:
            self.inputs[target][name] = data
            self._kinds[(target, kind)] += 1

    def write(self, out: Path, replace: bool = True) -> None:
        """Each target's inputs into out/TARGET; with `replace`, in place of what was there."""
        for target in TARGETS:
            folder = out / target
            if replace:
                shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True, exist_ok=True)
            for name, data in self.inputs[target].items():
                (folder / name).write_bytes(data)


def _frames(stream: bytes) -> list[bytes]:
    try:
        return [bytes(f) for f in FrameDecoder().feed(stream)]
    except ProtocolError:
        return []


def cut(connections: list[Recorded], corpus: Corpus) -> None:
    for index, rec in enumerate(connections):
        sent, received = bytes(rec.sent), bytes(rec.received)
        seed = index % 255 + 1
        corpus.add("framing", bytes([seed]) + sent[:512], ("sent", index % 40), cap=1)
        corpus.add("framing", bytes([seed]) + received[:512], ("received", index % 40), cap=1)
        asked: dict[int, tuple[int, int]] = {}
        mechanism: str | None = None
        tokens: list[bytes] = []
        for frame in _frames(sent):
            try:
                header = parse_request_header(memoryview(frame))
            except ProtocolError:
                continue
            key, version = header.api_key, header.api_version
            asked[header.correlation_id] = (key, version)
            corpus.add("request_header", frame, (key, version), cap=2)
            corpus.add("well_formed", frame, (key, version), cap=2)
            if key == PRODUCE:
                corpus.add("produce", frame, (key, version))
            elif key == FETCH:
                corpus.add("fetch", frame, (key, version))
            elif key == SHARE_FETCH:
                corpus.add("share_fetch", frame, (key, version))
            elif key in (DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS):
                corpus.add("client_quotas", frame, (key, version, len(corpus.inputs["client_quotas"])),
                           cap=1)
            elif key in (SASL_HANDSHAKE, SASL_AUTHENTICATE) and header.spec is not None:
                request = header.spec.request.decode(frame[header.body_offset:], version=version)
                if key == SASL_HANDSHAKE:
                    mechanism = request.mechanism
                else:
                    tokens.append(bytes(request.auth_bytes or b""))
        if mechanism in SASL_ROLES and tokens:
            corpus.add("sasl", bytes([SASL_ROLES.index(mechanism)]) + SCRAM_SEPARATOR.join(tokens[:2]),
                       mechanism, cap=6)
        for frame in _frames(received):
            if len(frame) < 8:
                continue
            (correlation_id,) = struct.unpack_from(">i", frame, 4)
            if correlation_id not in asked:
                continue
            key, version = asked[correlation_id]
            data = RESPONSE_PREFIX.pack(key, version) + frame
            if carries_addresses(key, version):
                corpus.add("rewrite", data, (key, version))
            if carries_throttle(key, version):
                corpus.add("throttle", data, (key, version), cap=2)
            if key == SHARE_FETCH:
                corpus.add("share_fetch_response", data, (key, version))
            if key in made.SPLICED:
                corpus.add("splice", data, (key, version), cap=2)
    for target, data, kind in made.inputs():
        corpus.add(target, data, kind)
    for i, data in enumerate(_made_sasl()):
        corpus.add("sasl", data, ("made", i))
    streams = [bytes(rec.sent[:256]) for rec in connections[:4]]
    for i, header in enumerate(_made_proxy_headers()):
        corpus.add("proxy_protocol", bytes([i % 7]) + header + streams[i % len(streams)], ("made", i))


def _jwt(payload: dict[str, object], alg: str = "none", signature: bytes = b"") -> bytes:
    import json

    def part(value: object) -> bytes:
        return urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=")
    return part({"alg": alg}) + b"." + part(payload) + b"." + urlsafe_b64encode(signature).rstrip(b"=")


def _made_sasl() -> list[bytes]:
    """OAUTHBEARER initial responses as librdkafka and Kafka's Java client send them."""
    oauth = SASL_ROLES.index("OAUTHBEARER")
    out = []
    for gs2, token, ext in (
            (b"n,,", _jwt({"sub": "alice", "exp": 4102444800}), b""),
            (b"n,a=alice,", _jwt({"sub": "alice"}, "RS256", b"sig"), b"traceId=123\x01"),
            (b"y,,", _jwt({"sub": " bob "}, "HS256", b"mac"), b"")):
        out.append(bytes([oauth]) + gs2 + b"\x01auth=Bearer " + token + b"\x01" + ext + b"\x01")
    out.append(bytes([oauth]) + b"\x01")
    return out


def _made_proxy_headers() -> list[bytes]:
    v2 = b"\r\n\r\n\x00\r\nQUIT\n"

    def binary(command: int, family: int, block: bytes) -> bytes:
        return v2 + bytes([0x20 | command, family]) + struct.pack(">H", len(block)) + block
    inet = bytes([192, 168, 0, 1, 10, 0, 0, 1]) + struct.pack(">HH", 56324, 9092)
    inet6 = bytes(range(16)) + bytes(15) + b"\x01" + struct.pack(">HH", 443, 9092)
    unix = b"/var/run/lb.sock".ljust(108, b"\x00") + b"/var/run/kafka.sock".ljust(108, b"\x00")
    tlv = b"\x01\x00\x02h2" + b"\x02\x00\x0bkafka.local"
    return [
        b"PROXY TCP4 192.168.0.1 10.0.0.1 56324 9092\r\n",
        b"PROXY TCP6 2001:db8::1 2001:db8::2 56324 9092\r\n",
        b"PROXY UNKNOWN\r\n",
        b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n",
        binary(1, 0x11, inet),
        binary(1, 0x11, inet + tlv),
        binary(1, 0x21, inet6),
        binary(1, 0x31, unix),
        binary(0, 0x00, b""),
        binary(0, 0x00, tlv),
        binary(1, 0x00, b""),
    ]


# ---- the whole recording ------------------------------------------------------------------


def record(out: Path) -> dict[str, int]:
    workdir = Path(tempfile.mkdtemp(prefix="kqp-record-"))
    users = workdir / "users.yaml"
    store = CredentialStore()
    store.add("alice", PASSWORD)
    save_credentials(store, users)
    broker = Broker().start()
    relay = RecordingRelay()
    proxies: list[ProxyProcess] = []
    try:
        node_id = broker.node_id()
        plain = ProxyProcess(broker.address, node_id, extra_config={"advertised_host": RELAY_HOST})
        terminating = ProxyProcess(broker.address, node_id, extra_config={
            "advertised_host": RELAY_HOST, "sasl": {"mode": "terminate", "credentials_file": str(users)}})
        for proxy in (plain, terminating):
            proxies.append(proxy.start())
            relay.listen(proxy.port)
            relay.listen(proxy.node_port)
        bootstrap = f"{RELAY_HOST}:{plain.port}"
        topic = f"fuzz-{uuid.uuid4().hex[:8]}"
        _confluent(bootstrap, topic)
        _kafka_python(bootstrap, topic)
        _aiokafka(bootstrap, topic)
        _quota_requests(bootstrap)
        sasl_bootstrap = f"{RELAY_HOST}:{terminating.port}"
        for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            _confluent(sasl_bootstrap, f"{topic}-{mechanism.lower()}", {
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
                "sasl.username": "alice", "sasl.password": PASSWORD})
            kp = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
                  "sasl_plain_username": "alice", "sasl_plain_password": PASSWORD}
            _kafka_python(sasl_bootstrap, f"{topic}-{mechanism.lower()}", kp)
            _aiokafka(sasl_bootstrap, f"{topic}-{mechanism.lower()}", kp)
        time.sleep(1)
    finally:
        for proxy in proxies:
            proxy.stop()
        relay.stop()
        broker.stop()
    corpus = Corpus()
    cut(relay.connections, corpus)
    corpus.write(out)
    return {target: len(corpus.inputs[target]) for target in TARGETS}


def add_made(out: Path) -> dict[str, int]:
    """The made inputs, and what the targets added since the recording take from the recorded
    inputs already in `out` (request frames for well_formed, spliced responses for splice), added
    to `out` without recording. The counts are of the inputs added."""
    corpus = Corpus()
    for path in sorted((out / "request_header").iterdir()):
        data = path.read_bytes()
        corpus.add("well_formed", data, ("recorded", path.name))
    for target in ("throttle", "rewrite"):
        for path in sorted((out / target).iterdir()):
            data = path.read_bytes()
            if RESPONSE_PREFIX.unpack_from(data)[0] in made.SPLICED:
                corpus.add("splice", data, ("recorded", path.name))
    for target, data, kind in made.inputs():
        corpus.add(target, data, kind)
    corpus.write(out, replace=False)
    return {target: len(corpus.inputs[target]) for target in TARGETS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=CORPUS)
    parser.add_argument("--made", action="store_true",
                        help="record nothing: add the made inputs to the corpus in --out")
    args = parser.parse_args()
    counts = add_made(args.out) if args.made else record(args.out)
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    for target, n in counts.items():
        print(f"{target:16} {n:4} inputs")
    print(f"{sum(counts.values())} inputs, {total} bytes, in {args.out}")
    assert set(codec())  # the codec loaded: the recording used the proxy's own framing


if __name__ == "__main__":
    main()
