"""ProxyHeaderParser: PROXY protocol v1 and v2 headers in, a ProxyHeader and the rest out."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.proxy_protocol import (
    V1_MAX_LENGTH,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderParser,
    ProxyProtocolError,
)

# A Kafka ApiVersions request as it follows the header: size prefix, then the request.
KAFKA = struct.pack(">i", 10) + b"\x00\x12\x00\x03\x00\x00\x00\x01\x00\x00"


def v2(command: int, family_protocol: int, body: bytes, version: int = 2) -> bytes:
    fixed = bytes([(version << 4) | command, family_protocol]) + struct.pack(">H", len(body))
    return V2_SIGNATURE + fixed + body


def inet(src: str, dst: str, sport: int, dport: int) -> bytes:
    return (ipaddress.ip_address(src).packed + ipaddress.ip_address(dst).packed
            + struct.pack(">HH", sport, dport))


def tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + struct.pack(">H", len(value)) + value


def parse_all(data: bytes) -> tuple[ProxyHeader, bytes]:
    parser = ProxyHeaderParser()
    header = parser.feed(data)
    assert header is not None
    return header, parser.remaining


def reason_of(data: bytes) -> str:
    with pytest.raises(ProxyProtocolError) as info:
        ProxyHeaderParser().feed(data)
    assert info.value.kind == "proxy_protocol"
    assert isinstance(info.value, ProtocolError)
    return info.value.reason


# ---- version 1 ----


def test_v1_spec_example_with_following_data() -> None:
    request = b"GET / HTTP/1.1\r\nHost: 192.168.0.11\r\n\r\n"
    header, rest = parse_all(b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n" + request)
    assert header == ProxyHeader(("192.168.0.1", 56324), ("192.168.0.11", 443), 1, False, "TCP4")
    assert rest == request


def test_v1_longest_tcp4_line() -> None:
    line = b"PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n"
    assert len(line) == 56
    header, rest = parse_all(line + KAFKA)
    assert header.source == ("255.255.255.255", 65535) and header.destination == ("255.255.255.255", 65535)
    assert rest == KAFKA


def test_v1_longest_tcp6_line() -> None:
    full = ":".join(["ffff"] * 8)
    line = f"PROXY TCP6 {full} {full} 65535 65535\r\n".encode()
    assert len(line) == 104
    header, rest = parse_all(line)
    assert header == ProxyHeader((full, 65535), (full, 65535), 1, False, "TCP6")
    assert rest == b""


def test_v1_tcp6_addresses_are_normalised() -> None:
    header, _ = parse_all(b"PROXY TCP6 2001:DB8:0:0:0:0:0:1 ::1 0 9092\r\n")
    assert header.source == ("2001:db8::1", 0)
    assert header.destination == ("::1", 9092)


def test_v1_unknown_short_and_worst_case_forms() -> None:
    assert parse_all(b"PROXY UNKNOWN\r\n" + KAFKA) == (ProxyHeader(None, None, 1, False, "UNKNOWN"), KAFKA)
    full = ":".join(["ffff"] * 8)
    worst = f"PROXY UNKNOWN {full} {full} 65535 65535\r\n".encode()
    assert len(worst) == V1_MAX_LENGTH == 107
    assert parse_all(worst + KAFKA) == (ProxyHeader(None, None, 1, False, "UNKNOWN"), KAFKA)


def test_v1_unknown_ignores_whatever_follows_it() -> None:
    header, _ = parse_all(b"PROXY UNKNOWN anything at all\r\n")
    assert header.source is None and not header.local


def test_v1_line_without_crlf_in_107_bytes_is_too_long() -> None:
    line = b"PROXY UNKNOWN " + b"x" * (V1_MAX_LENGTH - 14)
    assert len(line) == 107
    assert reason_of(line) == "too_long"
    # One byte less is still a header in progress.
    assert ProxyHeaderParser().feed(line[:-1]) is None


def test_v1_crlf_just_past_the_limit_is_too_long() -> None:
    full = ":".join(["ffff"] * 8)
    line = f"PROXY UNKNOWN {full} {full} 65535 655350\r\n".encode()
    assert len(line) == 108
    assert reason_of(line) == "too_long"


@pytest.mark.parametrize("data", [
    b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",  # bare LF
    b"\n",
    b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\r\n",  # CR inside the line
    b"PROXY TCP4 1.2.3.4\xff 5.6.7.8 1 2\r\n",  # not ASCII
])
def test_v1_line_must_be_ascii_and_end_in_crlf(data: bytes) -> None:
    assert reason_of(data) in ("garbage", "bad_address")


@pytest.mark.parametrize("line, reason", [
    (b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n", "unknown_family"),
    (b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n", "unknown_family"),
    (b"PROXY  TCP4 1.2.3.4 5.6.7.8 1 2\r\n", "unknown_family"),  # two spaces
    (b"PROXY\r\n", "garbage"),  # "PROXY" without the space after it
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "bad_address"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", "bad_address"),
    (b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", "bad_address"),
    (b"PROXY TCP4 256.2.3.4 5.6.7.8 1 2\r\n", "bad_address"),
    (b"PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n", "bad_address"),  # heading zero
    (b"PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n", "bad_address"),
    (b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n", "bad_address"),  # IPv6 under TCP4
    (b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n", "bad_address"),  # IPv4 under TCP6
    (b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n", "bad_address"),  # scope id
    (b"PROXY TCP6 1::2::3 ::1 1 2\r\n", "bad_address"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", "bad_address"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 0443 2\r\n", "bad_address"),  # heading zero
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n", "bad_address"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n", "bad_address"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 \r\n", "bad_address"),
])
def test_v1_invalid_lines(line: bytes, reason: str) -> None:
    assert reason_of(line) == reason


def test_v1_port_zero_is_allowed() -> None:
    header, _ = parse_all(b"PROXY TCP4 1.2.3.4 5.6.7.8 0 0\r\n")
    assert header.source == ("1.2.3.4", 0)


# ---- version 2 ----


def test_v2_tcp4_with_following_data() -> None:
    data = v2(0x1, 0x11, inet("203.0.113.7", "10.0.0.1", 51000, 9092)) + KAFKA
    header, rest = parse_all(data)
    assert header == ProxyHeader(("203.0.113.7", 51000), ("10.0.0.1", 9092), 2, False, "TCP4")
    assert rest == KAFKA


def test_v2_tcp6() -> None:
    header, rest = parse_all(v2(0x1, 0x21, inet("2001:db8::7", "::ffff:10.0.0.1", 1, 65535)))
    assert header == ProxyHeader(("2001:db8::7", 1), ("::ffff:a00:1", 65535), 2, False, "TCP6")
    assert rest == b""


def test_v2_tlvs_are_skipped() -> None:
    tlvs = (tlv(0x02, b"kafka.example.com")  # PP2_TYPE_AUTHORITY
            + tlv(0x20, b"\x01\x00\x00\x00\x00" + tlv(0x21, b"TLSv1.3"))  # PP2_TYPE_SSL
            + tlv(0x04, b"")  # PP2_TYPE_NOOP
            + tlv(0xE0, bytes(300)))  # application-specific
    data = v2(0x1, 0x11, inet("198.51.100.1", "10.0.0.2", 40000, 9093) + tlvs) + KAFKA
    header, rest = parse_all(data)
    assert header.source == ("198.51.100.1", 40000) and header.destination == ("10.0.0.2", 9093)
    assert rest == KAFKA


def test_v2_local_has_no_address_and_skips_its_block() -> None:
    assert parse_all(v2(0x0, 0x00, b"") + KAFKA) == (ProxyHeader(None, None, 2, True, "UNKNOWN"), KAFKA)
    # The length counts even for LOCAL, and the family is ignored, even an undefined one.
    block = inet("1.2.3.4", "5.6.7.8", 1, 2) + tlv(0x04, b"pad")
    for family in (0x11, 0x21, 0xF5):
        header, rest = parse_all(v2(0x0, family, block) + KAFKA)
        assert header == ProxyHeader(None, None, 2, True, "UNKNOWN") and rest == KAFKA


def test_v2_unspec_family_or_protocol_means_no_address() -> None:
    for family in (0x00, 0x10, 0x20, 0x30):
        header, rest = parse_all(v2(0x1, family, bytes(12)) + KAFKA)
        assert header == ProxyHeader(None, None, 2, False, "UNKNOWN") and rest == KAFKA


def test_v2_unix_paths_never_become_an_ip_source() -> None:
    body = b"/run/client.sock".ljust(108, b"\x00") + b"/run/kafka.sock".ljust(108, b"\x00")
    header, rest = parse_all(v2(0x1, 0x31, body) + KAFKA)
    assert header == ProxyHeader(None, None, 2, False, "UNIX", "/run/client.sock", "/run/kafka.sock")
    assert rest == KAFKA


@pytest.mark.parametrize("data, reason", [
    (v2(0x1, 0x11, inet("1.2.3.4", "5.6.7.8", 1, 2), version=1), "unsupported_version"),
    (v2(0x1, 0x11, inet("1.2.3.4", "5.6.7.8", 1, 2), version=3), "unsupported_version"),
    (v2(0x2, 0x11, inet("1.2.3.4", "5.6.7.8", 1, 2)), "unknown_command"),
    (v2(0xF, 0x11, b""), "unknown_command"),
    (v2(0x1, 0x41, bytes(12)), "unknown_family"),
    (v2(0x1, 0x13, bytes(12)), "unknown_family"),
    (v2(0x1, 0x12, inet("1.2.3.4", "5.6.7.8", 1, 2)), "unknown_family"),  # UDP
    (v2(0x1, 0x11, bytes(11)), "bad_address"),
    (v2(0x1, 0x21, bytes(12)), "bad_address"),
    (v2(0x1, 0x31, bytes(215)), "bad_address"),
])
def test_v2_invalid_headers(data: bytes, reason: str) -> None:
    assert reason_of(data) == reason


def test_v2_bad_version_fails_before_the_address_block_arrives() -> None:
    # The 16 fixed bytes announce 12 more; the error does not wait for them.
    assert reason_of(v2(0x1, 0x11, bytes(12), version=1)[:16]) == "unsupported_version"
    assert reason_of(v2(0x1, 0x41, bytes(12))[:16]) == "unknown_family"


def test_v2_waits_for_the_whole_announced_length() -> None:
    data = v2(0x1, 0x11, inet("1.2.3.4", "5.6.7.8", 1, 2) + tlv(0x04, bytes(1000)))
    parser = ProxyHeaderParser()
    assert parser.feed(data[:-1]) is None
    assert parser.feed(data[-1:]) is not None


# ---- no header at all ----


@pytest.mark.parametrize("data", [
    KAFKA,  # a client that bypassed the load balancer
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello
    b"GET / HTTP/1.1\r\n",
    b"proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n",  # lower case
    b"PROXYTCP4",
    b"\r\n\r\n\x00\r\nQUIX\n",  # almost the v2 signature
    b"\r\n\r\n\x01",
])
def test_anything_but_a_header_is_refused_at_once(data: bytes) -> None:
    assert reason_of(data) == "garbage"


def test_garbage_message_hints_at_a_kafka_client() -> None:
    with pytest.raises(ProxyProtocolError, match="Kafka request"):
        ProxyHeaderParser().feed(KAFKA)


def test_garbage_is_detected_on_the_first_wrong_byte() -> None:
    parser = ProxyHeaderParser()
    assert parser.feed(b"PRO") is None
    with pytest.raises(ProxyProtocolError):
        parser.feed(b"Z")


def test_empty_feed_needs_more() -> None:
    assert ProxyHeaderParser().feed(b"") is None


def test_eof_before_the_header_is_complete_is_an_error() -> None:
    parser = ProxyHeaderParser()
    parser.feed(b"PROXY TCP4 1.2.3.4")
    with pytest.raises(ProxyProtocolError) as info:
        parser.feed_eof()
    assert info.value.reason == "truncated"
    with pytest.raises(ProxyProtocolError):
        ProxyHeaderParser().feed_eof()  # nothing at all


def test_eof_after_the_header_is_fine() -> None:
    parser = ProxyHeaderParser()
    parser.feed(b"PROXY UNKNOWN\r\n")
    parser.feed_eof()
    assert parser.header == ProxyHeader(None, None, 1, False, "UNKNOWN")


def test_feed_after_the_header_is_a_caller_bug() -> None:
    parser = ProxyHeaderParser()
    parser.feed(b"PROXY UNKNOWN\r\n")
    with pytest.raises(RuntimeError):
        parser.feed(KAFKA)


# ---- split at every byte boundary ----

STREAMS = [
    b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n" + KAFKA,
    b"PROXY TCP6 2001:db8::1 2001:db8::2 65535 9092\r\n" + KAFKA,
    b"PROXY UNKNOWN\r\n" + KAFKA,
    v2(0x1, 0x11, inet("203.0.113.7", "10.0.0.1", 51000, 9092) + tlv(0x02, b"sni.example")) + KAFKA,
    v2(0x1, 0x21, inet("2001:db8::7", "2001:db8::8", 1, 2)) + KAFKA,
    v2(0x0, 0x00, b"") + KAFKA,
]


def header_length(stream: bytes) -> int:
    return len(stream) - len(KAFKA)


@pytest.mark.parametrize("stream", STREAMS)
def test_one_byte_at_a_time(stream: bytes) -> None:
    expected, _ = parse_all(stream)
    parser = ProxyHeaderParser()
    end = header_length(stream)
    for i in range(end - 1):
        assert parser.feed(stream[i:i + 1]) is None
    assert parser.feed(stream[end - 1:end]) == expected
    assert parser.remaining == b""


@pytest.mark.parametrize("stream", STREAMS)
def test_split_in_two_at_every_boundary(stream: bytes) -> None:
    expected, _ = parse_all(stream)
    end = header_length(stream)
    for cut in range(len(stream) + 1):
        parser = ProxyHeaderParser()
        first = parser.feed(stream[:cut])
        if cut < end:
            assert first is None, cut
            assert parser.feed(stream[cut:]) == expected
            assert parser.remaining == KAFKA
        else:
            assert first == expected, cut
            assert parser.remaining + stream[cut:] == KAFKA
