"""Per-topic bytes for the usage log (`usage_log.topics`), where no topic quota has counted them.

The topic quota stages (topic_quotas.py) leave each Produce's and Fetch response's bytes per
topic in `ctx.topic_bytes` as they charge them. For a request they did not measure (no topic quota
configured, or an exempt client) these stages walk the same sizes, without decoding a record, so
that the usage log (observability/usage_log.py) can count them. They are in the chain only while
`usage_log.topics` is on: a Fetch response is then gathered whole instead of written on as it
arrives (docs/usage-log.md, "Bytes per topic").
"""

from __future__ import annotations

from kafka_quota_proxy.protocol.api_keys import FETCH, PRODUCE
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.topic_bytes import fetch_topics, produce_topics
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage, ResponseStage
from kafka_quota_proxy.quota.topics import Leadership


class ProduceTopicBytes(RequestStage):
    """A Produce's record bytes per topic, unless a topic quota stage counted them."""

    api_keys = frozenset({PRODUCE})

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership

    def on_request(self, ctx: RequestContext) -> Reply | None:
        if ctx.topic_bytes is not None:
            return None
        try:
            topics = produce_topics(ctx.frame, ctx.header.body_offset, ctx.api_version)
        except ProtocolError:
            return None  # the broker answers a request it cannot read; nothing to count
        counted = []
        for topic in topics:
            name = self.leadership.named(topic.name, topic.topic_id)
            if name is not None:  # an id no Metadata has named yet is not counted
                counted.append((name, topic.size, 0))
        ctx.topic_bytes = counted
        return None


class FetchTopicBytes(ResponseStage):
    """A Fetch response's record bytes per topic, unless a topic quota stage counted them.
    Before QuotaSettle, which takes them back if it answers the fetch empty."""

    api_keys = frozenset({FETCH})

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership

    def wants(self, ctx: RequestContext) -> bool:
        return ctx.topic_bytes is None

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | Pieces | None:
        try:
            layout = fetch_topics(body, ctx.broker_version)
        except ProtocolError:
            return None
        counted = []
        for topic in layout.topics:
            if topic.size:
                name = self.leadership.named(topic.name, topic.topic_id)
                if name is not None:
                    counted.append((name, topic.size, 0))
        ctx.topic_bytes = counted
        return None
