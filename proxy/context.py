"""The request context: what every stage knows about one request."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.headers import RequestHeader

ANONYMOUS = "ANONYMOUS"  # Kafka's principal for an unauthenticated connection


@dataclass(slots=True)
class ConnectionInfo:
    """Who is on the other end of a client connection."""

    peer: str  # "host:port" of the client
    listener: str  # "bootstrap" or "node-<id>"
    principal: str = ANONYMOUS

    def describe(self) -> str:
        return f"{self.peer} ({self.principal}, {self.listener})"


@dataclass(slots=True)
class RequestContext:
    """One request on its way through the stages."""

    header: RequestHeader
    frame: memoryview  # the whole request frame, size prefix included
    conn: ConnectionInfo
    expects_response: bool = True
    # perf_counter() when forwarded: uvloop's loop.time() only ticks in whole milliseconds,
    # too coarse for a proxy hop.
    sent_at: float = 0.0

    @property
    def api_key(self) -> int:
        return self.header.api_key

    @property
    def api_version(self) -> int:
        return self.header.api_version
