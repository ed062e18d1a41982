"""A client leaving while its requests or their answers are on the way, with TLS on the client's
side, on the broker's side, or on neither; each on asyncio's loop and on uvloop (the proxy's
own), whose TLS transports differ. Whatever the case: no hang, no error in the log, no
descriptor left open, and every request the proxy read reaches the broker.

TLS has no half-close in asyncio or uvloop: a transport that receives close_notify closes, and
asyncio's aborts if application data follows the close_notify it sent. So over TLS the proxy
cannot end its side to the broker and read on, as it does over TCP (upstream.py, `linger`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import struct
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from devkit.processes import free_port
from kafka_quota_proxy.config import merge
from kafka_quota_proxy.config.settings import parse_values
from kafka_quota_proxy.protocol.framing import FrameDecoder
from kafka_quota_proxy.protocol.headers import RequestHeader, frame_response, parse_request_header
from tests.proxy.conftest import LOOPS, Harness, list_groups, produce_acks0_v3, run_on, serving
from tests.support.certs import Pki
from tests.support.fake_broker import NODE_ID, BrokerConn, FakeBroker, cluster_answer, list_groups_v0_body

REQUESTS = 300
PRODUCE_V3_EMPTY = struct.pack(">ii", 0, 0)  # responses [], throttle_time_ms 0


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def no_errors(caplog: pytest.LogCaptureFixture) -> Any:
    """Nothing at ERROR or above, and no traceback, from the proxy or the event loop."""
    caplog.set_level(logging.WARNING)
    yield
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


def broker_context(pki: Pki) -> ssl.SSLContext:
    files = pki.server("broker")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(files.cert, files.key)
    return ctx


def client_context(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.ca_file))


async def answers_acks0(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
    """As Tansu: every acks=0 Produce answered, a little later."""
    await asyncio.sleep(0.002)
    return PRODUCE_V3_EMPTY


async def never_answers_acks0(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
    return None  # as Kafka


class AnswersAfterCloseNotify:
    """A TLS broker on threads that reads requests in turn and answers every acks=0 Produce (as
    Tansu does), stopping at the first answer it cannot write; told by close_notify that the
    proxy will send no more, it still answers what it has read, then closes. TLS 1.3 allows
    that; asyncio's transports do not (a FakeBroker over TLS closes at close_notify)."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self.ctx = ctx
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.produced = 0
        self.ended = threading.Event()
        self.threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._connection, args=(raw,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _connection(self, raw: socket.socket) -> None:
        decoder = FrameDecoder()
        produce = False
        try:
            tls = self.ctx.wrap_socket(raw, server_side=True)
            while chunk := tls.recv(65536):
                for frame in decoder.feed(chunk):
                    header = parse_request_header(frame)
                    assert header.spec is not None
                    body = cluster_answer(header, self.port, [])
                    if header.api_key == 0:
                        produce = True
                        self.produced += 1
                        threading.Event().wait(0.002)
                        body = PRODUCE_V3_EMPTY
                    if body is not None:
                        version = header.spec.response_header_version(header.api_version)
                        tls.sendall(frame_response(header.correlation_id, version, body))
            tls.unwrap()
        except (OSError, ValueError):
            pass  # an answer that could not be written: stop, as Tansu does
        finally:
            raw.close()
            if produce:
                self.ended.set()

    def stop(self) -> None:
        self.listener.close()
        for thread in self.threads:
            thread.join(5)


@asynccontextmanager
async def proxy_for(broker_port: int, pki: Pki, client_tls: bool, broker_tls: bool,
                    broker: FakeBroker) -> AsyncIterator[Harness]:
    values: dict[str, Any] = {"upstream": [f"127.0.0.1:{broker_port}"], "listen": f"127.0.0.1:{free_port()}",
                              "node_ports": {NODE_ID: free_port()}}
    if client_tls:
        files = pki.server("listener")
        values["tls"] = {"cert_file": str(files.cert), "key_file": str(files.key)}
    if broker_tls:
        values["upstream_tls"] = {"ca_file": str(pki.ca_file)}
    async with serving(merge(parse_values(values)), broker) as h:
        # Its listener for the broker opens once it has learnt the broker: before counting descriptors.
        await h.wait_for(lambda: NODE_ID in h.proxy.cluster.nodes, timeout=20)
        await asyncio.sleep(0.2)
        yield h


async def send_and_leave(h: Harness, frames: list[bytes], tls: ssl.SSLContext | None) -> None:
    """Send `frames` and close at once (with TLS: close_notify, then the socket)."""
    _, writer = await asyncio.open_connection("127.0.0.1", h.settings.listen.port, ssl=tls,
                                              server_hostname="127.0.0.1" if tls else None)
    writer.write(b"".join(frames))
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def settled(h: Harness, before: int) -> None:
    """Every connection of the proxy gone and every descriptor it opened closed again."""
    await h.wait_for(lambda: not h.proxy.connections, timeout=40)
    await h.wait_for(lambda: open_descriptors() <= before, timeout=40)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_tls_client_leaving_at_once_has_its_acks0_records_reach_the_broker(loop: str, pki: Pki) -> None:
    """Its close_notify comes after the requests, which the proxy reads first; the broker side is
    plain TCP, half-closed as usual."""
    async def scenario() -> None:
        broker = await FakeBroker(answers_acks0).start()
        async with proxy_for(broker.port, pki, True, False, broker) as h:
            before = open_descriptors()
            frames = [produce_acks0_v3(i) for i in range(1, REQUESTS + 1)]
            await send_and_leave(h, frames, client_context(pki))
            await h.wait_for(lambda: len(broker.client_conns()) == 1
                             and len(broker.client_conns()[0].frames) == REQUESTS, timeout=20)
            assert broker.client_conns()[0].frames == frames
            await settled(h, before)
        await broker.stop()
    run_on(loop, scenario())


@pytest.mark.parametrize("client_tls", [False, True], ids=["plain-client", "tls-client"])
@pytest.mark.parametrize("loop", LOOPS)
def test_acks0_records_reach_a_tls_broker_that_closes_at_close_notify(loop: str, client_tls: bool,
                                                                       pki: Pki) -> None:
    """A broker that answers acks=0 and closes when told the proxy has finished (asyncio's
    transports do): before, the proxy's close_notify went out right behind the requests, the
    broker closed, and it handled 1 to 4 of the 300."""
    async def scenario() -> None:
        broker = await FakeBroker(answers_acks0).start(ssl=broker_context(pki))
        async with proxy_for(broker.port, pki, client_tls, True, broker) as h:
            before = open_descriptors()
            frames = [produce_acks0_v3(i) for i in range(1, REQUESTS + 1)]
            await send_and_leave(h, frames, client_context(pki) if client_tls else None)
            await h.wait_for(lambda: len(broker.client_conns()) == 1
                             and broker.client_conns()[0].ended_at is not None, timeout=40)
            assert broker.client_conns()[0].frames == frames
            await settled(h, before)
        await broker.stop()
    run_on(loop, scenario())


@pytest.mark.parametrize("loop", LOOPS)
def test_acks0_records_reach_a_tls_broker_that_answers_after_close_notify(loop: str, pki: Pki) -> None:
    """Before: on uvloop all 300, on asyncio's loop 4 of 300 (asyncio's TLS shutdown aborts the
    connection when an answer follows its close_notify, and the broker's next write fails)."""
    async def scenario() -> None:
        broker = AnswersAfterCloseNotify(broker_context(pki))
        cluster = FakeBroker()  # not connected to: the proxy's own requests go to `broker`
        try:
            async with proxy_for(broker.port, pki, False, True, cluster) as h:
                before = open_descriptors()
                await send_and_leave(h, [produce_acks0_v3(i) for i in range(1, REQUESTS + 1)], None)
                await asyncio.get_running_loop().run_in_executor(None, broker.ended.wait, 40)
                assert broker.produced == REQUESTS
                await settled(h, before)
        finally:
            broker.stop()
    run_on(loop, scenario())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_tls_broker_that_never_answers_acks0_is_let_go_within_seconds(loop: str, pki: Pki) -> None:
    """Kafka answers no acks=0 Produce: the proxy cannot count on an answer to tell it the broker
    has read the last one, and lets the connection go once the broker has been quiet a while."""
    async def scenario() -> None:
        broker = await FakeBroker(never_answers_acks0).start(ssl=broker_context(pki))
        async with proxy_for(broker.port, pki, False, True, broker) as h:
            before = open_descriptors()
            frames = [produce_acks0_v3(i) for i in range(1, REQUESTS + 1)]
            left = asyncio.get_running_loop().time()
            await send_and_leave(h, frames, None)
            await h.wait_for(lambda: len(broker.client_conns()) == 1
                             and broker.client_conns()[0].ended_at is not None, timeout=40)
            conn = broker.client_conns()[0]
            assert conn.frames == frames
            assert conn.ended_at is not None and conn.ended_at - left < 5.0
            await settled(h, before)
        await broker.stop()
    run_on(loop, scenario())


class TlsHalfCloser:
    """A TLS client on a raw socket (ssl.MemoryBIO) that can send close_notify and go on reading,
    which asyncio's own TLS streams cannot."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext) -> None:
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname="127.0.0.1")
        self.close_notify_received = False

    async def _flush(self) -> None:
        data = self.outgoing.read()
        if data:
            await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def handshake(self) -> None:
        while True:
            try:
                self.tls.do_handshake()
                await self._flush()
                return
            except ssl.SSLWantReadError:
                await self._flush()
                self.incoming.write(await asyncio.get_running_loop().sock_recv(self.sock, 65536))

    async def send(self, data: bytes) -> None:
        self.tls.write(data)
        await self._flush()

    async def close_notify(self) -> None:
        try:
            self.tls.unwrap()
        except ssl.SSLWantReadError:
            pass  # sent; the peer's is still to come
        await self._flush()

    async def read_to_end(self) -> bytes:
        """Application data until the connection ends (close_notify and/or EOF)."""
        got = bytearray()
        while True:
            data = await asyncio.get_running_loop().sock_recv(self.sock, 65536)
            if not data:
                return bytes(got)
            self.incoming.write(data)
            try:
                while chunk := self.tls.read(65536):
                    got += chunk
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLZeroReturnError:
                self.close_notify_received = True


@pytest.mark.parametrize("client_tls", [False, True], ids=["plain-FIN", "tls-close_notify"])
@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_that_half_closes_is_answered_no_more(loop: str, client_tls: bool,
                                                                   pki: Pki) -> None:
    """A client that ends its side (TCP FIN, or TLS close_notify) with answers still due and
    keeps reading: the proxy closes the connection, as on any end of stream. The requests it
    read reach the broker; their answers are dropped; the client reads the end at once."""
    async def slow(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes:
        await asyncio.sleep(0.3)
        return list_groups_v0_body()

    async def scenario() -> None:
        broker = await FakeBroker(slow).start()
        async with proxy_for(broker.port, pki, client_tls, False, broker) as h:
            before = open_descriptors()
            loop_ = asyncio.get_running_loop()
            sock = socket.socket()
            sock.setblocking(False)
            await loop_.sock_connect(sock, ("127.0.0.1", h.settings.listen.port))
            requests = b"".join(list_groups(i) for i in range(1, 4))
            try:
                if client_tls:
                    client = TlsHalfCloser(sock, client_context(pki))
                    await client.handshake()
                    await client.send(requests)
                    await client.close_notify()
                    answered = await asyncio.wait_for(client.read_to_end(), 5)
                    assert client.close_notify_received  # the proxy's own, then its FIN
                else:
                    await loop_.sock_sendall(sock, requests)
                    sock.shutdown(socket.SHUT_WR)
                    answered = await asyncio.wait_for(loop_.sock_recv(sock, 65536), 5)
            finally:
                sock.close()
            assert answered == b""
            await h.wait_for(lambda: len(broker.client_conns()) == 1
                             and len(broker.client_conns()[0].frames) == 3, timeout=10)
            await settled(h, before)
        await broker.stop()
    run_on(loop, scenario())

