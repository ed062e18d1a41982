"""Backpressure made explicit: a transport's reading is paused while any named reason holds."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol


class Pause(StrEnum):
    """Every reason a connection's reading is paused, in one place. Set and cleared by:"""

    CONNECTING = "connecting"  # client.py: its broker connection is being made
    INFLIGHT = "inflight"  # core.py: as many requests at the broker as it may read ahead
    THROTTLE = "throttle"  # core.py: muted for a throttle (KIP-219), as a broker mutes
    PACE = "pace"  # core.py: a paced quota's wait for this client's next bytes or turn
    HELD_RESPONSE = "held-response"  # core.py: a response stage holds a response (`ctx.hold`)
    HELD_ANSWER = "held-answer"  # core.py: an answer of the proxy's held back (a failed login)
    CLIENT_BUSY = "client-busy"  # client.py: the client is not reading its responses
    SHUTDOWN = "shutdown"  # core.py: the proxy is draining its connections
    AUTHENTICATING = "authenticating"  # core.py: a SASL exchange is being decided
    CLOSING = "closing"  # core.py: the connection is closing after its last answer
    SPLICE = "splice"  # streaming.py: a response is being spliced to the client (broker side)
    UPSTREAM_BUSY = "upstream-busy"  # upstream.py: the broker is not reading the requests


# What keeps a connection busy though it waits (`ConnectionCore.held_by_proxy`): held by the
# proxy, not by its client.
HELD_BY_PROXY = frozenset((Pause.THROTTLE, Pause.AUTHENTICATING, Pause.HELD_RESPONSE))


class Reader(Protocol):
    """What a gate pauses: an asyncio transport, or the core's emitted `Reading` (core.py)."""

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def is_closing(self) -> bool: ...


class ReadGate:
    """Pauses a transport's reading while any reason to pause holds."""

    __slots__ = ("transport", "reasons")

    def __init__(self, transport: Reader) -> None:
        self.transport = transport
        self.reasons: set[Pause] = set()

    def pause(self, reason: Pause) -> None:
        if not self.reasons and not self.transport.is_closing():
            self.transport.pause_reading()
        self.reasons.add(reason)

    def resume(self, reason: Pause) -> None:
        if reason in self.reasons:
            self.reasons.discard(reason)
            if not self.reasons and not self.transport.is_closing():
                self.transport.resume_reading()

    def open(self) -> None:
        """Read again, whatever held it: for a connection that only reads to drop, then closes."""
        if self.reasons:
            self.reasons.clear()
            if not self.transport.is_closing():
                self.transport.resume_reading()
