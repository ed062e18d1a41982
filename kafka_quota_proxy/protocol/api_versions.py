"""ApiVersions: what the proxy tells clients it supports.

The answer is the intersection of the broker's versions and the codec's: keys the codec does not
know (none of a Kafka 4.4 broker's: protocol/apis.py) and keys the proxy refuses on purpose
(api_keys.REFUSED) are left out, and each maximum is capped at the codec's. APIs the proxy serves
itself (the quota APIs, in a later stage) are added even when the broker lacks them.
"""

from __future__ import annotations

from collections.abc import Iterable

from kafka_quota_proxy.protocol.api_keys import API_VERSIONS, REFUSED
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.error_codes import UNSUPPORTED_VERSION
from kafka_quota_proxy.protocol.errors import MalformedMessage
from kafka_quota_proxy.protocol.messages import decode_response, encode_body
from kafka_quota_proxy.protocol.primitives import INT16, need


def intersect(body: memoryview, version: int, served: Iterable[tuple[int, int, int]] = ()) -> bytes:
    """Rewrite a broker's ApiVersions response body. `served`: (key, min, max) the proxy answers."""
    need(body, 0, 2)
    (error_code,) = INT16.unpack_from(body, 0)
    if error_code == UNSUPPORTED_VERSION:
        # The broker did not know the request's version and answered in v0 (KIP-511).
        version = 0
    elif error_code != 0:
        # Any other error (e.g. INVALID_REQUEST) comes at the request's version with no API list
        # to intersect. Forward it as is: kafka-python would decode any error body as v0.
        return bytes(body)
    msg = decode_response(API_VERSIONS, version, body)
    if msg.api_keys is None:  # not a nullable array; kafka-python reads length -1 as None
        raise MalformedMessage("ApiVersions response has a null api_keys array")
    table = codec()
    kept = []
    for entry in msg.api_keys:
        spec = table.get(entry.api_key)
        if spec is None or entry.api_key in REFUSED:
            continue
        entry.max_version = min(entry.max_version, spec.max_version)
        if entry.min_version <= entry.max_version:
            kept.append(entry)
    present = {e.api_key for e in kept}
    for key, lo, hi in served:
        if key not in present:
            kept.append(type(msg).ApiVersion(api_key=key, min_version=lo, max_version=hi))
    msg.api_keys = sorted(kept, key=lambda e: e.api_key)
    return encode_body(msg)


def unsupported_version_body() -> bytes:
    """The v0 body a server sends for an ApiVersions request newer than it knows."""
    cls = codec()[API_VERSIONS].response
    msg = cls(version=0, error_code=UNSUPPORTED_VERSION,
              api_keys=[cls.ApiVersion(api_key=API_VERSIONS, min_version=0,
                                       max_version=codec()[API_VERSIONS].max_version)])
    return encode_body(msg)
