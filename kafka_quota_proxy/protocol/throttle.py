"""Finding and setting `throttle_time_ms` in responses of every API and version that carry it.

For almost every response the field is the first of the body, so it sits at a fixed offset.
Produce, ApiVersions and OffsetDelete put it later; for those the schema walker finds it.
"""

from __future__ import annotations

from functools import cache

from kafka_quota_proxy.protocol.apis import codec, message_json
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.primitives import INT32, need
from kafka_quota_proxy.protocol.walk import inline_fields, walker

FIELD = "ThrottleTimeMs"


@cache
def _layout(api_key: int, version: int) -> tuple[bool, bool]:
    """(carries the field at this version, is it the first in-line field)."""
    spec = codec()[api_key]
    data = message_json(spec.response.name)
    fields = inline_fields(data["fields"], version, spec.is_flexible(version))
    names = [f["name"] for f in fields]
    if FIELD not in names:
        return False, False
    return True, names[0] == FIELD


def carries_throttle(api_key: int, version: int) -> bool:
    return api_key in codec() and _layout(api_key, version)[0]


def throttle_offset(api_key: int, version: int, body: memoryview) -> int | None:
    """Offset of throttle_time_ms inside a response body, or None if this version has none."""
    if api_key not in codec():
        return None
    present, first = _layout(api_key, version)
    if not present:
        return None
    if first:
        need(body, 0, 4)
        return 0
    spec = codec()[api_key]
    return walker(spec.response.name, version, spec.is_flexible(version)).walk(body, 0).offsets[FIELD]


def read_throttle(body: memoryview, offset: int) -> int:
    return int(INT32.unpack_from(body, offset)[0])


def patched(body: memoryview, offset: int, throttle_ms: int) -> Pieces:
    """The body with throttle_time_ms replaced; the rest of the body is not copied."""
    return Pieces((body[:offset], INT32.pack(throttle_ms), body[offset + 4:]))


__all__ = ["carries_throttle", "patched", "read_throttle", "throttle_offset"]
