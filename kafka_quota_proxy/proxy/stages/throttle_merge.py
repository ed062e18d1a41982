"""The last response stage: throttle_time_ms = max(broker's, proxy's), on every response that
carries it; the connection then stops reading from the client for the proxy's throttle.
"""

from __future__ import annotations

from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.throttle import patched, read_throttle, throttle_offset
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.stages.base import Replacement, ResponseStage


class ThrottleMerge(ResponseStage):
    """throttle_time_ms = max(broker's, proxy's), on every response that carries it."""

    streams = True

    def wants(self, ctx: RequestContext) -> bool:
        return ctx.throttle_ms > 0

    def on_head(self, ctx: RequestContext, head: memoryview, body_size: int) -> bytes | Replacement | None:
        new = self.on_response(ctx, head)  # throttle_time_ms leads the body
        return None if new is None else bytes(new.join() if isinstance(new, Pieces) else new)

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | Pieces | None:
        at = throttle_offset(ctx.api_key, ctx.api_version, body)
        if at is None or read_throttle(body, at) >= ctx.throttle_ms:
            return None
        return patched(body, at, ctx.throttle_ms)
