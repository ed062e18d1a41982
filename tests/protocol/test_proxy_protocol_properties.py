"""Properties of the PROXY protocol v1/v2 header parser: any header the specification allows,
split anywhere and followed by anything, is read back exactly, with the following bytes left
for the Kafka stream; anything else raises only ProxyProtocolError (a ProtocolError)."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from hypothesis import example, given
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.proxy_protocol import (
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderParser,
    ProxyProtocolError,
)
from tests.support.mutations import mutated

PORTS = st.integers(0, 65535)


@dataclass(frozen=True)
class Case:
    wire: bytes
    header: ProxyHeader


@st.composite
def v1_headers(draw: st.DrawFn) -> Case:
    family = draw(st.sampled_from(["TCP4", "TCP6", "UNKNOWN"]))
    if family == "UNKNOWN":
        # Whatever follows UNKNOWN is ignored (printable, no CR/LF, within the 107-byte line).
        junk = draw(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80))
        return Case(f"PROXY UNKNOWN{' ' + junk if junk else ''}\r\n".encode(),
                    ProxyHeader(None, None, 1, False, "UNKNOWN"))
    v = 4 if family == "TCP4" else 6
    src, dst = draw(st.ip_addresses(v=v)), draw(st.ip_addresses(v=v))
    sport, dport = draw(PORTS), draw(PORTS)
    line = f"PROXY {family} {src} {dst} {sport} {dport}\r\n".encode()
    return Case(line, ProxyHeader((str(src), sport), (str(dst), dport), 1, False, family))


@st.composite
def v2_headers(draw: st.DrawFn) -> Case:
    command = draw(st.sampled_from(["LOCAL", "PROXY"]))
    family = draw(st.sampled_from(["UNSPEC", "TCP4", "TCP6", "UNIX"]))
    tlvs = draw(st.binary(max_size=40))  # TLVs are skipped unread
    fam = {"UNSPEC": 0, "TCP4": 1, "TCP6": 2, "UNIX": 3}[family]
    header: ProxyHeader
    if family in ("TCP4", "TCP6"):
        v = 4 if family == "TCP4" else 6
        src, dst = draw(st.ip_addresses(v=v)), draw(st.ip_addresses(v=v))
        sport, dport = draw(PORTS), draw(PORTS)
        block = src.packed + dst.packed + struct.pack(">HH", sport, dport)
        header = ProxyHeader((str(src), sport), (str(dst), dport), 2, False, family)
    elif family == "UNIX":
        paths = [draw(st.binary(max_size=107).filter(lambda p: b"\0" not in p)) for _ in range(2)]
        block = b"".join(p.ljust(108, b"\0") for p in paths)
        names = [p.decode("utf-8", "backslashreplace") for p in paths]
        header = ProxyHeader(None, None, 2, False, "UNIX", names[0], names[1])
    else:
        block = b""
        header = ProxyHeader(None, None, 2, False, "UNKNOWN")
    if command == "LOCAL":
        header = ProxyHeader(None, None, 2, True, "UNKNOWN")
    payload = block + tlvs
    ver_cmd = 0x20 | (0 if command == "LOCAL" else 1)
    fam_proto = fam << 4 | (1 if fam else 0)  # STREAM, except with AF_UNSPEC
    wire = V2_SIGNATURE + bytes([ver_cmd, fam_proto]) + struct.pack(">H", len(payload)) + payload
    return Case(wire, header)


@st.composite
def chunks_of(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@st.composite
def streams(draw: st.DrawFn) -> tuple[Case, bytes, list[bytes]]:
    case = draw(v1_headers() | v2_headers())
    after = draw(st.binary(max_size=30))  # the start of the Kafka stream
    return case, after, draw(chunks_of(case.wire + after))


@given(streams())
def test_header_read_back_and_the_rest_left_for_kafka(stream: tuple[Case, bytes, list[bytes]]) -> None:
    case, after, chunks = stream
    parser = ProxyHeaderParser()
    for i, chunk in enumerate(chunks):
        header = parser.feed(chunk)
        if header is not None:
            assert header == case.header
            assert parser.remaining + b"".join(chunks[i + 1:]) == after
            parser.feed_eof()  # complete: closing now is no error
            return
    raise AssertionError("the header never completed")


@given(st.lists(st.binary(max_size=40), max_size=5)
       | (v1_headers() | v2_headers()).flatmap(lambda c: mutated(c.wire)).map(lambda w: [w]))
@example([b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"])  # bare LF
@example([V2_SIGNATURE + b"\x21\x11\x00\x04\x01\x02\x03\x04"])  # TCP4 block too short
@example([b"PROXY TCP6 ::1%eth0 ::1 1 2\r\n"])  # a scope id
@example([b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n"])  # a heading zero
def test_anything_else_raises_only_proxy_protocol_errors(chunks: list[bytes]) -> None:
    parser = ProxyHeaderParser()
    try:
        for chunk in chunks:
            if parser.feed(chunk) is not None:
                return
        parser.feed_eof()
    except ProxyProtocolError as exc:
        assert isinstance(exc, ProtocolError) and exc.reason in (
            "garbage", "too_long", "unsupported_version", "unknown_command", "unknown_family",
            "bad_address", "truncated")


def test_v1_addresses_are_the_canonical_text() -> None:
    # The parser returns ipaddress's text, so "::ffff:1.2.3.4" and its long form are one address.
    parser = ProxyHeaderParser()
    header = parser.feed(b"PROXY TCP6 0:0:0:0:0:ffff:102:304 ::1 1 2\r\n")
    assert header is not None and header.source == (str(ipaddress.IPv6Address("::ffff:1.2.3.4")), 1)
