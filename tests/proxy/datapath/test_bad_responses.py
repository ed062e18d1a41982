"""A broker's response that does not parse, seen from two clients: the one it answers is closed
with its broker connection, one log line names the request and the broker, and the other client
is served on. A response no stage reads is passed on as the broker sent it."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from kafka.protocol.metadata.find_coordinator import FindCoordinatorResponse

from kafka_quota_proxy.protocol.headers import RequestHeader, frame_request, frame_response
from kafka_quota_proxy.proxy.datapath.upstream import STREAM_FROM
from tests.proxy.conftest import correlation_id, is_closed, list_groups, read_frame, request_frame, running
from tests.proxy.quota_support import fetch, fetch_response
from tests.support.fake_broker import BrokerConn, Handler, default_handler, list_groups_v0_body

METADATA_V1_ALL = request_frame(3, 1, 7, b"\xff\xff\xff\xff")  # topics null: every topic
FIND_COORDINATOR_V4 = request_frame(10, 4, 7, b"\x00\x02\x03g1\x00", flexible=True)  # group g1
FETCH_V11 = frame_request(fetch(11), 11, 7, "c")


def _metadata(damage: Callable[[bytes], bytes]) -> Callable[[RequestHeader, bytes], bytes]:
    return lambda header, body: damage(body) if header.api_key == 3 else body


async def _find_coordinator_size_short(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
    """FindCoordinator answered with a size prefix 3 bytes short: the frame ends inside the
    coordinator's address, which the proxy rewrites."""
    if header.api_key != 10:
        return list_groups_v0_body()
    body = FindCoordinatorResponse(version=4, throttle_time_ms=0, coordinators=[
        FindCoordinatorResponse.Coordinator(key="g1", node_id=1, host="127.0.0.1", port=9092,
                                            error_code=0, error_message=None)]).encode(version=4)
    whole = frame_response(header.correlation_id, 1, bytes(body))
    conn.writer.write(struct.pack(">i", len(whole) - 4 - 3) + whole[4:])
    return None


async def _large_fetch_misaddressed(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
    """A Fetch response large enough to be handled as it arrives (streaming.py), under another
    request's correlation id."""
    if header.api_key != 1:
        return list_groups_v0_body()
    body = fetch_response(11, 0, b"r" * 2 * STREAM_FROM)
    conn.writer.write(frame_response(header.correlation_id + 1, 0, body))
    return None


async def _garbage_frame(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
    """Request 7 answered with bytes that are no frame at all (a negative size prefix)."""
    if header.correlation_id != 7:
        return list_groups_v0_body()
    conn.writer.write(b"\xff\xfe garbage \x00\x01")
    return None


@dataclass(frozen=True)
class Case:
    request: bytes  # correlation id 7
    kind: str  # the ProtocolError's kind: kafka_quota_proxy_protocol_errors_total{kind="broker_<kind>"}
    names: str  # how the log line names the request
    handler: Handler = default_handler
    damage: Callable[[RequestHeader, bytes], bytes] | None = None


CASES = {
    # Metadata: parsed to rewrite its broker addresses (BrokerAddresses), after kafka-python
    # decodes it whole for the cluster view: any fault there, a cut one too, is `malformed`.
    "metadata truncated": Case(METADATA_V1_ALL, "malformed", "Metadata v1 (API key 3)",
                               damage=_metadata(lambda body: body[:-5])),
    "metadata garbage": Case(METADATA_V1_ALL, "malformed", "Metadata v1 (API key 3)",
                             damage=_metadata(lambda body: b"\xa5" * len(body))),
    "find coordinator size short": Case(FIND_COORDINATOR_V4, "truncated", "FindCoordinator v4 (API key 10)",
                                        handler=_find_coordinator_size_short),
    "large fetch misaddressed": Case(FETCH_V11, "protocol_error", "Fetch v11 (API key 1)",
                                     handler=_large_fetch_misaddressed),
    # Not even a frame: caught before any stage, for a response the proxy only forwards too.
    "garbage frame": Case(list_groups(7), "negative_frame_length", "ListGroups v0 (API key 16)",
                          handler=_garbage_frame),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_response_that_does_not_parse_closes_that_connection_only(
        name: str, caplog: pytest.LogCaptureFixture) -> None:
    case = CASES[name]
    seen: dict[str, str] = {}

    async def scenario() -> None:
        async with running(case.handler) as h:
            h.broker.damage = case.damage
            seen["broker"] = f"127.0.0.1:{h.broker.port}"
            good_r, good_w = await h.connect()
            good_w.write(list_groups(1))
            assert correlation_id(await read_frame(good_r)) == 1

            bad_r, bad_w = await h.connect()
            seen["client"] = f"127.0.0.1:{bad_w.get_extra_info('sockname')[1]}"
            bad_w.write(case.request)
            assert await is_closed(bad_r)  # closed, not left to a client's request timeout
            (upstream,) = [c for c in h.broker.conns if case.request in c.frames]
            await h.wait_for(lambda: upstream.ended_at is not None)  # its broker connection too
            assert h.errors("broker_" + case.kind) == 1

            good_w.write(list_groups(2))  # the other connection carries on
            assert correlation_id(await read_frame(good_r)) == 2
            good_w.close()
            bad_w.close()
    with caplog.at_level("INFO", logger="kafka_quota_proxy"):
        asyncio.run(scenario())
    # One line, naming the request and the broker; nothing else said about that client, no traceback.
    problems = [r for r in caplog.records if r.levelno >= 30]
    assert [r.getMessage() for r in problems] == [
        line for r in caplog.records if seen["client"] in (line := r.getMessage())]
    (line,) = problems
    assert line.levelname == "ERROR" and line.exc_info is None
    assert line.getMessage().startswith(
        f"closing connection from {seen['client']} (ANONYMOUS, bootstrap): bad response from broker "
        f"{seen['broker']} to {case.names}: {case.kind}: ")


def test_a_response_no_stage_reads_is_passed_on_as_the_broker_sent_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """ListGroups (no quota set): the proxy reads the frame's size and correlation id and nothing
    else, so a body no parser would take reaches the client untouched, and the connection goes on."""
    garbage = b"\xff\xfe not a ListGroups body \x00"

    async def handler(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        return garbage if header.correlation_id == 7 else list_groups_v0_body()

    async def scenario() -> None:
        async with running(handler) as h:
            reader, writer = await h.connect()
            writer.write(list_groups(7))
            assert await read_frame(reader) == frame_response(7, 0, garbage)
            writer.write(list_groups(8))
            assert await read_frame(reader) == frame_response(8, 0, list_groups_v0_body())
            writer.close()
    with caplog.at_level("INFO", logger="kafka_quota_proxy"):
        asyncio.run(scenario())
    assert not [r for r in caplog.records if r.levelno >= 30]
