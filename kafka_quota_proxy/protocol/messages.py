"""Full decode and encode of response bodies, for the few messages a stage must read or build.

A broker's response that a stage changes is not encoded again from its decoded form: kafka-python
drops the tagged fields it does not know (a newer broker's) when it encodes. The stage splices
its change into the broker's bytes instead (pieces.spliced, at offsets from walk.Layout), and
`encode_element` gives the bytes of any element it adds.
"""

from __future__ import annotations

from typing import Any

from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import MalformedMessage
from kafka_quota_proxy.protocol.primitives import read_length


def decode_response(api_key: int, version: int, body: memoryview | bytes) -> Any:
    cls = codec()[api_key].response
    try:
        return cls.decode(bytes(body), version=version)
    except Exception as exc:  # kafka-python raises a variety of errors on bad bytes
        raise MalformedMessage(f"cannot decode {cls.name} v{version}: {exc}") from exc


def encode_body(message: Any) -> bytes:
    return bytes(message.encode())


def encode_element(item: Any, version: int, flexible: bool) -> bytes:
    """One element of an array of structs (a kafka-python data object such as
    `ApiVersionsResponse.ApiVersion(...)`), as it sits in the array: kafka-python writes a
    struct array whole, so a one-element array is written and its count cut off."""
    array = bytes(type(item)._struct.encode([item], version=version, compact=flexible, tagged=flexible))
    _, at = read_length(array, 0, flexible)
    return array[at:]
