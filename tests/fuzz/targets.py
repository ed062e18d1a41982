"""The fuzz targets: one function per decoder that sees client or broker bytes, each taking the
raw input bytes and calling the proxy's own code the way the data path does.

The only exceptions a target lets through are the ones its decoder documents: `ProtocolError`
(protocol/errors.py) for Kafka bytes and the PROXY header, `SaslTokenError` and
`SaslAuthenticationError` for SASL tokens. A target returns normally for those; anything else it
raises (an IndexError, a struct.error, an AssertionError from a check below) is a crash.

Pure Python with no fuzzer in sight: the same functions run under atheris (`make fuzz`,
tests/fuzz/atheris_main.py) and as a plain replay of the corpus in `make test`
(tests/fuzz/test_replay.py). Input formats, as recorded by tests/fuzz/record.py (and, for the
Kafka 4 APIs a recording through Tansu never sees, made from their schemas by tests/fuzz/made.py):

- framing: 1 byte seed for where the stream is cut into chunks, then the byte stream;
- request_header, well_formed, produce, fetch, share_fetch, client_quotas: one whole request
  frame (size prefix included);
- rewrite, throttle, share_fetch_response, splice: api_key int16, api_version int16, then one
  whole response frame;
- sasl: 1 byte selector (mechanism and role), then the client's token; for SCRAM a 0xFF byte
  (never in UTF-8) separates the client-first from the client-final message;
- proxy_protocol: 1 byte seed for the chunk cuts, then the first bytes of a connection.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from kafka.protocol.producer.produce import ProduceResponse

from kafka_quota_proxy.identity.credentials import CredentialStore, PlainVerifier, UserCredentials
from kafka_quota_proxy.identity.sasl_server import SaslAuthenticationError, SaslServer
from kafka_quota_proxy.identity.sasl_tokens import (
    SaslTokenError,
    oauthbearer_claim,
    parse_oauthbearer_initial_response,
    parse_scram_client_first,
    plain_authcid,
    scram_is_client_first,
)
from kafka_quota_proxy.protocol.api_keys import (
    ALTER_CLIENT_QUOTAS,
    API_VERSIONS,
    DESCRIBE_CLIENT_QUOTAS,
    DESCRIBE_CONFIGS,
    FETCH,
    INCREMENTAL_ALTER_CONFIGS,
    PRODUCE,
    SHARE_FETCH,
)
from kafka_quota_proxy.protocol.api_versions import intersect
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.error_codes import INVALID_SHARE_SESSION_EPOCH, NONE
from kafka_quota_proxy.protocol.errors import MalformedMessage, ProtocolError
from kafka_quota_proxy.protocol.fetch import read_fetch_request, session_id
from kafka_quota_proxy.protocol.framing import FrameDecoder, FrameHead, FramePiece, StreamingFrameDecoder
from kafka_quota_proxy.protocol.headers import (
    parse_request_header,
    response_body_offset,
    response_correlation_id,
)
from kafka_quota_proxy.protocol.messages import decode_response
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.produce import produce_acks, producer_ids, record_sets
from kafka_quota_proxy.protocol.proxy_protocol import ProxyHeaderParser
from kafka_quota_proxy.protocol.rewrite import carries_addresses, rewrite_addresses
from kafka_quota_proxy.protocol.share_fetch import (
    read_share_fetch_head,
    read_share_fetch_request,
    share_fetch_topics,
    throttled_share_fetch_body,
)
from kafka_quota_proxy.protocol.throttle import patched, read_throttle, throttle_offset
from kafka_quota_proxy.protocol.well_formed import check_request
from kafka_quota_proxy.proxy.cluster import Cluster
from kafka_quota_proxy.proxy.stages.client_quotas_api import (
    SERVED,
    alter_entries,
    alter_response,
    describe_components,
    describe_response,
)
from kafka_quota_proxy.proxy.stages.topic_configs import broker_results, described, merged_response
from kafka_quota_proxy.proxy.stages.topic_quotas import appended
from kafka_quota_proxy.quota.admin_api import alter_client_quotas, describe_client_quotas
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.topic_configs import DescribeAdditions
from kafka_quota_proxy.quota.topics import Leadership
from tests.support.messages import has_nullable_struct

Target = Callable[[bytes], None]

# Small limits, so that short inputs reach the size checks and the streamed path.
MAX_FRAME_BYTES = 1 << 20
STREAM_FROM = 64
HEAD_BYTES = 16
GATHER_FROM = 32  # FrameDecoder: split frames from 32 bytes gathered into one buffer, smaller joined
RESPONSE_PREFIX = struct.Struct(">hh")  # api_key, api_version in front of a response frame
SCRAM_SEPARATOR = b"\xff"
SASL_ROLES = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


def _chunks(data: bytes, seed: int) -> list[bytes]:
    """`data` cut at places drawn from `seed` (0: the whole at once): chunk sizes cycle through
    eight values from 1 to 256, so one input can have a 1-byte chunk beside a large one."""
    if seed == 0:
        return [data]
    sizes = [1 + (seed * (2 * k + 1) * 37) % 256 for k in range(8)]
    out, pos, k = [], 0, 0
    while pos < len(data):
        out.append(data[pos:pos + sizes[k % 8]])
        pos += sizes[k % 8]
        k += 1
    return out


# ---- framing ------------------------------------------------------------------------------


def framing(data: bytes) -> None:
    """Both frame decoders over the same stream, cut into chunks: they must agree with each
    other and with the stream (every frame is the bytes it was cut from)."""
    if not data:
        return
    stream = data[1:]
    chunks = _chunks(stream, data[0])
    whole: list[bytes] = []
    whole_error: type[Exception] | None = None
    decoder = FrameDecoder(MAX_FRAME_BYTES, GATHER_FROM)
    try:
        for chunk in chunks:
            whole += [bytes(f) for f in decoder.feed(chunk)]
    except ProtocolError as exc:
        whole_error = type(exc)
    streamed: list[bytes] = []
    streamed_error: type[Exception] | None = None
    current = bytearray()
    streaming = StreamingFrameDecoder(MAX_FRAME_BYTES, STREAM_FROM, HEAD_BYTES)
    try:
        for chunk in chunks:
            for event in streaming.feed(chunk):
                if isinstance(event, FrameHead):
                    assert not current and event.size >= STREAM_FROM and len(event.data) == HEAD_BYTES
                    current += event.data
                elif isinstance(event, FramePiece):
                    assert current, "a piece without a head"
                    current += event.data
                    if event.last:
                        streamed.append(bytes(current))
                        current.clear()
                else:
                    assert not current, "a whole frame in the middle of a streamed one"
                    streamed.append(bytes(event))
    except ProtocolError as exc:
        streamed_error = type(exc)
    assert whole == streamed, "the two decoders cut different frames"
    assert whole_error is streamed_error, (whole_error, streamed_error)
    joined = b"".join(whole)
    assert stream.startswith(joined), "a frame is not the bytes it was cut from"
    for frame in whole:
        assert len(frame) == 4 + struct.unpack_from(">i", frame)[0]
    if whole_error is None:
        assert decoder.buffered == len(stream) - len(joined)


# ---- requests -----------------------------------------------------------------------------


def request_header(data: bytes) -> None:
    """The request header of every API and version, and the response header read from the same
    bytes (the proxy reads a response's correlation id before it knows the request)."""
    frame = memoryview(data)
    try:
        header = parse_request_header(frame)
    except ProtocolError:
        pass
    else:
        assert 12 <= header.body_offset <= len(frame)
        assert header.spec is not None or header.api_key == 18
    try:
        response_correlation_id(frame)
        for version in (0, 1):
            assert response_body_offset(frame, version) <= len(frame)
    except ProtocolError:
        pass


def well_formed(data: bytes) -> None:
    """A request body checked by its schema, as WellFormed checks every request before any stage
    reads it: the schemas of the Kafka 4 APIs kafka-python lacks are Kafka's own JSON, vendored
    (protocol/apis.py). A body that passes has true lengths, so the codec class built from the
    same JSON decodes it without running out of bytes (tests/protocol/test_well_formed_properties.py
    has the same property): it may still refuse text that is not UTF-8 or a bool that is not 0
    or 1, which are not this check's to judge, and it reads a nullable struct's marker otherwise
    than Kafka does (tests/support/messages.has_nullable_struct; found by this target)."""
    frame = memoryview(data)
    try:
        header = parse_request_header(frame)
        check_request(frame, header)
    except ProtocolError:
        return
    if header.spec is None:
        return  # an ApiVersions newer than the codec: ApiVersionsGate answers it, unchecked
    try:
        header.spec.request.decode(data[header.body_offset:], version=header.api_version)
    except (UnicodeDecodeError, ValueError):
        pass
    except (IndexError, struct.error):
        if not has_nullable_struct(header.spec.request, header.api_version):
            raise


def _header_for(data: bytes, api_key: int) -> Any:
    header = parse_request_header(memoryview(data))
    return header if header.api_key == api_key and header.spec is not None else None


def produce(data: bytes) -> None:
    """A Produce request as quota_charge reads it: acks, each partition's records, producer ids."""
    frame = memoryview(data)
    try:
        header = _header_for(data, PRODUCE)
        if header is None:
            return
        produce_acks(frame, header.body_offset, header.api_version)
        for records in record_sets(frame, header.body_offset, header.api_version):
            assert isinstance(records, memoryview) and len(records) > 0
        for pid in producer_ids(frame, header.body_offset, header.api_version):
            assert pid >= 0
    except ProtocolError:
        pass


def fetch(data: bytes) -> None:
    """A Fetch request as quota_charge reads it (replica id, max_wait_ms, where max_bytes is)."""
    frame = memoryview(data)
    try:
        header = _header_for(data, FETCH)
        if header is None:
            return
        info = read_fetch_request(frame, header.body_offset, header.api_version)
        if info.max_bytes_at is not None:
            assert info.max_bytes_at + 4 <= len(frame)
            assert struct.unpack_from(">i", frame, info.max_bytes_at)[0] == info.max_bytes
    except ProtocolError:
        pass


def share_fetch(data: bytes) -> None:
    """A ShareFetch request as quota_charge reads it (max_wait_ms, where MaxBytes is)."""
    frame = memoryview(data)
    try:
        header = _header_for(data, SHARE_FETCH)
        if header is None:
            return
        info = read_share_fetch_request(frame, header.body_offset)
    except ProtocolError:
        return
    assert header.body_offset <= info.max_bytes_at and info.max_bytes_at + 4 <= len(frame)
    assert struct.unpack_from(">i", frame, info.max_bytes_at)[0] == info.max_bytes


_QUOTAS: dict[QuotaEntity, dict[QuotaKey, float]] = {
    QuotaEntity(user="alice"): {QuotaKey.PRODUCER_BYTE_RATE: 1048576.0},
    QuotaEntity(client_id="<default>"): {QuotaKey.CONSUMER_BYTE_RATE: 2097152.0},
    QuotaEntity(ip="10.0.0.1"): {QuotaKey.CONNECTION_CREATION_RATE: 10.0},
}


def client_quotas(data: bytes) -> None:
    """DescribeClientQuotas and AlterClientQuotas as proxy/stages/client_quotas_api.py answers
    them: decoded (RequestContext.decode_request), run against a quota store, answered."""
    try:
        header = parse_request_header(memoryview(data))
        if header.api_key not in (DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS) or header.spec is None:
            return
        version = header.api_version
        try:
            request = header.spec.request.decode(data[header.body_offset:], version=version)
        except Exception as exc:  # as RequestContext.decode_request: the client's malformed body
            raise MalformedMessage(str(exc)) from exc
        if header.api_key == DESCRIBE_CLIENT_QUOTAS:
            components = describe_components(request)
        else:
            wire = alter_entries(request)
    except ProtocolError:
        return
    if header.api_key == DESCRIBE_CLIENT_QUOTAS:
        describe_response(describe_client_quotas(_QUOTAS, components, request.strict), version)
        return
    results = alter_client_quotas(_QUOTAS, wire, request.validate_only).results
    assert len(results) == len(wire)
    alter_response(results, wire, version)


# ---- responses ----------------------------------------------------------------------------


def _response(data: bytes) -> tuple[int, int, memoryview] | None:
    """(api_key, version, body) of a prefixed response frame, None if the prefix names no API."""
    if len(data) < RESPONSE_PREFIX.size:
        return None
    api_key, version = RESPONSE_PREFIX.unpack_from(data)
    spec = codec().get(api_key)
    if spec is None or not 0 <= version <= spec.max_version:
        return None
    frame = memoryview(data)[RESPONSE_PREFIX.size:]
    response_correlation_id(frame)
    body_at = response_body_offset(frame, spec.response_header_version(version))
    if body_at > len(frame):
        raise MalformedMessage("response header runs past the frame")
    return api_key, version, frame[body_at:]


def _mapper(node_id: int, host: str, port: int) -> tuple[str, int]:
    return "proxy.example", 9093 + (node_id % 1000)


def rewrite(data: bytes) -> None:
    """A broker's response through the address-rewriting stage (and the proxy's Metadata view)."""
    try:
        found = _response(data)
        if found is None:
            return
        api_key, version, body = found
        # What Cluster.observe_metadata fills in.
        seen = SimpleNamespace(topics={}, nodes={}, leadership=Leadership())

        def observe(msg: Any) -> None:
            Cluster.observe_metadata(seen, msg)  # type: ignore[arg-type]
        new = rewrite_addresses(api_key, version, body, _mapper, observe)
    except ProtocolError:
        return
    if new is None:
        return
    assert carries_addresses(api_key, version)
    out = new.join() if isinstance(new, Pieces) else new
    assert isinstance(out, bytes)


def throttle(data: bytes) -> None:
    """throttle_time_ms found, read and patched, as the throttle merge and quota settle stages do."""
    try:
        found = _response(data)
        if found is None:
            return
        api_key, version, body = found
        at = throttle_offset(api_key, version, body)
        if api_key == FETCH and at is not None:  # quota_settle empties an over-quota Fetch
            session_id(body, version)
    except ProtocolError:
        return
    if at is None:
        return
    assert 0 <= at and at + 4 <= len(body)
    before = read_throttle(body, at)
    new = patched(body, at, before + 1 if before < 2**31 - 1 else 0).join()
    assert len(new) == len(body)
    assert read_throttle(memoryview(new), at) == (before + 1 if before < 2**31 - 1 else 0)
    assert new[:at] == body[:at] and new[at + 4:] == body[at + 4:]


def share_fetch_response(data: bytes) -> None:
    """A ShareFetch response as the stages read it: its head (quota_settle), its record bytes per
    topic (topic_quotas, topic_usage), and Kafka's throttled answer built from that head, as
    `share_fetch_throttle: empty` sends it, which must read back as built."""
    try:
        found = _response(data)
        if found is None or found[0] != SHARE_FETCH:
            return
        _, version, body = found
        head = read_share_fetch_head(body, version)
        topics = share_fetch_topics(body, version)
    except ProtocolError:
        return
    assert all(len(t.topic_id) == 16 and 0 <= t.size <= len(body) for t in topics)
    if head.error_code not in (NONE, INVALID_SHARE_SESSION_EPOCH):
        return
    out = memoryview(throttled_share_fetch_body(version, head.throttle_time_ms, head.error_code,
                                                head.acquisition_lock_timeout_ms))
    assert read_share_fetch_head(out, version) == head
    assert share_fetch_topics(out, version) == []


_ADDED_TOPIC = ProduceResponse.TopicProduceResponse(name="refused", topic_id=None, partition_responses=[
    ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
        index=0, error_code=19, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
        record_errors=[], error_message="refused", current_leader=None)])


def splice(data: bytes) -> None:
    """The broker responses a stage changes by splicing into the broker's bytes, every byte it
    does not change (unknown tagged fields included) kept: ApiVersions intersected
    (api_versions.py), a Produce answer with a refused topic added (topic_quotas.py), a
    DescribeConfigs answer with topics' quota entries and an IncrementalAlterConfigs answer with
    the proxy's results merged in (topic_configs.py). What comes out of bytes the codec decodes
    decodes too."""
    try:
        found = _response(data)
        if found is None or found[0] not in (API_VERSIONS, PRODUCE, DESCRIBE_CONFIGS,
                                             INCREMENTAL_ALTER_CONFIGS):
            return
        api_key, version, body = found
        out: bytes | None
        if api_key == API_VERSIONS:
            out = intersect(body, version, SERVED)
        elif api_key == PRODUCE:
            out = appended(body, version, [_ADDED_TOPIC]).join()
        elif api_key == DESCRIBE_CONFIGS:
            msg = decode_response(api_key, version, body)  # as the stage does first
            # The stage's plan comes from the request: here, a quota entry for every topic named.
            plan = DescribeAdditions({r.resource_name: [("producer_byte_rate", "1024")]
                                      for r in msg.results or ()}, synonyms=True, documentation=True)
            out = described(body, version, msg, plan)
        else:
            broker = broker_results(decode_response(api_key, version, body))
            merged = broker[::2] + [(2, "quota-topic", 0, None)]  # some the broker's, one the proxy's
            out = merged_response(body, version, broker, merged)
    except ProtocolError:
        return
    if out is None:
        return
    # Kafka writes an UNSUPPORTED_VERSION answer to ApiVersions in v0 (KIP-511).
    answered = 0 if api_key == API_VERSIONS and _unsupported(body) else version
    if api_key in (API_VERSIONS, PRODUCE):  # the others were decoded above
        try:
            decode_response(api_key, answered, body)
        except ProtocolError:
            return  # bytes the walk takes and the codec does not: nothing to hold the output to
    decode_response(api_key, answered, out)


def _unsupported(body: memoryview) -> bool:
    """An ApiVersions answer of UNSUPPORTED_VERSION, which Kafka writes in v0 (KIP-511)."""
    return len(body) >= 2 and struct.unpack_from(">h", body)[0] == 35


# ---- SASL ---------------------------------------------------------------------------------


def _store() -> CredentialStore:
    """alice with every mechanism; PLAIN at one PBKDF2 iteration so that fuzzing stays fast
    (the store's own `add` insists on Kafka's minimum, which costs ~50 ms a check)."""
    store = CredentialStore()
    store.add("alice", "alice-Secret-1", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
    import hashlib
    salt = b"0123456789abcdef"
    plain = PlainVerifier(salt, 1, hashlib.pbkdf2_hmac("sha512", b"alice-Secret-1", salt, 1))
    scram = store.entries()["alice"].scram
    return CredentialStore({"alice": UserCredentials(scram, plain)})


_STORE = _store()


def sasl(data: bytes) -> None:
    """A client's SASL token as passthrough reads it (sasl_tokens) and as termination checks it
    (SaslServer); the selector byte picks the mechanism."""
    if not data:
        return
    mechanism = SASL_ROLES[data[0] % len(SASL_ROLES)]
    first, _, final = data[1:].partition(SCRAM_SEPARATOR)
    try:
        if mechanism == "PLAIN":
            plain_authcid(first)
        elif mechanism == "OAUTHBEARER":
            parse_oauthbearer_initial_response(first)
            oauthbearer_claim(first, "sub")
        else:
            scram_is_client_first(first)
            parse_scram_client_first(first)
    except SaslTokenError:
        pass
    if mechanism == "OAUTHBEARER":
        return
    server = SaslServer(mechanism, _STORE)
    try:
        step = server.step(first)
        if not step.done and final:
            step = server.step(final)
        if step.done:
            assert step.principal == "alice"
    except SaslAuthenticationError:
        pass


# ---- PROXY protocol -----------------------------------------------------------------------


def proxy_protocol(data: bytes) -> None:
    """The PROXY header parser fed a connection's first bytes in chunks, then the end."""
    if not data:
        return
    parser = ProxyHeaderParser()
    stream = data[1:]
    fed = 0
    try:
        for chunk in _chunks(stream, data[0]):
            fed += len(chunk)
            header = parser.feed(chunk)
            if header is not None:
                assert stream[:fed].endswith(parser.remaining)
                assert header.version in (1, 2)
                return
        parser.feed_eof()
    except ProtocolError:
        pass


TARGETS: dict[str, Target] = {
    "framing": framing,
    "request_header": request_header,
    "well_formed": well_formed,
    "produce": produce,
    "fetch": fetch,
    "share_fetch": share_fetch,
    "client_quotas": client_quotas,
    "rewrite": rewrite,
    "throttle": throttle,
    "share_fetch_response": share_fetch_response,
    "splice": splice,
    "sasl": sasl,
    "proxy_protocol": proxy_protocol,
}
