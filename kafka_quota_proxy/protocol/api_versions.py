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
from kafka_quota_proxy.protocol.messages import encode_body, encode_element
from kafka_quota_proxy.protocol.pieces import spliced
from kafka_quota_proxy.protocol.primitives import INT16, encode_length, need, read_length
from kafka_quota_proxy.protocol.walk import response_walker

FIELD = "ApiKeys"


def intersect(body: memoryview, version: int, served: Iterable[tuple[int, int, int]] = ()) -> bytes:
    """Rewrite a broker's ApiVersions response body. `served`: (key, min, max) the proxy answers.

    Only the api_keys array changes, and in it only what the intersection changes: a kept entry's
    bytes are the broker's (with its MaxVersion capped), so every tagged field the proxy does not
    know, in an entry or at the top, passes as it came."""
    need(body, 0, 2)
    (error_code,) = INT16.unpack_from(body, 0)
    if error_code == UNSUPPORTED_VERSION:
        # The broker did not know the request's version and answered in v0 (KIP-511).
        version = 0
    elif error_code != 0:
        # Any other error (e.g. INVALID_REQUEST) comes at the request's version with no API list
        # to intersect. Forward it as is.
        return bytes(body)
    spec = codec()[API_VERSIONS]
    flexible = spec.is_flexible(version)
    top = response_walker(API_VERSIONS, version)
    at = top.walk(body, 0)
    start, end = at.span(FIELD)
    if read_length(body, start, top.compact(FIELD))[0] < 0:
        raise MalformedMessage("ApiVersions response has a null api_keys array")
    table = codec()
    kept: list[tuple[int, bytes]] = []
    for entry in top.elements(body, at, FIELD):
        key, low, high = (INT16.unpack_from(body, entry.offsets[f])[0]
                          for f in ("ApiKey", "MinVersion", "MaxVersion"))
        known = table.get(key)
        if known is None or key in REFUSED:
            continue
        cap = min(high, known.max_version)
        if low > cap:
            continue
        high_at = entry.offsets["MaxVersion"]  # the cap is the one change to a kept entry
        raw = (body[entry.start : high_at], INT16.pack(cap), body[high_at + 2 : entry.end])
        kept.append((key, b"".join(raw)))
    present = {key for key, _ in kept}
    for key, low, high in served:
        if key not in present:
            item = spec.response.ApiVersion(api_key=key, min_version=low, max_version=high)
            kept.append((key, encode_element(item, version, flexible)))
    kept.sort(key=lambda k: k[0])
    array = encode_length(len(kept), top.compact(FIELD)) + b"".join(entry for _, entry in kept)
    return spliced(body, [(start, end, array)]).join()


def unsupported_version_body() -> bytes:
    """The v0 body a server sends for an ApiVersions request newer than it knows."""
    cls = codec()[API_VERSIONS].response
    msg = cls(version=0, error_code=UNSUPPORTED_VERSION,
              api_keys=[cls.ApiVersion(api_key=API_VERSIONS, min_version=0,
                                       max_version=codec()[API_VERSIONS].max_version)])
    return encode_body(msg)
