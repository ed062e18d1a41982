"""What crosses the proxy, byte for byte, seen from a scripted broker."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import DescribeClientQuotasResponse
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from devkit.processes import free_port
from kafka_quota_proxy.config.credentials_file import save_credentials
from kafka_quota_proxy.identity.credentials import CredentialStore
from kafka_quota_proxy.protocol.headers import RequestHeader, frame_request
from kafka_quota_proxy.proxy.datapath import client as client_module
from kafka_quota_proxy.proxy.datapath.client import ClientConnection
from tests.proxy.conftest import (
    LOOPS,
    Harness,
    correlation_id,
    is_closed,
    list_groups,
    produce_acks0_v3,
    read_frame,
    request_frame,
    run_on,
    running,
)
from tests.proxy.quota_support import describe, entries
from tests.support.fake_broker import BrokerConn, list_groups_v0_body


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_requests_and_responses_pass_unchanged() -> None:
    async def scenario() -> None:
        async with running() as h:
            reader, writer = await h.connect()
            frames = [list_groups(i) for i in range(1, 6)]
            writer.write(b"".join(frames))  # five requests in flight at once
            responses = [await read_frame(reader) for _ in frames]
            assert [correlation_id(r) for r in responses] == [1, 2, 3, 4, 5]
            assert all(r[8:] == list_groups_v0_body() for r in responses)
            (conn,) = h.broker.client_conns()
            assert conn.frames == frames
            writer.close()
    run(scenario())


BAD_INPUTS = {
    "garbage": (b"\xff\xfe garbage, not kafka \x00\x01\x02\x03" * 3, "negative_frame_length"),
    "negative length": (struct.pack(">i", -5) + b"abcde", "negative_frame_length"),
    "oversized": (struct.pack(">i", 2048) + b"x" * 64, "frame_too_large"),
    "truncated header": (struct.pack(">i", 5) + b"\x00\x10\x00\x00\x00", "truncated"),
    "unknown api key": (request_frame(999, 0, 1), "unknown_api_key"),
    "unknown version": (request_frame(3, 99, 1), "unsupported_api_version"),
    "bad client id length": (struct.pack(">ihhih", 10, 16, 0, 1, -7), "malformed"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_closes_that_connection_only(name: str, caplog: pytest.LogCaptureFixture) -> None:
    data, kind = BAD_INPUTS[name]

    async def scenario() -> None:
        async with running(max_frame_bytes=1024) as h:
            good_r, good_w = await h.connect()
            good_w.write(list_groups(1))
            assert correlation_id(await read_frame(good_r)) == 1

            bad_r, bad_w = await h.connect()
            await h.wait_for(lambda: len(h.proxy.connections) == 2)
            bad_w.write(data)
            assert await is_closed(bad_r)
            assert h.errors(kind) == 1

            good_w.write(list_groups(2))  # the other connection carries on
            assert correlation_id(await read_frame(good_r)) == 2
            # Nothing of the bad input reached the broker.
            received = sorted(bytes(c.received) for c in h.broker.client_conns())
            assert received in ([list_groups(1) + list_groups(2)],
                                [b"", list_groups(1) + list_groups(2)])
            good_w.close()
    with caplog.at_level("WARNING", logger="kafka_quota_proxy"):
        run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert warnings[0].startswith("closing connection from 127.0.0.1:")
    assert f": {kind}: " in warnings[0]


def test_partial_frame_is_never_forwarded() -> None:
    async def scenario() -> None:
        async with running() as h:
            reader, writer = await h.connect()
            whole, half = list_groups(1), list_groups(2)[:9]
            writer.write(whole + half)
            assert correlation_id(await read_frame(reader)) == 1
            writer.close()
            await h.wait_for(lambda: not h.proxy.connections)
            assert [c.received for c in h.broker.client_conns()] == [bytearray(whole)]
    run(scenario())


def test_local_reply_waits_for_earlier_broker_responses() -> None:
    release = asyncio.Event()

    async def slow(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        if header.correlation_id == 1:
            await release.wait()
        return list_groups_v0_body()

    async def scenario() -> None:
        async with running(slow) as h:
            reader, writer = await h.connect()
            # ApiVersions v9 is newer than the codec: the proxy answers it itself (KIP-511).
            writer.write(list_groups(1) + request_frame(18, 9, 2, flexible=True) + list_groups(3))
            with pytest.raises(asyncio.TimeoutError):
                await read_frame(reader, timeout=0.3)  # nothing may overtake response 1
            release.set()
            responses = [await read_frame(reader) for _ in range(3)]
            assert [correlation_id(r) for r in responses] == [1, 2, 3]
            # v0 body: error 35, one entry (18, 0, 4)
            assert responses[1][8:] == struct.pack(">hihhh", 35, 1, 18, 0, 4)
            writer.close()
    run(scenario())


def test_produce_acks0_gets_no_response_and_keeps_order() -> None:
    async def handler(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        return None if header.api_key == 0 else list_groups_v0_body()

    async def scenario_with_handler() -> None:
        async with running(handler) as h:
            reader, writer = await h.connect()
            frames = [produce_acks0_v3(1), list_groups(2), produce_acks0_v3(3), list_groups(4)]
            writer.write(b"".join(frames))
            assert [correlation_id(await read_frame(reader)) for _ in range(2)] == [2, 4]
            await h.wait_for(lambda: len(h.broker.client_conns()[0].frames) == 4)
            assert h.broker.client_conns()[0].frames == frames
            writer.close()
    run(scenario_with_handler())


PRODUCE_V3_EMPTY = struct.pack(">ii", 0, 0)  # responses [], throttle_time_ms 0


def test_broker_answers_to_acks0_produce_pass_on_in_order() -> None:
    """Tansu answers acks=0 Produce requests, which Kafka never does: the answers go to the
    client as they came, in request order, and the connection stays open."""
    async def answers_all(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        return PRODUCE_V3_EMPTY if header.api_key == 0 else list_groups_v0_body()

    async def scenario() -> None:
        async with running(answers_all) as h:
            reader, writer = await h.connect()
            for round_ in range(3):  # the connection carries on after each answer
                base = round_ * 10
                frames = [produce_acks0_v3(base + 1), list_groups(base + 2), produce_acks0_v3(base + 3),
                          produce_acks0_v3(base + 4), list_groups(base + 5)]
                writer.write(b"".join(frames))
                responses = [await read_frame(reader) for _ in frames]
                assert [correlation_id(r) for r in responses] == [base + n for n in (1, 2, 3, 4, 5)]
                assert responses[0] == struct.pack(">ii", 12, base + 1) + PRODUCE_V3_EMPTY
                assert responses[1][8:] == list_groups_v0_body()
            assert h.errors("broker_protocol_error") == 0
            assert len(h.proxy.connections) == 1
            writer.close()
    run(scenario())


def test_a_broker_may_answer_some_acks0_produce_requests_and_not_others() -> None:
    async def odd_only(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        if header.api_key == 0:
            return PRODUCE_V3_EMPTY if header.correlation_id % 2 else None
        return list_groups_v0_body()

    async def scenario() -> None:
        async with running(odd_only) as h:
            reader, writer = await h.connect()
            frames = [produce_acks0_v3(1), produce_acks0_v3(2), list_groups(3), produce_acks0_v3(4),
                      produce_acks0_v3(5), list_groups(6)]
            writer.write(b"".join(frames))
            responses = [await read_frame(reader) for _ in range(4)]
            assert [correlation_id(r) for r in responses] == [1, 3, 5, 6]
            writer.write(list_groups(7))  # still open, still in step
            assert correlation_id(await read_frame(reader)) == 7
            writer.close()
    run(scenario())


def test_local_answer_after_unanswered_acks0_produce_is_not_held() -> None:
    """Against a broker that never answers acks=0 (Kafka), nothing waits for such an answer."""
    async def kafka_like(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        return None if header.api_key == 0 else list_groups_v0_body()

    async def scenario() -> None:
        async with running(kafka_like) as h:
            reader, writer = await h.connect()
            # ApiVersions v9 is newer than the codec: the proxy answers it itself.
            writer.write(produce_acks0_v3(1) + request_frame(18, 9, 2, flexible=True))
            assert correlation_id(await read_frame(reader, timeout=2.0)) == 2
            writer.close()
    run(scenario())


def test_answer_to_acks0_produce_waits_for_earlier_responses() -> None:
    release = asyncio.Event()

    async def slow_first(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        if header.correlation_id == 1:
            await release.wait()
        return PRODUCE_V3_EMPTY if header.api_key == 0 else list_groups_v0_body()

    async def scenario() -> None:
        async with running(slow_first) as h:
            reader, writer = await h.connect()
            writer.write(list_groups(1) + produce_acks0_v3(2) + list_groups(3))
            with pytest.raises(asyncio.TimeoutError):
                await read_frame(reader, timeout=0.3)
            release.set()
            assert [correlation_id(await read_frame(reader)) for _ in range(3)] == [1, 2, 3]
            writer.close()
    run(scenario())


@pytest.mark.parametrize("waiting", [False, True])
def test_response_matching_nothing_forwarded_closes_the_connection(waiting: bool) -> None:
    """Leniency stops at a correlation id the proxy never forwarded: a protocol error."""
    async def stray(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        if header.api_key == 0:
            conn.writer.write(struct.pack(">ii", 12, 99) + PRODUCE_V3_EMPTY)  # correlation id 99
            await conn.writer.drain()
        return None

    async def scenario() -> None:
        async with running(stray) as h:
            reader, writer = await h.connect()
            if waiting:  # a ListGroups forwarded after the Produce is the one 99 fails to match
                writer.write(produce_acks0_v3(1) + list_groups(2))
            else:
                writer.write(produce_acks0_v3(1))
            assert await is_closed(reader)
            await h.wait_for(lambda: h.errors("broker_protocol_error") == 1)
            writer.close()
    run(scenario())


async def _acks0_then_leave_reaches_the_broker(h: Harness, count: int) -> None:
    """A client writes `count` acks=0 Produce requests and closes at once: every one reaches
    the broker, in order, on one connection."""
    _, writer = await h.connect()
    frames = [produce_acks0_v3(i) for i in range(1, count + 1)]
    writer.write(b"".join(frames))
    await writer.drain()
    writer.close()
    await h.wait_for(lambda: sum(len(c.frames) for c in h.broker.client_conns()) == count)
    assert h.broker.client_conns()[0].frames == frames


def test_acks0_records_reach_broker_when_client_closes_at_once() -> None:
    async def handler(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        return None

    async def scenario() -> None:
        async with running(handler) as h:
            await _acks0_then_leave_reaches_the_broker(h, 200)
    run(scenario())


def test_acks0_records_reach_a_broker_that_answers_them_when_client_closes_at_once() -> None:
    """A broker that answers acks=0 (Tansu) and is still working through them when the client
    leaves: the proxy lets it finish rather than reset the connection under its answers."""
    async def slow_answers(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        await asyncio.sleep(0.002)
        return PRODUCE_V3_EMPTY

    async def scenario() -> None:
        async with running(slow_answers) as h:
            _, writer = await h.connect()
            frames = [produce_acks0_v3(i) for i in range(1, 301)]
            writer.write(b"".join(frames))
            await writer.drain()
            await h.wait_for(lambda: len(h.broker.client_conns()) == 1
                             and len(h.broker.client_conns()[0].frames) > 0)
            writer.close()  # with 300 requests still to handle, and their answers to write
            await h.wait_for(lambda: len(h.broker.client_conns()[0].frames) == 300, timeout=10)
            assert h.broker.client_conns()[0].frames == frames
            await h.wait_for(lambda: not h.proxy.connections)
    run(scenario())


@pytest.fixture
def slow_broker_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every broker connection of the proxy's data path takes 0.4 s to be made."""
    real = client_module.open_upstream_connection

    async def slow(*args: Any) -> Any:
        await asyncio.sleep(0.4)
        return await real(*args)
    monkeypatch.setattr(client_module, "open_upstream_connection", slow)


@pytest.mark.parametrize("loop", LOOPS)
def test_requests_read_before_the_broker_connection_is_up_reach_it_though_the_client_left(
        loop: str, slow_broker_connect: None) -> None:
    """On uvloop the proxy reads a new connection at once, though it asked not to until its
    broker connection is made; a client that sent and left meanwhile lost what it sent."""
    async def scenario() -> None:
        async with running() as h:
            await _acks0_then_leave_reaches_the_broker(h, 200)
            await h.wait_for(lambda: not h.proxy.connections)
    run_on(loop, scenario())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_is_not_read_while_its_broker_connection_is_made(loop: str,
                                                                  slow_broker_connect: None) -> None:
    """What the proxy holds for a connection before its broker connection is up: one read at
    most, not all a client sends meanwhile (on uvloop: everything, before the fix)."""
    async def scenario() -> None:
        async with running() as h:
            _, writer = await h.connect()
            writer.write(bytes(8 << 20))  # 8 MiB: the start of one large frame and more
            await asyncio.sleep(0.3)
            (conn,) = h.proxy.connections
            assert isinstance(conn, ClientConnection)
            assert conn.upstream is None
            assert sum(len(data) for data in conn._early) <= 256 * 1024
            writer.close()
    run_on(loop, scenario())


def test_broker_closing_closes_the_client() -> None:
    async def hang_up(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        conn.close()
        return None

    async def scenario() -> None:
        async with running(hang_up) as h:
            reader, writer = await h.connect()
            writer.write(list_groups(1))
            assert await is_closed(reader)
            await h.wait_for(lambda: not h.proxy.connections)
    run(scenario())


def test_unreachable_node_closes_client_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with running() as h:
            await h.broker.stop()  # broker gone: the bootstrap listener has nowhere to go
            reader, _ = await h.connect()
            assert await is_closed(reader, timeout=15)
    with caplog.at_level("WARNING", logger="kafka_quota_proxy"):
        run(scenario())
    lines = [r.getMessage() for r in caplog.records if "no broker reachable" in r.getMessage()]
    assert len(lines) == 1


def _producer_frame(correlation: int, size: int) -> bytes:
    return request_frame(0, 3, correlation, struct.pack(">hhii", -1, 0, 1000, 0) + b"\x00" * size)


def test_slow_broker_stops_the_proxy_reading_from_a_fast_producer() -> None:
    async def handler(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        return None if header.api_key == 0 else list_groups_v0_body()

    async def scenario() -> None:
        async with running(handler) as h:
            reader, writer = await h.connect()
            writer.write(list_groups(0))  # establish the upstream connection
            await h.wait_for(lambda: bool(h.broker.client_conns()))
            (broker_conn,) = h.broker.client_conns()
            broker_conn.reading.clear()  # the broker stops reading
            frame_size = 256 * 1024
            sent = []
            blocked = False
            for i in range(1, 1024):  # at most 256 MiB
                frame = _producer_frame(i, frame_size)
                writer.write(frame)
                sent.append(frame)
                try:
                    await asyncio.wait_for(writer.drain(), 1.0)
                except TimeoutError:
                    blocked = True
                    break
            assert blocked, "the proxy kept reading although the broker did not"
            (conn,) = h.proxy.connections
            assert "upstream-busy" in conn.core.reasons
            assert conn.upstream.transport.get_write_buffer_size() <= 2 * frame_size + 64 * 1024
            broker_conn.reading.set()  # the broker catches up: every byte arrives, in order
            expected = list_groups(0) + b"".join(sent)
            await h.wait_for(lambda: len(broker_conn.received) >= len(expected), timeout=30)
            assert bytes(broker_conn.received) == expected
            writer.close()
    run(scenario())


def test_slow_consumer_stops_the_proxy_reading_from_the_broker() -> None:
    big = b"\x00\x00\x00\x00\x00\x00" + b"r" * (1024 * 1024)

    async def handler(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        return big

    async def scenario() -> None:
        async with running(handler) as h:
            reader, writer = await h.connect()
            writer.write(b"".join(list_groups(i) for i in range(1, 101)))  # 100 MiB of responses
            await writer.drain()
            await h.wait_for(lambda: bool(h.proxy.connections))
            (conn,) = h.proxy.connections
            await h.wait_for(lambda: conn.upstream is not None and
                             "client-busy" in conn.upstream.gate.reasons, timeout=10)
            await asyncio.sleep(0.5)  # give an unbounded proxy time to misbehave
            assert conn.transport.get_write_buffer_size() <= 4 * len(big)
            (broker_conn,) = h.broker.client_conns()
            assert len(broker_conn.frames) < 100  # the broker is held back too
            responses = [await read_frame(reader, timeout=30) for _ in range(100)]
            assert [correlation_id(r) for r in responses] == list(range(1, 101))
            assert all(r[8:] == big for r in responses)
            writer.close()
    run(scenario())



def test_a_client_that_never_reads_cannot_pile_up_the_proxys_own_answers() -> None:
    # DescribeClientQuotas is answered by the proxy itself, so the in-flight bound (requests
    # forwarded to the broker) never stops it: only the client transport's backpressure does.
    # Without it, every request read added its answer (here ~1 KB for ~40 bytes) to the write
    # buffer, unbounded. Small socket buffers keep the kernel from taking megabytes first.
    quotas = [{"client-id": f"tenant-{i:04d}", "producer_byte_rate": 1_000_000} for i in range(30)]
    describe_all = describe([], strict=False)
    sent = 400

    async def scenario() -> None:
        async with running(quotas=quotas) as h:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", h.settings.listen.port))
            reader, writer = await asyncio.open_connection(sock=sock)
            await h.wait_for(lambda: bool(h.proxy.connections))
            writer.write(b"".join(frame_request(describe_all, 1, i, "c") for i in range(sent)))
            (conn,) = h.proxy.connections
            conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            await h.wait_for(lambda: "client-busy" in conn.core.reasons, timeout=30)
            await asyncio.sleep(0.5)  # time for an unbounded proxy to go on
            buffered = conn.transport.get_write_buffer_size()
            handled = h.proxy.metrics.api(48).requests
            assert "client-busy" in conn.core.reasons
            answers = [await read_frame(reader, timeout=30) for _ in range(sent)]  # then all, in order
            assert [correlation_id(a) for a in answers] == list(range(sent))
            assert len(entries(DescribeClientQuotasResponse.decode(answers[-1][9:], version=1))) == 30
            # Reading stopped with most requests unread: the write buffer stays under its high-water
            # mark, overshot by at most one answer.
            assert handled < sent // 2
            assert buffered <= 64 * 1024 + len(answers[0])
            writer.close()
    run(scenario())


def test_requests_waiting_for_their_responses_do_not_keep_their_frames() -> None:
    # The broker reads every Produce and answers none: each of the max_inflight_requests waiting
    # kept its whole frame, so a client could make the proxy hold that many max-size frames.
    async def handler(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        return None if header.api_key == 0 else list_groups_v0_body()

    async def scenario() -> None:
        async with running(handler) as h:
            reader, writer = await h.connect()
            acks1 = struct.pack(">hhii", -1, 1, 1000, 0) + b"\x00" * (1024 * 1024)
            frames = [request_frame(0, 3, i, acks1) for i in range(1, 6)]
            writer.write(b"".join(frames))
            await h.wait_for(lambda: bool(h.broker.client_conns()))
            (broker_conn,) = h.broker.client_conns()
            await h.wait_for(lambda: len(broker_conn.frames) == 5, timeout=10)
            assert broker_conn.frames == frames
            (conn,) = h.proxy.connections
            assert len(conn.core.order.awaiting) == 5
            assert [len(p.ctx.frame) for p in conn.core.order.awaiting] == [0] * 5
            broker_conn.close()  # else shutdown waits for the five answers
            await h.wait_for(lambda: not h.proxy.connections)
    run(scenario())


def test_broker_first_named_in_a_response_gets_a_listener_that_routes_to_it() -> None:
    from kafka.protocol.metadata.find_coordinator import FindCoordinatorResponse

    from tests.support.fake_broker import FakeBroker

    async def scenario() -> None:
        other = await FakeBroker().start()  # broker 2, not in any Metadata response
        node2_port = free_port()

        async def coordinator(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
            if header.api_key != 10:
                return list_groups_v0_body()
            resp = FindCoordinatorResponse(version=4, throttle_time_ms=0, coordinators=[
                FindCoordinatorResponse.Coordinator(key="g1", node_id=2, host="127.0.0.1",
                                                    port=other.port, error_code=0, error_message=None),
                FindCoordinatorResponse.Coordinator(key="g2", node_id=-1, host="", port=-1,
                                                    error_code=15, error_message="not available")])
            return bytes(resp.encode(version=4))

        async with running(coordinator, node_ports={1: free_port(), 2: node2_port}) as h:
            reader, writer = await h.connect()
            # FindCoordinator v4: key_type 0, coordinator_keys ["g1", "g2"], no tagged fields
            body = b"\x00" + b"\x03" + b"\x03g1" + b"\x03g2" + b"\x00"
            writer.write(request_frame(10, 4, 1, body, flexible=True))
            response = await read_frame(reader)
            msg = FindCoordinatorResponse.decode(response[9:], version=4)
            assert [(c.node_id, c.host, c.port) for c in msg.coordinators] == [
                (2, "127.0.0.1", node2_port), (-1, "", -1)]
            r2, w2 = await h.connect(node2_port)
            w2.write(list_groups(9))
            assert correlation_id(await read_frame(r2)) == 9
            assert [c.frames for c in other.conns] == [[list_groups(9)]]
            writer.close()
            w2.close()
        await other.stop()
    run(scenario())


def test_a_broker_first_named_during_the_drain_does_not_hold_the_shutdown_up() -> None:
    # The answer to an in-flight FindCoordinator names broker 2 after the shutdown has begun.
    # The listener it used to get was never closed, and the shutdown waited on it for ever
    # (CI: a test's teardown hung to pytest's timeout).
    from kafka.protocol.metadata.find_coordinator import FindCoordinatorResponse

    async def scenario() -> None:
        release = asyncio.Event()
        broker_port: list[int] = []

        async def coordinator(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
            await release.wait()
            resp = FindCoordinatorResponse(version=4, throttle_time_ms=0, coordinators=[
                FindCoordinatorResponse.Coordinator(key="g1", node_id=2, host="127.0.0.1",
                                                    port=broker_port[0], error_code=0, error_message=None)])
            return bytes(resp.encode(version=4))

        node2_port = free_port()
        async with running(coordinator, node_ports={1: free_port(), 2: node2_port}) as h:
            broker_port.append(h.broker.port)
            reader, writer = await h.connect()
            body = b"\x00" + b"\x02" + b"\x03g1" + b"\x00"  # FindCoordinator v4, key "g1"
            writer.write(request_frame(10, 4, 1, body, flexible=True))
            await h.wait_for(lambda: any(c.frames for c in h.broker.client_conns()))
            shutdown = asyncio.create_task(h.proxy.shutdown())
            await asyncio.sleep(0.2)
            assert not shutdown.done()  # draining: the answer is awaited
            release.set()
            response = await read_frame(reader)
            msg = FindCoordinatorResponse.decode(response[9:], version=4)
            assert [(c.node_id, c.port) for c in msg.coordinators] == [(2, node2_port)]
            writer.close()
            async with asyncio.timeout(10):
                await shutdown
            with pytest.raises(ConnectionRefusedError):
                await h.connect(node2_port)  # no listener outlives the shutdown
    run(scenario())


def test_a_proxy_protocol_header_must_arrive_in_time(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with running(proxy_protocol=True, proxy_protocol_timeout_seconds=0.3) as h:
            slow_r, slow_w = await h.connect()
            slow_w.write(b"PROXY TCP4 10.1.2.3 ")  # half a header, then nothing
            prompt_r, prompt_w = await h.connect()
            prompt_w.write(b"PROXY TCP4 10.1.2.4 127.0.0.1 5555 9092\r\n")
            assert await is_closed(slow_r, timeout=10)
            assert h.errors("proxy_protocol_timeout") == 1
            await asyncio.sleep(0.5)  # well past the deadline: the prompt one is not cut off
            prompt_w.write(list_groups(1))
            assert correlation_id(await read_frame(prompt_r)) == 1
            prompt_w.close()
    with caplog.at_level("WARNING", logger="kafka_quota_proxy"):
        run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "proxy_protocol_timeout: no complete PROXY protocol header within 0.3s" in warnings[0]


def test_requests_pipelined_behind_a_plain_authentication_wait_for_its_outcome(tmp_path: Path) -> None:
    """PLAIN is checked on a worker thread. A client that writes its first request together
    with SaslAuthenticate has that request read after the outcome, as the authenticated user,
    not refused as a request before authentication."""
    users = tmp_path / "users.yaml"
    store = CredentialStore()
    store.add("alice", "alice-Secret-1", ["PLAIN"])
    save_credentials(store, users)

    def frame(msg: Any, correlation: int) -> bytes:
        msg.with_header(correlation_id=correlation, client_id="c")
        return bytes(msg.encode(version=1, header=True, framed=True))

    async def scenario() -> None:
        async with running(sasl={"mode": "terminate", "credentials_file": str(users)}) as h:
            reader, writer = await h.connect()
            writer.write(frame(SaslHandshakeRequest(mechanism="PLAIN"), 1))
            assert correlation_id(await read_frame(reader)) == 1
            token = b"\x00alice\x00alice-Secret-1"
            writer.write(frame(SaslAuthenticateRequest(auth_bytes=token), 2) + list_groups(3))
            auth, groups = await read_frame(reader), await read_frame(reader)
            assert correlation_id(auth) == 2
            assert struct.unpack_from(">h", auth, 8)[0] == 0  # error_code NONE
            assert correlation_id(groups) == 3 and groups[8:] == list_groups_v0_body()
            (conn,) = h.broker.client_conns()
            assert conn.frames == [list_groups(3)]
            (client,) = h.proxy.connections
            assert client.info.principal == "alice"
            writer.close()
    run(scenario())


def test_a_plain_check_that_fails_closes_its_connection_not_holds_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A PLAIN password is checked on a worker thread. Were the check to raise (a bug), the
    answer never came and the connection stayed paused for authentication, never idle, for ever.
    It is closed with an error line instead, and the next client authenticates as usual."""
    from kafka_quota_proxy.proxy.stages import sasl_terminate

    users = tmp_path / "users.yaml"
    store = CredentialStore()
    store.add("alice", "alice-Secret-1", ["PLAIN"])
    save_credentials(store, users)
    real = sasl_terminate._attempt
    broken = [True]

    def attempt(server: Any, token: bytes) -> Any:
        if broken[0]:
            raise RuntimeError("a bug in the check")
        return real(server, token)
    monkeypatch.setattr(sasl_terminate, "_attempt", attempt)

    def frame(msg: Any, correlation: int) -> bytes:
        msg.with_header(correlation_id=correlation, client_id="c")
        return bytes(msg.encode(version=1, header=True, framed=True))

    async def authenticate(h: Harness) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await h.connect()
        writer.write(frame(SaslHandshakeRequest(mechanism="PLAIN"), 1))
        assert correlation_id(await read_frame(reader)) == 1
        writer.write(frame(SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00alice-Secret-1"), 2))
        return reader, writer

    async def scenario() -> None:
        async with running(sasl={"mode": "terminate", "credentials_file": str(users)}) as h:
            reader, writer = await authenticate(h)
            assert await is_closed(reader)
            writer.close()
            broken[0] = False
            reader, writer = await authenticate(h)
            auth = await read_frame(reader)
            assert correlation_id(auth) == 2 and struct.unpack_from(">h", auth, 8)[0] == 0
            writer.close()
    with caplog.at_level(logging.ERROR, logger="kafka_quota_proxy.connection"):
        run(scenario())
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "RuntimeError('a bug in the check'), waiting (authenticating)" in line


def test_a_task_that_swallows_a_cancel_does_not_hold_the_shutdown_up(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # A library may drop a cancel (Python 3.11's asyncio.wait_for did, inside redis-py): the
    # shutdown cancels again, and a task that outlives every cancel is named and left.
    from kafka_quota_proxy.proxy import server as server_module

    monkeypatch.setattr(server_module, "CANCEL_WAIT_SECONDS", 0.05)
    ended: list[str] = []
    deaf = [True]

    async def swallows_once() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # dropped
        try:
            await asyncio.sleep(3600)
        finally:
            ended.append("once")

    async def swallows_all() -> None:
        while deaf[0]:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass

    async def scenario() -> None:
        async with running() as h:
            h.proxy.spawn(swallows_once())
            h.proxy.spawn(swallows_all())
            await asyncio.sleep(0)
            loop = asyncio.get_running_loop()
            started = loop.time()
            async with asyncio.timeout(5):
                await h.proxy.shutdown()
            assert loop.time() - started < 2  # 5 rounds of 0.05 s
            assert ended == ["once"]
        (left,) = [t for t in asyncio.all_tasks() if t.get_name().endswith("swallows_all")]
        deaf[0] = False
        left.cancel()
        await asyncio.wait({left}, timeout=5)
        assert left.done()

    with caplog.at_level("WARNING", logger="kafka_quota_proxy"):
        run(scenario())
    assert [r.getMessage() for r in caplog.records if "did not end" in r.getMessage()] == [
        "shutting down: task test_a_task_that_swallows_a_cancel_does_not_hold_the_shutdown_up."
        "<locals>.swallows_all did not end when cancelled; leaving it"]
