"""Full decode and encode of response bodies, for the few messages a stage must change."""

from __future__ import annotations

from typing import Any

from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import MalformedMessage


def decode_response(api_key: int, version: int, body: memoryview | bytes) -> Any:
    cls = codec()[api_key].response
    try:
        return cls.decode(bytes(body), version=version)
    except Exception as exc:  # kafka-python raises a variety of errors on bad bytes
        raise MalformedMessage(f"cannot decode {cls.name} v{version}: {exc}") from exc


def encode_body(message: Any) -> bytes:
    return bytes(message.encode())
