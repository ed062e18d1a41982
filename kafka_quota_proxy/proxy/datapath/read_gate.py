"""Backpressure made explicit: a transport's reading is paused while any named reason holds."""

from __future__ import annotations

import asyncio


class ReadGate:
    """Pauses a transport's reading while any reason to pause holds."""

    __slots__ = ("transport", "reasons")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.reasons: set[str] = set()

    def pause(self, reason: str) -> None:
        if not self.reasons and not self.transport.is_closing():
            self.transport.pause_reading()
        self.reasons.add(reason)

    def resume(self, reason: str) -> None:
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
