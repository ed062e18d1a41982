"""A scripted broker on loopback for tests that need to see exactly what the proxy sends.

It records every byte each connection receives, answers ApiVersions and Metadata itself (so
the proxy's own cluster refresh works), and hands every other request to a handler.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from ssl import SSLContext

from kafka.protocol.metadata.api_versions import ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataResponse

from kafka_quota_proxy.protocol.framing import FrameDecoder
from kafka_quota_proxy.protocol.headers import (
    PROXY_CLIENT_ID,
    RequestHeader,
    frame_response,
    parse_request_header,
)

NODE_ID = 1
# (key, min, max) the fake broker claims; 71 is unknown to the proxy's codec.
API_KEYS = [(0, 0, 11), (1, 0, 17), (3, 0, 12), (10, 0, 6), (16, 0, 5), (18, 0, 4), (60, 0, 1),
            (71, 0, 0)]

@dataclass(frozen=True)
class Chunked:
    """A response body to write in parts: the frame is cut at `cuts` (offsets into the whole
    frame, size prefix included), with `pause` seconds between the parts."""

    body: bytes
    cuts: tuple[int, ...]
    pause: float = 0.0


# A handler gets the parsed header and the whole frame, and returns a response body (or a
# Chunked one), or None for no response. It may be async (to delay a response).
Handler = Callable[["BrokerConn", RequestHeader, bytes], Awaitable[bytes | Chunked | None]]


def list_groups_v0_body() -> bytes:
    return b"\x00\x00" + b"\x00\x00\x00\x00"  # error_code 0, groups []


async def default_handler(conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
    return list_groups_v0_body()


@dataclass
class BrokerConn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    received: bytearray = field(default_factory=bytearray)
    frames: list[bytes] = field(default_factory=list)
    reading: asyncio.Event = field(default_factory=asyncio.Event)
    ended_at: float | None = None  # loop time when the broker stopped serving this connection

    def close(self) -> None:
        self.writer.close()


class FakeBroker:
    def __init__(self, handler: Handler = default_handler) -> None:
        self.handler = handler
        self.port = 0
        self.conns: list[BrokerConn] = []
        self.metadata_topics: list[str] = []  # topics named in every Metadata response
        # Applied to the broker's own answers (ApiVersions, Metadata) on client connections, to
        # send a client a damaged one; the proxy's cluster refresh always gets them whole.
        self.damage: Callable[[RequestHeader, bytes], bytes] | None = None
        self._server: asyncio.Server | None = None

    async def start(self, port: int = 0, ssl: SSLContext | None = None) -> FakeBroker:
        """Listen on loopback (`port`, or any free one), speaking TLS with `ssl` if given."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port, ssl=ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for c in self.conns:
            c.close()

    def client_conns(self) -> list[BrokerConn]:
        """Connections that carried anything but the proxy's own cluster refresh."""
        return [c for c in self.conns if not c.frames or parse_request_header(
            memoryview(c.frames[0])).client_id != PROXY_CLIENT_ID]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = BrokerConn(reader, writer)
        conn.reading.set()
        self.conns.append(conn)
        decoder = FrameDecoder()
        try:
            while True:
                await conn.reading.wait()
                chunk = await reader.read(65536)
                if not chunk:
                    return
                conn.received += chunk
                for frame in decoder.feed(chunk):
                    data = bytes(frame)
                    conn.frames.append(data)
                    header = parse_request_header(frame)
                    body = await self._answer(conn, header, data)
                    if body is not None:
                        assert header.spec is not None
                        hv = header.spec.response_header_version(header.api_version)
                        if isinstance(body, Chunked):
                            whole = frame_response(header.correlation_id, hv, body.body)
                            starts = (0, *body.cuts)
                            for n, (a, b) in enumerate(zip(starts, (*body.cuts, len(whole)), strict=True)):
                                if n and body.pause:
                                    await asyncio.sleep(body.pause)
                                writer.write(whole[a:b])
                                await writer.drain()
                            continue
                        writer.write(frame_response(header.correlation_id, hv, body))
                        await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            conn.ended_at = asyncio.get_running_loop().time()
            writer.close()

    async def _answer(self, conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | Chunked | None:
        answer = cluster_answer(header, self.port, self.metadata_topics)
        if answer is not None:
            if self.damage is not None and header.client_id != PROXY_CLIENT_ID:
                return self.damage(header, answer)
            return answer
        return await self.handler(conn, header, frame)


def cluster_answer(header: RequestHeader, port: int, topics: list[str]) -> bytes | None:
    """The body of a broker's answer to ApiVersions or Metadata (itself the only node, on `port`,
    `topics` with no partitions); None for any other request."""
    v = header.api_version
    if header.api_key == 18:
        resp = ApiVersionsResponse(version=v, error_code=0, throttle_time_ms=0, api_keys=[
            ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, lo, hi in API_KEYS])
        return bytes(resp.encode(version=v))
    if header.api_key == 3:
        meta = MetadataResponse(version=v, throttle_time_ms=0, brokers=[
            MetadataResponse.MetadataResponseBroker(node_id=NODE_ID, host="127.0.0.1", port=port, rack=None)],
            cluster_id="fake", controller_id=NODE_ID, topics=[
                MetadataResponse.MetadataResponseTopic(
                    error_code=0, name=name, topic_id=uuid.UUID(int=0), is_internal=False, partitions=[])
                for name in topics])
        return bytes(meta.encode(version=v))
    return None
