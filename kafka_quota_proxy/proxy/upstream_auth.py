"""Authenticating the proxy itself to a broker (terminate mode's service credentials).

The exchange is SaslHandshake v1 then SaslAuthenticate rounds, done on a stream connection
before the connection carries any client request; the transport is then handed to the
forwarding protocol, so the hot path never sees authentication.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from kafka_quota_proxy.config.identity_settings import UpstreamSaslSettings
from kafka_quota_proxy.identity.sasl_client import SaslClient, SaslClientError
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.framing import FrameDecoder
from kafka_quota_proxy.protocol.headers import PROXY_CLIENT_ID, frame_request


class UpstreamAuthError(ProtocolError):
    """The broker refused the proxy's own SASL credentials."""

    kind = "upstream_auth"


async def _call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: Any, version: int,
                response_cls: Any, correlation_id: int) -> Any:
    writer.write(frame_request(request, version, correlation_id, PROXY_CLIENT_ID))
    try:
        frame = await read_frame(reader)
    except ConnectionError:
        raise UpstreamAuthError("the broker closed the connection during authentication") from None
    return response_cls.decode(frame[8:], version=version)  # v0/v1: response header v0


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """One whole response frame from a stream (the proxy's own requests, one at a time)."""
    decoder = FrameDecoder(2**31 - 1)
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            raise ConnectionError("connection closed before a full response")
        frames = decoder.feed(chunk)
        if frames:
            return bytes(frames[0])


async def authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       creds: UpstreamSaslSettings) -> None:
    """Raise UpstreamAuthError (without secrets) unless the broker accepts the credentials."""
    hs = await _call(reader, writer, SaslHandshakeRequest(mechanism=creds.mechanism), 1,
                     SaslHandshakeResponse, 0x7FFF0000)
    if hs.error_code:
        raise UpstreamAuthError(f"broker refused mechanism {creds.mechanism} (error {hs.error_code}; "
                                f"it offers {', '.join(hs.mechanisms or [])})")
    try:
        client = SaslClient(creds.mechanism, creds.username, creds.password)
        token: bytes | None = client.first()
        correlation_id = 0x7FFF0001
        while token is not None:
            resp = await _call(reader, writer, SaslAuthenticateRequest(auth_bytes=token), 1,
                               SaslAuthenticateResponse, correlation_id)
            correlation_id += 1
            if resp.error_code:
                raise UpstreamAuthError(f"broker rejected the proxy's credentials for "
                                        f"{creds.username!r}: {resp.error_message or resp.error_code}")
            token = client.step(bytes(resp.auth_bytes or b""))
    except (SaslClientError, ValueError) as exc:  # a forged server signature, bad settings
        raise UpstreamAuthError(f"authenticating to the broker as {creds.username!r}: {exc}") from None


async def open_upstream(host: str, port: int, ssl_ctx: ssl.SSLContext | None,
                        creds: UpstreamSaslSettings | None) -> tuple[asyncio.StreamReader,
                                                                     asyncio.StreamWriter]:
    """A connection to a broker, TLS and SASL done, ready for Kafka requests."""
    reader, writer = await asyncio.open_connection(host, port, ssl=ssl_ctx,
                                                   server_hostname=host if ssl_ctx else None)
    if creds is not None:
        try:
            await authenticate(reader, writer, creds)
        except BaseException:
            writer.close()
            raise
    return reader, writer
