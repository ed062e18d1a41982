"""The request context: what every stage knows about one request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.headers import RequestHeader
from protocol.pieces import Pieces

ANONYMOUS = "ANONYMOUS"  # Kafka's principal for an unauthenticated connection


@dataclass(slots=True)
class ConnectionInfo:
    """Who is on the other end of a client connection."""

    peer: str  # "host:port" of the client
    listener: str  # "bootstrap" or "node-<id>"
    principal: str = ANONYMOUS
    upstream: str = ""  # the broker address this connection forwards to, once connected

    def describe(self) -> str:
        return f"{self.peer} ({self.principal}, {self.listener})"


@dataclass(slots=True)
class RequestContext:
    """One request on its way through the stages."""

    header: RequestHeader
    frame: memoryview  # the whole request frame, size prefix included
    conn: ConnectionInfo
    expects_response: bool = True
    acks: int = 1  # Produce only: the request's acks
    received_at: float = 0.0  # perf_counter() when the proxy read the request
    # perf_counter() when forwarded: uvloop's loop.time() only ticks in whole milliseconds,
    # too coarse for a proxy hop.
    sent_at: float = 0.0
    answered_at: float = 0.0  # perf_counter() when the broker's response arrived
    forward: Pieces | None = None  # a rewritten request to send instead of `frame`
    quota: Any = None  # the quota managers charged for this request, if any
    throttle_ms: int = 0  # the proxy's throttle for this request; the client is muted this long
    fetch_max_wait_ms: int = 0

    @property
    def api_key(self) -> int:
        return self.header.api_key

    @property
    def api_version(self) -> int:
        return self.header.api_version
