"""Per-topic bytes for the usage log (`usage_log.topics`), where no topic quota has counted them.

The topic quota stages (topic_quotas.py) leave each Produce's, Fetch response's and ShareFetch
response's bytes per topic in `ctx.topic_bytes` as they charge them. For a request they did not
measure (no topic quota configured, or an exempt client) these stages walk the same sizes,
without decoding a record, so that the usage log (observability/usage_log.py) can count them.
They are in the chain only while `usage_log.topics` is on: a Fetch response is then gathered whole
instead of written on as it arrives (docs/usage-log.md, "Bytes per topic"); a ShareFetch response
always is.
"""

from __future__ import annotations

from kafka_quota_proxy.protocol.api_keys import FETCH, FETCHES, PRODUCE
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.share_fetch import share_fetch_topics
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
    """A Fetch or ShareFetch response's record bytes per topic (a ShareFetch's are fetched
    bytes too), unless a topic quota stage counted them. Before QuotaSettle, which takes them
    back if it answers the fetch empty."""

    api_keys = FETCHES

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership

    def wants(self, ctx: RequestContext) -> bool:
        return ctx.topic_bytes is None

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | Pieces | None:
        version = ctx.broker_version
        try:
            if ctx.api_key == FETCH:
                topics = [(t.name, t.topic_id, t.size) for t in fetch_topics(body, version).topics]
            else:
                topics = [(None, t.topic_id, t.size) for t in share_fetch_topics(body, version)]
        except ProtocolError:
            return None
        counted = []
        for name, topic_id, size in topics:
            if size:
                named = self.leadership.named(name, topic_id)
                if named is not None:
                    counted.append((named, size, 0))
        ctx.topic_bytes = counted
        return None
