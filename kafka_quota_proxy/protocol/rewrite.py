"""Rewriting broker addresses in responses, so that clients only ever learn proxy addresses.

Covered: Metadata (brokers), FindCoordinator (v0-3 top-level node, v4+ `coordinators`),
DescribeCluster (brokers), KIP-951 `node_endpoints` in Produce (v10+) and Fetch (v16+), and
KIP-932's NodeEndpoints in ShareFetch and ShareAcknowledge (every version).
Each function takes the response body and returns the new body, or None when nothing changed.

node_endpoints sits in the top-level tagged fields at the very end of Produce and Fetch
responses, and brokers such as Tansu send it (often empty) on every response. So those bodies
are never decoded: the walker finds the tagged section, only that section is rewritten, and the
result is `Pieces`: the untouched body prefix (a memoryview, no copy) and the new tail.
ShareFetch and ShareAcknowledge carry NodeEndpoints as their last in-line field, in the same
layout, filled by Kafka only for partitions that failed NOT_LEADER_OR_FOLLOWER or
FENCED_LEADER_EPOCH (the current leader's address; KafkaApis.processShareFetchResponse and
processShareAcknowledgeResponse); it is rewritten in place the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kafka_quota_proxy.protocol.api_keys import (
    DESCRIBE_CLUSTER,
    DESCRIBE_QUORUM,
    FETCH,
    FIND_COORDINATOR,
    METADATA,
    PRODUCE,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
    STREAMS_GROUP_DESCRIBE,
    STREAMS_GROUP_HEARTBEAT,
)
from kafka_quota_proxy.protocol.errors import MalformedMessage
from kafka_quota_proxy.protocol.messages import decode_response, encode_body
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.primitives import (
    INT32,
    encode_uvarint,
    need,
    read_uvarint,
    skip_tagged_fields,
)
from kafka_quota_proxy.protocol.walk import tagged_fields, walker

# (node_id, real host, real port) -> (advertised host, advertised port)
AddressMapper = Callable[[int, str, int], tuple[str, int]]
# Sees each decoded Metadata response (the proxy keeps a view of topics' partition counts).
MetadataObserver = Callable[[Any], None]

NODE_ENDPOINTS_TAG = 0
NODE_ENDPOINTS_FROM = {PRODUCE: 10, FETCH: 16}
# KIP-932 responses whose last in-line field is NodeEndpoints, from their first version.
TRAILING_NODE_ENDPOINTS = {SHARE_FETCH: "ShareFetchResponse", SHARE_ACKNOWLEDGE: "ShareAcknowledgeResponse"}
NODE_ENDPOINTS_FIELD = "NodeEndpoints"


def _mapped(mapper: AddressMapper, node_id: int, host: str | None, port: int) -> tuple[str, int]:
    if host is None:  # not a nullable string; kafka-python reads length -1 as None
        raise MalformedMessage(f"null host for broker {node_id}")
    return mapper(node_id, host, port)


def _rewrite_nodes(nodes: Any, id_attr: str, mapper: AddressMapper) -> None:
    for node in nodes or ():
        node_id = getattr(node, id_attr)
        if node_id < 0 or node.port < 0:  # e.g. FindCoordinator errors carry -1/""/-1
            continue
        node.host, node.port = _mapped(mapper, node_id, node.host, node.port)


def _metadata(body: memoryview, version: int, mapper: AddressMapper,
              observe: MetadataObserver | None) -> bytes:
    msg = decode_response(METADATA, version, body)
    if observe is not None:
        observe(msg)
    _rewrite_nodes(msg.brokers, "node_id", mapper)
    return encode_body(msg)


def _find_coordinator(body: memoryview, version: int, mapper: AddressMapper) -> bytes:
    msg = decode_response(FIND_COORDINATOR, version, body)
    if version >= 4:
        _rewrite_nodes(msg.coordinators, "node_id", mapper)
    elif msg.node_id >= 0 and msg.port >= 0:
        msg.host, msg.port = _mapped(mapper, msg.node_id, msg.host, msg.port)
    return encode_body(msg)


def _describe_cluster(body: memoryview, version: int, mapper: AddressMapper) -> bytes:
    msg = decode_response(DESCRIBE_CLUSTER, version, body)
    _rewrite_nodes(msg.brokers, "broker_id", mapper)
    return encode_body(msg)


def _compact_string(buf: memoryview, pos: int) -> tuple[str, int]:
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        raise MalformedMessage("null host in node_endpoints")
    need(buf, pos, n - 1)
    try:
        host = bytes(buf[pos : pos + n - 1]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedMessage("host in node_endpoints is not UTF-8") from exc
    return host, pos + n - 1


def _skip_compact_nullable(buf: memoryview, pos: int) -> int:
    n, pos = read_uvarint(buf, pos)
    need(buf, pos, max(n - 1, 0))
    return pos + max(n - 1, 0)


def rewrite_node_endpoints_tag(value: memoryview, mapper: AddressMapper) -> bytes | None:
    """Rewrite the value of a node_endpoints tag: a compact array of (node_id int32, host compact
    string, port int32, rack compact nullable string, tagged fields). None if it is empty."""
    n, pos = read_uvarint(value, 0)
    if n <= 1:
        return None
    out = bytearray(encode_uvarint(n))
    for _ in range(n - 1):
        need(value, pos, 4)
        (node_id,) = INT32.unpack_from(value, pos)
        host, pos = _compact_string(value, pos + 4)
        need(value, pos, 4)
        (port,) = INT32.unpack_from(value, pos)
        pos += 4
        rest = pos  # rack and the entry's own tagged fields pass unchanged
        pos = skip_tagged_fields(value, _skip_compact_nullable(value, pos))
        new_host, new_port = mapper(node_id, host, port)
        encoded_host = new_host.encode("utf-8")
        out += INT32.pack(node_id) + encode_uvarint(len(encoded_host) + 1) + encoded_host
        out += INT32.pack(new_port) + value[rest:pos]
    if pos != len(value):
        raise MalformedMessage("trailing bytes in node_endpoints")
    return bytes(out)


def _node_endpoints(api_key: int, version: int, body: memoryview, mapper: AddressMapper) -> Pieces | None:
    name = "ProduceResponse" if api_key == PRODUCE else "FetchResponse"
    tags_at = walker(name, version, True).walk(body, 0).tags_at
    tags = tagged_fields(body, tags_at)
    if NODE_ENDPOINTS_TAG not in tags:
        return None
    start, end = tags[NODE_ENDPOINTS_TAG]
    new_value = rewrite_node_endpoints_tag(body[start:end], mapper)
    if new_value is None:
        return None
    tail = bytearray(encode_uvarint(len(tags)))
    for tag, (start, end) in tags.items():
        value = new_value if tag == NODE_ENDPOINTS_TAG else body[start:end]
        tail += encode_uvarint(tag) + encode_uvarint(len(value)) + value
    return Pieces((body[:tags_at], bytes(tail)))


def _trailing_node_endpoints(api_key: int, version: int, body: memoryview,
                             mapper: AddressMapper) -> Pieces | None:
    result = walker(TRAILING_NODE_ENDPOINTS[api_key], version, True).walk(body, 0)
    start = result.offsets[NODE_ENDPOINTS_FIELD]
    new_value = rewrite_node_endpoints_tag(body[start:result.tags_at], mapper)
    if new_value is None:
        return None
    return Pieces((body[:start], new_value, body[result.tags_at:]))


def rewrite_addresses(api_key: int, version: int, body: memoryview, mapper: AddressMapper,
                      observe: MetadataObserver | None = None) -> bytes | Pieces | None:
    """The rewritten body, or None if this response carries no broker address."""
    if api_key == METADATA:
        return _metadata(body, version, mapper, observe)
    if api_key == FIND_COORDINATOR:
        return _find_coordinator(body, version, mapper)
    if api_key == DESCRIBE_CLUSTER:
        return _describe_cluster(body, version, mapper)
    if api_key in TRAILING_NODE_ENDPOINTS:
        return _trailing_node_endpoints(api_key, version, body, mapper)
    since = NODE_ENDPOINTS_FROM.get(api_key)
    if since is not None and version >= since:
        return _node_endpoints(api_key, version, body, mapper)
    return None


# Responses that name hosts the proxy leaves as they are, and why (the broker-address coverage
# test fails on any other response that names one).
NOT_REWRITTEN = {
    DESCRIBE_QUORUM: "its nodes' listeners are the KRaft controllers', which clients do not reach "
                     "through the proxy (it serves brokers only); they are shown as the broker sent them",
    **{key: "a UserEndpoint is a Kafka Streams application instance's own address (KIP-1071, for "
            "interactive queries), not a broker's"
       for key in (STREAMS_GROUP_HEARTBEAT, STREAMS_GROUP_DESCRIBE)},
}


def carries_addresses(api_key: int, version: int) -> bool:
    if api_key in (METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER) or api_key in TRAILING_NODE_ENDPOINTS:
        return True
    since = NODE_ENDPOINTS_FROM.get(api_key)
    return since is not None and version >= since
