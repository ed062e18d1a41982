"""The stage contract: what a request stage and a response stage may do. chain.py orders them.

A request passes the request stages in order, then goes to the broker; its response passes the
response stages, then goes to the client. Each stage names the API keys it cares about, and the
chain for a key is computed once, so a frame no stage asked for is forwarded without any work
beyond reading its header and checking its body's lengths (WellFormed, which every request
passes). A concern that needs a look at requests or responses is one stage here; what a new
quota kind also touches is said in chain.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.proxy.context import RequestContext


@dataclass(slots=True)
class Reply:
    """A response body produced by the proxy itself: the request is not forwarded."""

    body: bytes | None  # None: no response at all (a refused Produce with acks=0)
    delay_ms: int = 0  # hold the answer this long (failed authentications are slowed down)
    close_after: bool = False  # close the connection once it is written (failed authentication)
    # The answer is computed off the event loop (a PLAIN password hash takes ~100 ms of CPU):
    # it resolves to the Reply to send; `body` is then unused.
    later: asyncio.Future[Reply] | None = None


class RequestStage:
    """Looks at (and may answer) a request before it is forwarded."""

    api_keys: frozenset[int] | None = None  # None: every request
    holds: frozenset[int] = frozenset()  # the API keys `hold_ms` is asked about

    def on_request(self, ctx: RequestContext) -> Reply | None:
        """Return a Reply to answer the request here, or None to pass it on."""
        return None

    def hold_ms(self, ctx: RequestContext) -> int:
        """Asked, for the API keys in `holds`, before any stage sees the request: how long it
        must wait, read but unhandled, before it may go on (a paced quota's turn); the
        connection reads nothing meanwhile, as if muted, and then asks again. 0: now. Must leave
        no trace, and let a malformed request through to the stages that refuse it: the request
        is seen again."""
        return 0


@dataclass(frozen=True, slots=True)
class Replacement:
    """From `ResponseStage.on_head`: send this body instead of the response being streamed."""

    body: bytes


class ResponseStage:
    """Looks at (and may replace) a response body before it reaches the client."""

    api_keys: frozenset[int] | None = None
    # Whether `on_head` can stand in for `on_response`: a large Fetch response is then written
    # on as it arrives (cut-through) when every stage that wants it streams.
    streams: bool = False

    def wants(self, ctx: RequestContext) -> bool:
        """Finer filter than api_keys, checked per response (some versions, some clients)."""
        return True

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | Pieces | None:
        """Return a new body (whole, or spliced onto a prefix of the old one), or None to leave
        the response as it is."""
        return None

    def on_head(self, ctx: RequestContext, head: memoryview, body_size: int) -> bytes | Replacement | None:
        """A streamed response: `head` is the start of its body, `body_size` the whole body's
        size. Return a changed head (the same number of bytes), a Replacement, or None."""
        raise NotImplementedError(f"{type(self).__name__} does not stream")
