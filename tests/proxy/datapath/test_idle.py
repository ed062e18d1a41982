"""connections_max_idle_ms: the sweep's rule with a fake clock, then the proxy closing idle
connections (and only those) in front of a scripted broker."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Hashable
from dataclasses import dataclass

import pytest

from kafka_quota_proxy.protocol.headers import RequestHeader
from kafka_quota_proxy.proxy.datapath.idle import MAX_SWEEP_SECONDS, IdleSweep
from tests.proxy.conftest import Harness, is_closed, list_groups, read_frame, running
from tests.support.fake_broker import BrokerConn, list_groups_v0_body

# -- the sweep ----------------------------------------------------------------------------------


@dataclass(eq=False)
class Conn:
    ios: int = 0
    waiting: bool = False

    def io_mark(self) -> Hashable:
        return self.ios

    def owed(self) -> bool:
        return self.waiting


def test_sweeps_every_tenth_of_the_timeout_up_to_five_seconds() -> None:
    assert IdleSweep(2.0).interval == 0.2
    assert IdleSweep(600.0).interval == MAX_SWEEP_SECONDS == 5.0


def test_a_connection_is_idle_from_the_sweep_that_first_sees_it_quiet() -> None:
    sweep, conn = IdleSweep(600.0), Conn()
    assert sweep.expired([conn], 1000.0) == []  # first seen: counted from here
    assert sweep.expired([conn], 1599.999) == []
    assert sweep.expired([conn], 1600.0) == [conn]


def test_any_read_or_write_between_sweeps_starts_the_count_again() -> None:
    sweep, conn = IdleSweep(600.0), Conn()
    sweep.expired([conn], 0.0)
    conn.ios += 1  # a byte, some time before 595
    assert sweep.expired([conn], 595.0) == []
    assert sweep.expired([conn], 1194.0) == []
    assert sweep.expired([conn], 1195.0) == [conn]


def test_a_connection_owed_something_is_never_idle_and_counts_from_when_it_no_longer_is() -> None:
    sweep, conn = IdleSweep(600.0), Conn(waiting=True)
    for t in range(0, 3600, 5):
        assert sweep.expired([conn], float(t)) == []
    conn.waiting, conn.ios = False, 1  # the answer came at last, and was written
    assert sweep.expired([conn], 3600.0) == []
    assert sweep.expired([conn], 4199.0) == []
    assert sweep.expired([conn], 4200.0) == [conn]


def test_the_sweep_forgets_connections_that_have_gone() -> None:
    sweep, a, b = IdleSweep(1.0), Conn(), Conn()
    sweep.expired([a, b], 0.0)
    sweep.expired([b], 0.1)
    assert sweep.expired([a, b], 1.0) == [b]  # a was forgotten: counted again from 1.0
    assert sweep.expired([a, b], 2.0) == [a]


def test_each_connection_is_judged_on_its_own() -> None:
    sweep = IdleSweep(10.0)
    quiet, busy, waiting = Conn(), Conn(), Conn(waiting=True)
    for t in range(0, 11):
        busy.ios += 1
        got = sweep.expired([quiet, busy, waiting], float(t))
    assert got == [quiet]


# -- the proxy ----------------------------------------------------------------------------------

IDLE_MS = 300  # sweeps every 30 ms


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def idle_closed(h: Harness) -> float:
    return h.proxy.metrics.registry.get_sample_value("kafka_quota_proxy_idle_connections_closed_total") or 0.0


async def connected(h: Harness) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await h.connect()
    writer.write(list_groups(1))
    assert await read_frame(reader)  # the broker connection is up
    return reader, writer


def test_a_connection_with_nothing_read_or_written_is_closed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "kafka_quota_proxy.connection")

    async def scenario() -> None:
        async with running(connections_max_idle_ms=IDLE_MS) as h:
            loop = asyncio.get_running_loop()
            reader, writer = await connected(h)
            quiet_since = loop.time()
            assert await is_closed(reader, timeout=5)
            waited = loop.time() - quiet_since
            assert 0.3 <= waited < 2.0, waited  # at most two sweeps late, with room for a slow machine
            await h.wait_for(lambda: not h.proxy.connections)
            assert idle_closed(h) == 1
            writer.close()
    run(scenario())
    assert "no byte read or written for 300 ms (connections_max_idle_ms)" in caplog.text
    assert all(r.levelno == logging.DEBUG for r in caplog.records if "connections_max_idle_ms" in r.message)


def test_a_connection_in_use_is_left_open() -> None:
    async def scenario() -> None:
        async with running(connections_max_idle_ms=IDLE_MS) as h:
            reader, writer = await connected(h)
            for i in range(2, 12):  # a request every 100 ms for a second: three timeouts' worth
                await asyncio.sleep(0.1)
                writer.write(list_groups(i))
                assert await read_frame(reader)
            assert idle_closed(h) == 0 and len(h.proxy.connections) == 1
            writer.close()
    run(scenario())


def test_a_request_waiting_at_a_slow_broker_keeps_its_connection_open() -> None:
    """Kafka counts only socket I/O; the proxy does not cut a client off because the broker takes
    longer than the idle timeout to answer (a long-poll Fetch, a broker under load)."""
    async def slow(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes:
        await asyncio.sleep(1.2)  # four idle timeouts
        return list_groups_v0_body()

    async def scenario() -> None:
        async with running(slow, connections_max_idle_ms=IDLE_MS) as h:
            reader, writer = await h.connect()
            writer.write(list_groups(1))
            assert await read_frame(reader)  # answered after 1.2 s on the same connection
            assert idle_closed(h) == 0
            assert await is_closed(reader, timeout=5)  # and idle from then on
            assert idle_closed(h) == 1
            writer.close()
    run(scenario())


def test_a_frame_trickled_a_byte_at_a_time_is_not_idle_until_the_bytes_stop() -> None:
    """As on Kafka, which has no deadline for a frame: each byte is I/O. What such a connection
    may hold meanwhile is bounded (docs/reliability.md, "The bounds")."""
    async def scenario() -> None:
        async with running(connections_max_idle_ms=IDLE_MS) as h:
            reader, writer = await connected(h)
            frame = list_groups(2)
            for i in range(12):  # twelve bytes of it, one every 100 ms: four timeouts' worth
                writer.write(frame[i:i + 1])
                await asyncio.sleep(0.1)
            assert idle_closed(h) == 0 and len(h.proxy.connections) == 1
            assert await is_closed(reader, timeout=5)
            assert idle_closed(h) == 1
            writer.close()
    run(scenario())


def test_a_client_that_stops_reading_is_closed_though_its_answers_are_unsent() -> None:
    """Nothing moves: its responses fill the socket and the proxy's write buffer, and reading
    from the broker and from it stops. Kafka closes such a connection as idle too; the proxy
    drops what it could not send (abort), which would otherwise hold the close up for ever."""
    big = b"\x00\x00\x00\x00\x00\x00" + bytes(256 * 1024)  # a ListGroups body with a long tail

    async def large(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes:
        return big

    async def scenario() -> None:
        async with running(large, connections_max_idle_ms=IDLE_MS) as h:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", h.settings.listen.port))
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(b"".join(list_groups(i) for i in range(1, 101)))  # 25 MiB of answers
            (proxied,) = h.proxy.connections
            await h.wait_for(lambda: proxied.transport is not None
                             and proxied.transport.get_write_buffer_size() > 0)
            await h.wait_for(lambda: idle_closed(h) == 1, timeout=10)
            await h.wait_for(lambda: not h.proxy.connections)
            writer.close()
    run(scenario())


def test_no_idle_timeout_when_disabled() -> None:
    async def scenario() -> None:
        for off in (-1, None):
            async with running(connections_max_idle_ms=off) as h:
                reader, writer = await connected(h)
                with pytest.raises(TimeoutError):  # nothing comes, not even the end
                    await asyncio.wait_for(reader.read(1), 0.6)
                assert idle_closed(h) == 0
                writer.close()
                await h.wait_for(lambda: not h.proxy.connections)
    run(scenario())

