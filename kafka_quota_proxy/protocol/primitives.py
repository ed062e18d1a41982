"""Kafka's primitive encodings: fixed-width big-endian integers and unsigned varints."""

from __future__ import annotations

import struct

from kafka_quota_proxy.protocol.errors import MalformedMessage, TruncatedMessage

INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")


def read_uvarint(buf: memoryview | bytes, pos: int) -> tuple[int, int]:
    """Read an unsigned varint at `pos`; return (value, position after it)."""
    value = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise TruncatedMessage("varint runs past the end of the message")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise MalformedMessage("varint longer than 5 bytes")


def encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def skip_tagged_fields(buf: memoryview | bytes, pos: int) -> int:
    """Skip a tagged-field section (flexible versions): a count, then (tag, size, bytes) each."""
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        need(buf, pos, size)
        pos += size
    return pos


def read_length(buf: memoryview | bytes, pos: int, compact: bool,
                fixed: struct.Struct = INT32) -> tuple[int, int]:
    """A length or count prefix: a compact one (unsigned varint, length + 1, so null is -1) in
    flexible versions, else `fixed` (INT16 for strings, INT32 for arrays and bytes). Returns
    (length, position after it); the caller judges a negative one."""
    if compact:
        n, pos = read_uvarint(buf, pos)
        return n - 1, pos
    need(buf, pos, fixed.size)
    return int(fixed.unpack_from(buf, pos)[0]), pos + fixed.size


def encode_length(n: int, compact: bool, fixed: struct.Struct = INT32) -> bytes:
    """The prefix `read_length` reads: compact (n + 1 as a varint) or `fixed`."""
    return encode_uvarint(n + 1) if compact else fixed.pack(n)


def read_string(buf: memoryview | bytes, pos: int, compact: bool) -> tuple[str | None, int]:
    """A (nullable) string: None for length -1. Returns (string, position after it)."""
    n, pos = read_length(buf, pos, compact, INT16)
    if n < 0:
        if n != -1:
            raise MalformedMessage(f"string length {n}")
        return None, pos
    need(buf, pos, n)
    try:
        return bytes(buf[pos : pos + n]).decode("utf-8"), pos + n
    except UnicodeDecodeError as exc:
        raise MalformedMessage("a string that is not UTF-8") from exc


def encode_string(value: str, compact: bool) -> bytes:
    raw = value.encode("utf-8")
    return encode_length(len(raw), compact, INT16) + raw


def need(buf: memoryview | bytes, pos: int, n: int) -> None:
    if pos + n > len(buf):
        raise TruncatedMessage(f"needs {n} bytes at offset {pos}, message has {len(buf)}")
