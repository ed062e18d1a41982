"""What a client connection keeps per request until its response is written: the ordered
queue's entries, and how a broker response's header is checked and rebuilt."""

from __future__ import annotations

from itertools import count

from kafka_quota_proxy.protocol.apis import api_name
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import response_correlation_id
from kafka_quota_proxy.proxy.chain import Response
from kafka_quota_proxy.proxy.context import RequestContext

# How a large response that arrives in pieces is handled (StreamingResponses.on_response_head, streaming.py).
STREAM = "stream"  # written on to the client piece by piece
ASSEMBLE = "assemble"  # gathered whole, then handled as any response
DISCARD = "discard"  # replaced by the proxy's own answer; the pieces are dropped


def describe_request(ctx: RequestContext) -> str:
    """The request a broker's response answers, as a log line names it: API name, the version the
    broker answers in, and the key."""
    return f"{api_name(ctx.api_key)} v{ctx.broker_version} (API key {ctx.api_key})"


class BadResponse(ProtocolError):
    """A broker's response that is no valid answer to its request (`check_correlation` or a
    response stage could not read it): the error, with the request it answers (`answers`)."""

    def __init__(self, ctx: RequestContext, cause: ProtocolError) -> None:
        super().__init__(str(cause))
        self.kind = cause.kind
        self.answers = describe_request(ctx)


def check_correlation(ctx: RequestContext, frame: bytes | memoryview) -> None:
    correlation_id = response_correlation_id(frame)
    if correlation_id != ctx.header.correlation_id:
        raise ProtocolError(f"response correlation id {correlation_id}, expected "
                            f"{ctx.header.correlation_id}")


# Request order across the process: a request read later has a larger number, so an answer that
# arrives out of turn (to an acks=0 Produce, client.py) can be put back in its place.
request_order = count()


class Pending:
    """A request waiting for its response; `response` is set when the response is ready.
    `seq`: its place in request order (`request_order`).
    `unasked`: the broker's answer to an acks=0 Produce, which Kafka never sends and some
    Kafka-compatible brokers do; passed on as it came (client.py, `_answered`).
    `throttle_due`: charged over quota on arrival, so its throttle starts when it is answered.
    `stream`, `parts`, `size`: a large response arriving in pieces (streaming.py)."""

    __slots__ = ("ctx", "seq", "unasked", "response", "throttle_due", "stream", "parts", "size")

    def __init__(self, ctx: RequestContext, response: Response | None = None, seq: int | None = None) -> None:
        self.ctx = ctx
        self.seq = next(request_order) if seq is None else seq
        self.unasked = False
        self.response = response
        self.throttle_due = False
        self.stream: str | None = None
        self.parts: list[memoryview] | None = None
        self.size = 0
