"""Which request a broker's response answers (proxy/datapath/answers.py), by feeding response
bytes: in request order, with acks=0 Produce requests that a broker may or may not answer."""

from __future__ import annotations

from collections import deque

import pytest

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import RequestHeader, frame_response, parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.datapath.answers import Unasked, match_response
from kafka_quota_proxy.proxy.datapath.responses import Pending
from tests.proxy.conftest import request_frame

INFO = ConnectionInfo("127.0.0.1:5000", "bootstrap")


def header(api_key: int, correlation_id: int) -> RequestHeader:
    return parse_request_header(memoryview(request_frame(api_key, 3 if api_key == 0 else 0, correlation_id)))


def forwarded(seq: int, correlation_id: int, api_key: int = 3) -> Pending:
    """A request expecting an answer, `seq`-th in request order."""
    h = header(api_key, correlation_id)
    return Pending(RequestContext(h, memoryview(b""), INFO, received_at=0.0), seq=seq)


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
