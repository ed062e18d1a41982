"""ApiVersions: answer versions the codec does not know, and intersect the broker's answer."""

from __future__ import annotations

from kafka_quota_proxy.protocol.api_keys import API_VERSIONS
from kafka_quota_proxy.protocol.api_versions import intersect, unsupported_version_body
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage, ResponseStage


class ApiVersionsGate(RequestStage):
    """A newer ApiVersions than the codec knows gets UNSUPPORTED_VERSION from the proxy (KIP-511),
    so the client retries with a version the proxy can read."""

    api_keys = frozenset({API_VERSIONS})

    def on_request(self, ctx: RequestContext) -> Reply | None:
        if ctx.header.spec is None:
            return Reply(unsupported_version_body())
        return None


class ApiVersionsIntersect(ResponseStage):
    """Tell clients only what both the broker and the proxy's codec support."""

    api_keys = frozenset({API_VERSIONS})

    def __init__(self, served: tuple[tuple[int, int, int], ...] = ()) -> None:
        self.served = served  # APIs the proxy answers itself: (key, min, max)

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | None:
        return intersect(body, ctx.api_version, self.served)
