"""What a client connection keeps per request until its response is written: the ordered
queue's entries, and how a broker response's header is checked and rebuilt."""

from __future__ import annotations

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import response_correlation_id
from kafka_quota_proxy.proxy.chain import Response
from kafka_quota_proxy.proxy.context import RequestContext

# How a large response that arrives in pieces is handled (StreamingResponses.on_response_head, streaming.py).
STREAM = "stream"  # written on to the client piece by piece
ASSEMBLE = "assemble"  # gathered whole, then handled as any response
DISCARD = "discard"  # replaced by the proxy's own answer; the pieces are dropped


def check_correlation(ctx: RequestContext, frame: bytes | memoryview) -> None:
    correlation_id = response_correlation_id(frame)
    if correlation_id != ctx.header.correlation_id:
        raise ProtocolError(f"response correlation id {correlation_id}, expected "
                            f"{ctx.header.correlation_id}")


class Pending:
    """A request waiting for its response; `response` is set when the response is ready.
    `throttle_due`: charged over quota on arrival, so its throttle starts when it is answered.
    `stream`, `parts`, `size`: a large response arriving in pieces (streaming.py)."""

    __slots__ = ("ctx", "response", "throttle_due", "stream", "parts", "size")

    def __init__(self, ctx: RequestContext, response: Response | None = None) -> None:
        self.ctx = ctx
        self.response = response
        self.throttle_due = False
        self.stream: str | None = None
        self.parts: list[memoryview] | None = None
        self.size = 0
