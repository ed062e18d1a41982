"""Rewriting broker addresses in responses, so that clients only ever learn proxy addresses.

Covered: Metadata (brokers), FindCoordinator (v0-3 top-level node, v4+ `coordinators`),
DescribeCluster (brokers), and KIP-951 `node_endpoints` in Produce (v10+) and Fetch (v16+).
Each function takes the response body and returns the new body, or None when nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .messages import decode_response, encode_body
from .walk import tagged_fields, walker

METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER, PRODUCE, FETCH = 3, 10, 60, 0, 1

# (node_id, real host, real port) -> (advertised host, advertised port)
AddressMapper = Callable[[int, str, int], tuple[str, int]]

NODE_ENDPOINTS_TAG = 0
NODE_ENDPOINTS_FROM = {PRODUCE: 10, FETCH: 16}


def _rewrite_nodes(nodes: Any, id_attr: str, mapper: AddressMapper) -> None:
    for node in nodes or ():
        node_id = getattr(node, id_attr)
        if node_id < 0 or node.port < 0:  # e.g. FindCoordinator errors carry -1/""/-1
            continue
        node.host, node.port = mapper(node_id, node.host, node.port)


def _metadata(body: memoryview, version: int, mapper: AddressMapper) -> bytes:
    msg = decode_response(METADATA, version, body)
    _rewrite_nodes(msg.brokers, "node_id", mapper)
    return encode_body(msg)


def _find_coordinator(body: memoryview, version: int, mapper: AddressMapper) -> bytes:
    msg = decode_response(FIND_COORDINATOR, version, body)
    if version >= 4:
        _rewrite_nodes(msg.coordinators, "node_id", mapper)
    elif msg.node_id >= 0 and msg.port >= 0:
        msg.host, msg.port = mapper(msg.node_id, msg.host, msg.port)
    return encode_body(msg)


def _describe_cluster(body: memoryview, version: int, mapper: AddressMapper) -> bytes:
    msg = decode_response(DESCRIBE_CLUSTER, version, body)
    _rewrite_nodes(msg.brokers, "broker_id", mapper)
    return encode_body(msg)


def _node_endpoints(api_key: int, version: int, body: memoryview, mapper: AddressMapper) -> bytes | None:
    """Only decode the whole response when its tail actually carries node_endpoints."""
    name = "ProduceResponse" if api_key == PRODUCE else "FetchResponse"
    result = walker(name, version, True).walk(body, 0)
    if NODE_ENDPOINTS_TAG not in tagged_fields(body, result.tags_at):
        return None
    msg = decode_response(api_key, version, body)
    _rewrite_nodes(msg.node_endpoints, "node_id", mapper)
    return encode_body(msg)


def rewrite_addresses(api_key: int, version: int, body: memoryview, mapper: AddressMapper) -> bytes | None:
    """The rewritten body, or None if this response carries no broker address."""
    if api_key == METADATA:
        return _metadata(body, version, mapper)
    if api_key == FIND_COORDINATOR:
        return _find_coordinator(body, version, mapper)
    if api_key == DESCRIBE_CLUSTER:
        return _describe_cluster(body, version, mapper)
    since = NODE_ENDPOINTS_FROM.get(api_key)
    if since is not None and version >= since:
        return _node_endpoints(api_key, version, body, mapper)
    return None


def carries_addresses(api_key: int, version: int) -> bool:
    if api_key in (METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER):
        return True
    since = NODE_ENDPOINTS_FROM.get(api_key)
    return since is not None and version >= since
