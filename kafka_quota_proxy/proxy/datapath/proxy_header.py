"""A TLS listener behind a load balancer that speaks the PROXY protocol: the header in the clear,
then TLS; the connection is then handed to a ClientConnection."""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import cast

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.proxy_protocol import (
    V2_HEADER_LENGTH,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderParser,
    ProxyHeaderTimeout,
)
from kafka_quota_proxy.proxy.datapath.client import ClientConnection, header_deadline
from kafka_quota_proxy.proxy.datapath.host import ConnectionHost

log = logging.getLogger("kafka_quota_proxy.connection")



# The shortest PROXY header, "PROXY UNKNOWN\r\n": reading this much never reads past a header.
_SHORTEST_PROXY_HEADER = 15


class ProxyHeaderThenTls(asyncio.BufferedProtocol):
    """A TLS listener behind a load balancer that speaks the PROXY protocol.

    The balancer sends the PROXY header first, in the clear, and then the client's TLS
    handshake (the specification's order, and what HAProxy and cloud load balancers send). So
    this protocol reads exactly the header's bytes, never more, leaving the handshake in the
    socket; then it starts TLS on the same connection and hands it to a ClientConnection.
    """

    def __init__(self, proxy: ConnectionHost, conn: ClientConnection) -> None:
        self.proxy = proxy
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self.parser = ProxyHeaderParser()
        self._read = bytearray()  # the header bytes so far
        self._buffer = bytearray(_SHORTEST_PROXY_HEADER)
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.conn.info.set_address(str(peer[0]), int(peer[1]))
        self._timer = header_deadline(self.proxy, self._expired)

    def _expired(self) -> None:
        self._refuse(ProxyHeaderTimeout(self.proxy.settings.proxy_protocol_timeout_seconds))

    def _refuse(self, exc: ProtocolError) -> None:
        self.proxy.metrics.protocol_errors.labels(exc.kind).inc()
        log.warning("closing connection from %s: %s: %s", self.conn.info.describe(), exc.kind, exc)
        assert self.transport is not None
        self.transport.close()

    def _wanted(self) -> int:
        """How many more bytes to read: as many as the header still surely has, at least one."""
        read = self._read
        if read[:1] == V2_SIGNATURE[:1]:
            if len(read) < V2_HEADER_LENGTH:
                return V2_HEADER_LENGTH - len(read)
            return V2_HEADER_LENGTH + int.from_bytes(read[14:16], "big") - len(read)
        return 1  # version 1: byte by byte up to its CRLF

    def get_buffer(self, sizehint: int) -> bytearray:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        data = bytes(self._buffer[:nbytes])
        self._read += data
        try:
            header = self.parser.feed(data)
        except ProtocolError as exc:
            self._refuse(exc)
            return
        if header is None:
            self._buffer = bytearray(self._wanted())
            return
        if self._timer is not None:
            self._timer.cancel()
        assert self.transport is not None
        self.transport.pause_reading()
        self.proxy.spawn(self._start_tls(header))

    async def _start_tls(self, header: ProxyHeader) -> None:
        transport = self.transport
        assert transport is not None and self.proxy.server_ssl is not None
        try:
            tls = await self.proxy.loop.start_tls(transport, self.conn, self.proxy.server_ssl,
                                                  server_side=True)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError):
            transport.close()  # a failed handshake, as on a TLS listener without PROXY headers
            return
        if tls is None or tls.is_closing():
            transport.close()
            return
        self.conn.proxied = header
        self.conn.connection_made(tls)

    def eof_received(self) -> bool | None:
        return None  # closed before its header ended: nothing to serve

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
