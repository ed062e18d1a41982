"""The two requests the proxy makes on its own behalf to learn the cluster: ApiVersions v0, then
Metadata at the highest version both sides know, asking for no topics. (`usable_version` picks the
version of any other request the proxy makes of its own, after the same ApiVersions.)"""

from __future__ import annotations

from typing import Any

from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.metadata.metadata import MetadataRequest

from kafka_quota_proxy.protocol.api_keys import API_VERSIONS, METADATA
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import MalformedMessage
from kafka_quota_proxy.protocol.headers import (
    PROXY_CLIENT_ID,
    frame_request,
    response_body_offset,
    response_correlation_id,
)
from kafka_quota_proxy.protocol.messages import decode_response


def api_versions_request(correlation_id: int) -> bytes:
    return frame_request(ApiVersionsRequest(), 0, correlation_id, PROXY_CLIENT_ID)


def metadata_version(api_versions_frame: bytes, correlation_id: int) -> int:
    """The Metadata version to use, from a framed ApiVersions v0 response."""
    return usable_version(api_versions_frame, correlation_id, METADATA, 1)


def usable_version(api_versions_frame: bytes, correlation_id: int, api_key: int, lowest: int) -> int:
    """The highest version of `api_key` that the broker and the codec both know, `lowest` or
    above, from a framed ApiVersions v0 response."""
    view = memoryview(api_versions_frame)
    if response_correlation_id(view) != correlation_id:
        raise MalformedMessage("ApiVersions response has the wrong correlation id")
    msg = decode_response(API_VERSIONS, 0, view[response_body_offset(view, 0):])
    if msg.error_code:
        raise MalformedMessage(f"ApiVersions failed with error {msg.error_code}")
    spec = codec()[api_key]
    for entry in msg.api_keys or ():  # null (length -1): no version, refused below
        if entry.api_key == api_key:
            version = min(entry.max_version, spec.max_version)
            if version >= max(entry.min_version, lowest):
                return int(version)
    raise MalformedMessage(f"broker supports no {spec.name} version from {lowest} up")


def metadata_request(correlation_id: int, version: int, all_topics: bool = False) -> bytes:
    """The brokers only, or (`all_topics`, a null topic list from v1) every topic's leaders too."""
    req = MetadataRequest(topics=None if all_topics else [], allow_auto_topic_creation=False)
    return frame_request(req, version, correlation_id, PROXY_CLIENT_ID)


def metadata_response(frame: bytes, correlation_id: int, version: int) -> Any:
    """A framed Metadata response, decoded, with a brokers array."""
    view = memoryview(frame)
    if response_correlation_id(view) != correlation_id:
        raise MalformedMessage("Metadata response has the wrong correlation id")
    header_version = codec()[METADATA].response_header_version(version)
    msg = decode_response(METADATA, version, view[response_body_offset(view, header_version):])
    if msg.brokers is None:  # not a nullable array; kafka-python reads length -1 as None
        raise MalformedMessage("Metadata response has a null brokers array")
    return msg


def metadata_brokers(frame: bytes, correlation_id: int, version: int) -> list[tuple[int, str, int]]:
    """(node_id, host, port) of every broker in a framed Metadata response."""
    return [(b.node_id, b.host, b.port) for b in metadata_response(frame, correlation_id, version).brokers]
