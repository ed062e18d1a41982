"""Which request a broker's response answers: the ordering rule of a Kafka connection, as a
pure function of the requests still waiting and the response's first bytes (no socket, no
clock), so that it is tested by feeding bytes."""

from __future__ import annotations

from collections import deque

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import RequestHeader, response_correlation_id
from kafka_quota_proxy.proxy.datapath.responses import Pending

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
