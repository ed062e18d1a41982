"""Which request a broker's response answers, and in what order responses go out: the ordering
rules of a Kafka connection, as a pure function of the requests still waiting and the response's
first bytes, and the queue that keeps them (no socket, no clock), tested by feeding bytes."""

from __future__ import annotations

from collections import deque

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import RequestHeader, response_correlation_id
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext, Times
from kafka_quota_proxy.proxy.datapath.responses import Pending, request_order

Unasked = tuple[int, RequestHeader]  # an acks=0 Produce forwarded: its place in request order, its header


def match_response(awaiting: deque[Pending], unasked: deque[Unasked],
                   head: bytes | memoryview) -> Pending | Unasked:
    """The request answered by the response starting with `head`, taken off its queue.

    A broker answers a connection's requests in the order they were sent: the oldest request
    still `awaiting` an answer. An acks=0 Produce expects none, and Kafka sends none, but some
    brokers (Tansu) answer it all the same, so one forwarded before that oldest request
    (`unasked`, oldest first) is answered where it has the response's correlation id; those
    before it without are forgotten, as a broker that answers none lets them go. The response's
    correlation id is read only then. ProtocolError where nothing awaits an answer."""
    if unasked and (not awaiting or unasked[0][0] < awaiting[0].seq):
        correlation_id = response_correlation_id(head)
        while unasked and (not awaiting or unasked[0][0] < awaiting[0].seq):
            found = unasked.popleft()
            if found[1].correlation_id == correlation_id:
                return found
    if not awaiting:
        raise ProtocolError(f"unsolicited response (correlation id {response_correlation_id(head)})")
    return awaiting.popleft()


def unasked_answer(unasked: Unasked, info: ConnectionInfo, now: float) -> Pending:
    """The queue entry for the broker's answer to an acks=0 Produce, to be passed on as it came
    (`ResponseQueue.put_back`); `now`: when it arrived (perf_counter)."""
    seq, header = unasked
    ctx = RequestContext(header, memoryview(b""), info, times=Times(now, 0.0, now))
    pending = Pending(ctx, seq=seq)
    pending.unasked = True
    return pending


class ResponseQueue:
    """A connection's requests in the order their responses must go out, with no socket and no
    clock: a Kafka client takes responses in request order, and the proxy answers some requests
    itself, so every request that gets a response waits here (`inflight`) and goes out only
    once every earlier one has. Those forwarded to the broker are also `awaiting` its answer, in
    the order sent. An acks=0 Produce gets none from Kafka, and some brokers (Tansu) answer it
    all the same, so it is remembered apart (`unasked`, the newest `unasked_tracked`): an answer
    that comes for it is put in its place, and one that never comes holds nothing up."""

    __slots__ = ("inflight", "awaiting", "unasked")

    def __init__(self, unasked_tracked: int) -> None:
        self.inflight: deque[Pending] = deque()  # every request that will get a response
        self.awaiting: deque[Pending] = deque()  # the subset forwarded to the broker
        self.unasked: deque[Unasked] = deque(maxlen=unasked_tracked)

    def forwarded(self, ctx: RequestContext) -> Pending:
        """A request sent to the broker, its answer to come."""
        pending = Pending(ctx)
        self.inflight.append(pending)
        self.awaiting.append(pending)
        return pending

    def local(self, ctx: RequestContext) -> Pending:
        """A request the proxy answers itself: its place in the order, the answer to come."""
        pending = Pending(ctx)
        self.inflight.append(pending)
        return pending

    def forwarded_unasked(self, header: RequestHeader) -> None:
        """An acks=0 Produce sent to the broker, which may or may not answer it."""
        self.unasked.append((next(request_order), header))

    def answered(self, head: bytes | memoryview) -> Pending | Unasked:
        """The request the broker's response starting with `head` answers (`match_response`)."""
        return match_response(self.awaiting, self.unasked, head)

    def put_back(self, pending: Pending) -> None:
        """An answer to an acks=0 Produce, ready: after every earlier response still queued,
        before every later one."""
        inflight = self.inflight
        at = len(inflight)
        while at and inflight[at - 1].seq > pending.seq:
            at -= 1
        inflight.insert(at, pending)

    def next_ready(self) -> Pending | None:
        """The oldest request, taken off the queue, if its response is ready to go out."""
        inflight = self.inflight
        if inflight and inflight[0].response is not None:
            return inflight.popleft()
        return None

    def first(self, pending: Pending) -> bool:
        """Whether every response before `pending`'s has gone out."""
        return bool(self.inflight) and self.inflight[0] is pending

    def streamed(self, pending: Pending) -> None:
        """`pending`, first in the queue, has had its response written on as it arrived."""
        popped = self.inflight.popleft()
        assert popped is pending

    def oldest_awaiting(self) -> Pending | None:
        """The forwarded request the broker is to answer next."""
        return self.awaiting[0] if self.awaiting else None
