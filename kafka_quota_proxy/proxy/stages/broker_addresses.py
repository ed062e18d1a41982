"""Rewrite every broker address a response carries into the matching proxy address."""

from __future__ import annotations

from kafka_quota_proxy.protocol.api_keys import (
    DESCRIBE_CLUSTER,
    FETCH,
    FIND_COORDINATOR,
    METADATA,
    PRODUCE,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
)
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.rewrite import (
    AddressMapper,
    MetadataObserver,
    carries_addresses,
    rewrite_addresses,
)
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.stages.base import ResponseStage


class BrokerAddresses(ResponseStage):
    """Rewrites broker addresses in Metadata, FindCoordinator, DescribeCluster, Produce, Fetch,
    ShareFetch and ShareAcknowledge."""

    api_keys = frozenset({METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER, PRODUCE, FETCH, SHARE_FETCH,
                          SHARE_ACKNOWLEDGE})

    def __init__(self, mapper: AddressMapper, observe: MetadataObserver | None = None) -> None:
        self.mapper = mapper
        self.observe = observe

    def wants(self, ctx: RequestContext) -> bool:
        # The broker's version decides the layout: a Fetch asked for as v15 (FetchAsV15)
        # carries no node_endpoints, whatever the client asked for.
        return carries_addresses(ctx.api_key, ctx.broker_version)

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | Pieces | None:
        return rewrite_addresses(ctx.api_key, ctx.broker_version, body, self.mapper, self.observe)
