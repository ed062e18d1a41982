"""Reading Produce requests without decoding their records."""

from __future__ import annotations

from .primitives import INT16, need, read_uvarint

PRODUCE = 0


def produce_acks(frame: memoryview, body_offset: int, version: int) -> int:
    """The request's acks. From v3 a transactional_id (nullable string) comes first."""
    pos = body_offset
    if version >= 3:
        if version >= 9:  # flexible: compact nullable string, length + 1
            n, pos = read_uvarint(frame, pos)
            pos += max(n - 1, 0)
        else:
            need(frame, pos, 2)
            (n,) = INT16.unpack_from(frame, pos)
            pos += 2 + max(n, 0)
    need(frame, pos, 2)
    return int(INT16.unpack_from(frame, pos)[0])
