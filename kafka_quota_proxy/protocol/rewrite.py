"""Rewriting broker addresses in responses, so that clients only ever learn proxy addresses.

Covered: Metadata (brokers), FindCoordinator (v0-3 top-level node, v4+ `coordinators`),
DescribeCluster (brokers), KIP-951 `node_endpoints` in Produce (v10+) and Fetch (v16+), and
KIP-932's NodeEndpoints in ShareFetch and ShareAcknowledge (every version).
Each function takes the response body and returns the new body, or None when nothing changed.

Nothing is decoded and encoded again: the walker (walk.py, compiled from Kafka's message JSON)
finds each node's Host and Port, and only those bytes are replaced. Every other byte is the
broker's, so fields and tagged fields the proxy does not know (a newer broker's) pass unchanged.

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
from kafka_quota_proxy.protocol.messages import decode_response
from kafka_quota_proxy.protocol.pieces import Edit, Pieces, spliced
from kafka_quota_proxy.protocol.primitives import (
    INT32,
    encode_string,
    encode_uvarint,
    need,
    read_string,
    read_uvarint,
    skip_tagged_fields,
)
from kafka_quota_proxy.protocol.walk import Layout, WalkResult, response_walker, tagged_fields, walker

# (node_id, real host, real port) -> (advertised host, advertised port)
AddressMapper = Callable[[int, str, int], tuple[str, int]]
# Sees each decoded Metadata response (the proxy keeps a view of topics' partition counts).
MetadataObserver = Callable[[Any], None]

NODE_ENDPOINTS_TAG = 0
NODE_ENDPOINTS_FROM = {PRODUCE: 10, FETCH: 16}
# KIP-932 responses whose last in-line field is NodeEndpoints, from their first version.
TRAILING_NODE_ENDPOINTS = {SHARE_FETCH: "ShareFetchResponse", SHARE_ACKNOWLEDGE: "ShareAcknowledgeResponse"}
NODE_ENDPOINTS_FIELD = "NodeEndpoints"


def _address_edits(body: memoryview, layout: Layout, node: WalkResult, id_field: str,
                   mapper: AddressMapper) -> list[Edit]:
    """The edits that give one node (a struct with an id, Host and Port) its proxy address: its
    host's and port's bytes, nothing else. None for a node with no address (FindCoordinator's
    errors carry -1/""/-1)."""
    (node_id,) = INT32.unpack_from(body, node.offsets[id_field])
    port_at = node.offsets["Port"]
    (port,) = INT32.unpack_from(body, port_at)
    if node_id < 0 or port < 0:
        return []
    host_at, host_end = node.span("Host")
    compact = layout.compact("Host")
    host, _ = read_string(body, host_at, compact)
    if host is None:  # not a nullable string
        raise MalformedMessage(f"null host for broker {node_id}")
    new_host, new_port = mapper(node_id, host, port)
    return [(host_at, host_end, encode_string(new_host, compact)),
            (port_at, port_at + 4, INT32.pack(new_port))]


def _rewrite_nodes(api_key: int, version: int, body: memoryview, array: str | None, id_field: str,
                   mapper: AddressMapper) -> bytes | None:
    """Splice the proxy's addresses into the nodes of `array` (None: the message is the node)."""
    top = response_walker(api_key, version)
    if array is None:
        edits = _address_edits(body, top, top.walk(body, 0), id_field, mapper)
    else:
        at = top.walk_to(body, 0, array)  # what follows the nodes is not read: it passes as it came
        items = top.items(array)
        edits = [edit for node in top.elements(body, at, array)
                 for edit in _address_edits(body, items, node, id_field, mapper)]
    return spliced(body, edits).join() if edits else None


def _metadata(body: memoryview, version: int, mapper: AddressMapper,
              observe: MetadataObserver | None) -> bytes | None:
    if observe is not None:
        observe(decode_response(METADATA, version, body))
    return _rewrite_nodes(METADATA, version, body, "Brokers", "NodeId", mapper)


def _find_coordinator(body: memoryview, version: int, mapper: AddressMapper) -> bytes | None:
    return _rewrite_nodes(FIND_COORDINATOR, version, body, "Coordinators" if version >= 4 else None,
                          "NodeId", mapper)


def _describe_cluster(body: memoryview, version: int, mapper: AddressMapper) -> bytes | None:
    return _rewrite_nodes(DESCRIBE_CLUSTER, version, body, "Brokers", "BrokerId", mapper)


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
        host, pos = read_string(value, pos + 4, compact=True)
        if host is None:
            raise MalformedMessage("null host in node_endpoints")
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
    """The rewritten body, or None if this response carries no broker address to rewrite."""
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
