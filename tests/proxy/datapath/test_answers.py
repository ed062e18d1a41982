"""Which request a broker's response answers, and the order responses go out in
(proxy/datapath/answers.py), by feeding response bytes: in request order, with the proxy's own
answers between the broker's, and acks=0 Produce requests that a broker may or may not answer."""

from __future__ import annotations

from collections import deque

import pytest

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import RequestHeader, frame_response, parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.datapath.answers import ResponseQueue, Unasked, match_response
from kafka_quota_proxy.proxy.datapath.responses import Pending
from tests.proxy.conftest import request_frame

INFO = ConnectionInfo("127.0.0.1:5000", "bootstrap")


def header(api_key: int, correlation_id: int) -> RequestHeader:
    return parse_request_header(memoryview(request_frame(api_key, 3 if api_key == 0 else 0, correlation_id)))


def forwarded(seq: int, correlation_id: int, api_key: int = 3) -> Pending:
    """A request expecting an answer, `seq`-th in request order."""
    h = header(api_key, correlation_id)
    return Pending(RequestContext(h, memoryview(b""), INFO), seq=seq)


def unasked(seq: int, correlation_id: int) -> Unasked:
    """An acks=0 Produce, `seq`-th in request order."""
    return (seq, header(0, correlation_id))


def response(correlation_id: int) -> bytes:
    return frame_response(correlation_id, 0, b"\x00" * 8)


def test_responses_answer_the_oldest_waiting_request_in_turn() -> None:
    a, b, c = forwarded(1, 11), forwarded(2, 12), forwarded(3, 13)
    awaiting, none = deque([a, b, c]), deque[Unasked]()
    # The correlation id is not consulted without acks=0 requests: order decides.
    assert match_response(awaiting, none, response(11)) is a
    assert match_response(awaiting, none, response(12)) is b
    assert list(awaiting) == [c]


def test_a_broker_that_answers_an_acks0_produce_has_it_matched_in_its_place() -> None:
    a = forwarded(2, 21)
    awaiting, pending_acks0 = deque([a]), deque([unasked(1, 20)])
    assert match_response(awaiting, pending_acks0, response(20)) == (1, header(0, 20))
    assert match_response(awaiting, pending_acks0, response(21)) is a
    assert not awaiting and not pending_acks0


def test_acks0_requests_a_broker_let_go_unanswered_are_forgotten() -> None:
    # Kafka answers no acks=0 Produce: the answer to the next request passes over them.
    a = forwarded(4, 40)
    awaiting, pending_acks0 = deque([a]), deque([unasked(1, 37), unasked(2, 38), unasked(3, 39)])
    assert match_response(awaiting, pending_acks0, response(40)) is a
    assert not pending_acks0


def test_an_acks0_produce_sent_after_the_waiting_request_is_kept_for_later() -> None:
    a = forwarded(1, 50)
    awaiting, pending_acks0 = deque([a]), deque([unasked(2, 51)])
    assert match_response(awaiting, pending_acks0, response(50)) is a
    assert list(pending_acks0) == [unasked(2, 51)]  # its answer, if any, is still to come
    assert match_response(awaiting, pending_acks0, response(51)) == (2, header(0, 51))


def test_an_answer_to_nothing_is_a_protocol_error_naming_its_correlation_id() -> None:
    with pytest.raises(ProtocolError, match="unsolicited response \\(correlation id 99\\)"):
        match_response(deque(), deque([unasked(1, 98)]), response(99))


def ctx(correlation_id: int, api_key: int = 3) -> RequestContext:
    return RequestContext(header(api_key, correlation_id), memoryview(b""), INFO)


def written(queue: ResponseQueue) -> list[int]:
    """The correlation ids of the responses that may go out now, in the order they go."""
    out = []
    while (pending := queue.next_ready()) is not None:
        out.append(pending.ctx.header.correlation_id)
    return out


def answer(queue: ResponseQueue, correlation_id: int) -> Pending:
    """The broker's response with this correlation id, matched and made ready (as the
    connection does once its response stages have run)."""
    found = queue.answered(response(correlation_id))
    if isinstance(found, Pending):
        found.response = response(correlation_id)
        return found
    seq, h = found
    pending = Pending(RequestContext(h, memoryview(b""), INFO), seq=seq)
    pending.unasked = True
    pending.response = response(correlation_id)
    queue.put_back(pending)
    return pending


def test_responses_go_out_in_request_order_whatever_order_they_are_ready_in() -> None:
    queue = ResponseQueue(16)
    queue.forwarded(ctx(1))
    local = queue.local(ctx(2))  # answered by the proxy, slowly (a SASL exchange decided off the loop)
    queue.forwarded(ctx(3))
    queue.forwarded(ctx(4))
    oldest = queue.oldest_awaiting()
    assert oldest is not None and oldest.ctx.header.correlation_id == 1
    answer(queue, 1)
    assert written(queue) == [1]
    answer(queue, 3)
    answer(queue, 4)
    assert written(queue) == []  # the proxy's own answer, before them, is not ready
    assert queue.first(local)
    local.response = response(2)
    assert written(queue) == [2, 3, 4]
    assert not queue.inflight and not queue.awaiting


def test_the_broker_answers_forwarded_requests_only_the_proxys_own_keep_their_place() -> None:
    queue = ResponseQueue(16)
    a = queue.forwarded(ctx(1))
    b = queue.local(ctx(2))
    c = queue.forwarded(ctx(3))
    assert list(queue.awaiting) == [a, c] and list(queue.inflight) == [a, b, c]
    assert queue.answered(response(1)) is a
    assert queue.answered(response(3)) is c  # the next the broker owes, not the proxy's own
    with pytest.raises(ProtocolError, match="unsolicited"):
        queue.answered(response(4))


def test_acks0_produce_answers_from_a_broker_that_sends_them_go_out_in_their_place() -> None:
    queue = ResponseQueue(16)
    queue.forwarded(ctx(1))
    queue.forwarded_unasked(header(0, 2))
    queue.forwarded(ctx(3))
    queue.forwarded_unasked(header(0, 4))
    answer(queue, 1)
    answer(queue, 2)  # Tansu answers acks=0
    assert written(queue) == [1, 2]
    answer(queue, 3)
    answer(queue, 4)
    assert written(queue) == [3, 4]
    assert not queue.unasked


def test_an_acks0_answer_ready_before_an_earlier_response_waits_for_it() -> None:
    queue = ResponseQueue(16)
    slow = queue.local(ctx(1))
    queue.forwarded_unasked(header(0, 2))
    queue.forwarded(ctx(3))
    answer(queue, 2)
    answer(queue, 3)
    assert written(queue) == []
    slow.response = response(1)
    assert written(queue) == [1, 2, 3]


def test_acks0_produce_requests_a_broker_never_answers_hold_nothing_up() -> None:
    queue = ResponseQueue(16)
    for correlation_id in range(1, 6):
        queue.forwarded_unasked(header(0, correlation_id))
    queue.forwarded(ctx(6))
    answer(queue, 6)  # Kafka: no answer to the five before it
    assert written(queue) == [6]
    assert not queue.unasked and not queue.inflight


def test_only_the_newest_acks0_requests_are_remembered() -> None:
    queue = ResponseQueue(3)
    for correlation_id in range(1, 6):
        queue.forwarded_unasked(header(0, correlation_id))
    assert [h.correlation_id for _, h in queue.unasked] == [3, 4, 5]


def test_a_response_written_on_as_it_arrived_leaves_the_queue_first() -> None:
    queue = ResponseQueue(16)
    fetch = queue.forwarded(ctx(1, api_key=1))
    later = queue.forwarded(ctx(2))
    assert queue.answered(response(1)) is fetch and queue.first(fetch) and not queue.first(later)
    queue.streamed(fetch)
    assert queue.first(later)
