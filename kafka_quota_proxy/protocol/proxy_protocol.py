"""HAProxy PROXY protocol, versions 1 (text) and 2 (binary): the header a load balancer puts in
front of a connection to tell the proxy who the client really is.

Sans-I/O: `ProxyHeaderParser.feed` takes the first bytes of a connection and returns the header
once it is complete; the bytes that followed it are in `remaining`, for the Kafka frame decoder.

A listener configured for the PROXY protocol requires the header. The specification forbids
guessing whether it is there (anyone could otherwise spoof an address on a shared port), so a
connection that starts with anything else, a Kafka request included, is refused at once.

Reference: https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from kafka_quota_proxy.protocol.errors import ProtocolError

V1_PREFIX = b"PROXY "
V1_MAX_LENGTH = 107  # "PROXY UNKNOWN <39> <39> 65535 65535\r\n", the longest line the spec allows
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V2_HEADER_LENGTH = 16  # signature, version/command, family/protocol, 2-byte length

_V2_LOCAL = 0x0
_V2_PROXY = 0x1
_AF_UNSPEC, _AF_INET, _AF_INET6, _AF_UNIX = 0x0, 0x1, 0x2, 0x3
_PROTO_UNSPEC, _PROTO_STREAM, _PROTO_DGRAM = 0x0, 0x1, 0x2
_UNIX_PATH_LENGTH = 108
_ADDRESS_LENGTHS = {_AF_INET: 4 + 4 + 2 + 2, _AF_INET6: 16 + 16 + 2 + 2, _AF_UNIX: 2 * _UNIX_PATH_LENGTH}
_FAMILY_NAMES = {_AF_INET: "TCP4", _AF_INET6: "TCP6", _AF_UNIX: "UNIX"}

# Decimal 0..65535 without heading zeroes (the spec forbids them to avoid octal confusion).
_PORT = re.compile(r"0|[1-9][0-9]{0,4}")


class ProxyProtocolError(ProtocolError):
    """The connection did not start with a valid PROXY protocol header; close it.

    `reason` is a finer label than `kind` for logs and tests: garbage, too_long,
    unsupported_version, unknown_command, unknown_family, bad_address, truncated.
    """

    kind = "proxy_protocol"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ProxyHeaderTimeout(ProtocolError):
    """No complete PROXY protocol header in time: an idle or slow client holds no connection."""

    kind = "proxy_protocol_timeout"

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no complete PROXY protocol header within {seconds:g}s")


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """What the PROXY header said about the connection.

    `source` and `destination` are (IP address, port), and None when the sender gave no IP
    endpoint (v1 UNKNOWN, v2 LOCAL, AF_UNSPEC, AF_UNIX): the proxy then keeps the socket's own
    peer address. `local` is True for a v2 LOCAL command, a connection the load balancer made
    itself (a health check). `family` is TCP4, TCP6, UNIX or UNKNOWN. An AF_UNIX header's socket
    paths are in `source_path` and `destination_path`, kept apart so that a path can never be
    mistaken for a client IP (IP quotas, failure back-off).
    """

    source: tuple[str, int] | None
    destination: tuple[str, int] | None
    version: int
    local: bool
    family: str = "UNKNOWN"
    source_path: str | None = None
    destination_path: str | None = None


class ProxyHeaderParser:
    """Incremental parser for the one PROXY header at the start of a connection."""

    __slots__ = ("_buffer", "_header", "remaining")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._header: ProxyHeader | None = None
        self.remaining = b""  # bytes after the header: the start of the Kafka stream

    @property
    def header(self) -> ProxyHeader | None:
        return self._header

    def feed(self, data: bytes) -> ProxyHeader | None:
        """Add bytes; return the header once complete, None while more bytes are needed.

        Raises ProxyProtocolError as soon as the bytes cannot be the start of a valid header.
        """
        if self._header is not None:
            raise RuntimeError("the PROXY header is complete; later bytes belong to the Kafka stream")
        self._buffer += data
        buf = self._buffer
        if not buf:
            return None
        if buf[:len(V2_SIGNATURE)] == V2_SIGNATURE[:len(buf)]:
            header, end = _parse_v2(buf)
        elif buf[:len(V1_PREFIX)] == V1_PREFIX[:len(buf)]:
            header, end = _parse_v1(buf)
        else:
            raise ProxyProtocolError("garbage", f"expected a PROXY protocol header, got {_describe(buf)}")
        if header is None:
            return None
        self._header = header
        self.remaining = bytes(buf[end:])
        self._buffer = bytearray()
        return header

    def feed_eof(self) -> None:
        """The connection closed: an unfinished header is an error (the spec says reject it)."""
        if self._header is None:
            got = len(self._buffer)
            raise ProxyProtocolError(
                "truncated", f"the connection closed after {got} bytes of an incomplete PROXY header")


# ---- version 1 ----


def _parse_v1(buf: bytearray) -> tuple[ProxyHeader | None, int]:
    newline = buf.find(b"\n", 0, V1_MAX_LENGTH)
    if newline < 0:
        if len(buf) >= V1_MAX_LENGTH:
            raise ProxyProtocolError(
                "too_long", f"PROXY v1 line has no CRLF in its first {V1_MAX_LENGTH} bytes")
        return None, 0
    if newline == 0 or buf[newline - 1] != 0x0D:
        raise ProxyProtocolError("garbage", "PROXY v1 line ends with a bare LF instead of CRLF")
    try:
        line = bytes(buf[:newline - 1]).decode("ascii")
    except UnicodeDecodeError:
        raise ProxyProtocolError("garbage", "PROXY v1 line is not US-ASCII") from None
    return _decode_v1_line(line), newline + 1


def _decode_v1_line(line: str) -> ProxyHeader:
    fields = line.split(" ")  # exactly one space between fields: "a  b" gives an empty field
    protocol = fields[1] if len(fields) > 1 else ""
    if protocol == "UNKNOWN":
        # The spec says to ignore whatever follows UNKNOWN and use the real connection's addresses.
        return ProxyHeader(None, None, 1, False, "UNKNOWN")
    if protocol not in ("TCP4", "TCP6"):
        raise ProxyProtocolError(
            "unknown_family", f"PROXY v1 protocol must be TCP4, TCP6 or UNKNOWN, got {protocol[:16]!r}")
    if len(fields) != 6:
        raise ProxyProtocolError(
            "bad_address", f"PROXY v1 {protocol} line must have source and destination addresses and "
                           f"ports separated by single spaces")
    source = (_v1_address(protocol, fields[2]), _v1_port(fields[4]))
    destination = (_v1_address(protocol, fields[3]), _v1_port(fields[5]))
    return ProxyHeader(source, destination, 1, False, protocol)


def _v1_address(protocol: str, text: str) -> str:
    try:
        if protocol == "TCP4":
            return str(ipaddress.IPv4Address(text))  # refuses heading zeroes, as the spec asks
        if "%" in text:  # a scope id names an interface of the sender, meaningless here
            raise ValueError(text)
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        family = "IPv4" if protocol == "TCP4" else "IPv6"
        raise ProxyProtocolError(
            "bad_address", f"PROXY v1 {protocol} address {text[:45]!r} is not an {family} address") from None


def _v1_port(text: str) -> int:
    if _PORT.fullmatch(text) is None or int(text) > 65535:
        raise ProxyProtocolError("bad_address", f"PROXY v1 port {text[:8]!r} is not a port number")
    return int(text)


# ---- version 2 ----


def _parse_v2(buf: bytearray) -> tuple[ProxyHeader | None, int]:
    if len(buf) < V2_HEADER_LENGTH:
        return None, 0
    version, command = buf[12] >> 4, buf[12] & 0x0F
    if version != 2:
        raise ProxyProtocolError(
            "unsupported_version", f"PROXY binary header has version {version}, only 2 is supported")
    if command not in (_V2_LOCAL, _V2_PROXY):
        raise ProxyProtocolError("unknown_command", f"PROXY v2 command {command:#x} is not LOCAL or PROXY")
    family, protocol = buf[13] >> 4, buf[13] & 0x0F
    # Checked before waiting for the address block so that a bad header fails at once.
    if command == _V2_PROXY:
        _check_v2_family(family, protocol)
    end = V2_HEADER_LENGTH + int.from_bytes(buf[14:16], "big")
    if len(buf) < end:
        return None, 0
    # The length always counts: for LOCAL too, whatever follows is skipped (TLVs included).
    if command == _V2_LOCAL:
        return ProxyHeader(None, None, 2, True, "UNKNOWN"), end
    if family == _AF_UNSPEC or protocol == _PROTO_UNSPEC:
        return ProxyHeader(None, None, 2, False, "UNKNOWN"), end
    block = bytes(buf[V2_HEADER_LENGTH:end])
    needed = _ADDRESS_LENGTHS[family]
    if len(block) < needed:
        raise ProxyProtocolError(
            "bad_address",
            f"PROXY v2 {_FAMILY_NAMES[family]} address block is {len(block)} bytes, needs {needed}")
    # Bytes after the addresses are TLVs (ALPN, SNI, TLS details, CRC32C); none is needed here.
    if family == _AF_UNIX:
        return ProxyHeader(None, None, 2, False, "UNIX", _unix_path(block[:_UNIX_PATH_LENGTH]),
                           _unix_path(block[_UNIX_PATH_LENGTH:2 * _UNIX_PATH_LENGTH])), end
    source, destination = _v2_ip_addresses(family, block)
    return ProxyHeader(source, destination, 2, False, _FAMILY_NAMES[family]), end


def _check_v2_family(family: int, protocol: int) -> None:
    if family > _AF_UNIX:
        raise ProxyProtocolError("unknown_family", f"PROXY v2 address family {family:#x} is not defined")
    if protocol > _PROTO_DGRAM:
        raise ProxyProtocolError("unknown_family",
                                 f"PROXY v2 transport protocol {protocol:#x} is not defined")
    if protocol == _PROTO_DGRAM:
        # A Kafka connection is a stream; a datagram claim means the load balancer is misconfigured.
        raise ProxyProtocolError("unknown_family", "PROXY v2 header describes a datagram (UDP) connection")


def _v2_ip_addresses(family: int, block: bytes) -> tuple[tuple[str, int], tuple[str, int]]:
    size = 4 if family == _AF_INET else 16  # ip_address() reads 4 bytes as IPv4, 16 as IPv6
    source = str(ipaddress.ip_address(block[:size]))
    destination = str(ipaddress.ip_address(block[size:2 * size]))
    ports = block[2 * size:2 * size + 4]
    return (source, int.from_bytes(ports[:2], "big")), (destination, int.from_bytes(ports[2:], "big"))


def _unix_path(raw: bytes) -> str:
    # A sun_path is NUL-terminated; it is only for logs, so undecodable bytes are escaped.
    return raw.split(b"\x00", 1)[0].decode("utf-8", "backslashreplace")


def _describe(buf: bytearray) -> str:
    start = bytes(buf[:8])
    if start[:1] == b"\x00":
        hint = " (a Kafka request: the client reached the listener without a load balancer?)"
    elif start[:1] == b"\x16":
        hint = " (a TLS handshake)"
    else:
        hint = ""
    return f"{start!r}{hint}"
