"""Closing client connections that have been idle for `connections_max_idle_ms`, as Kafka's
broker does (its Selector closes a connection with no I/O for `connections.max.idle.ms`).

One sweep per proxy looks at every open connection now and then; nothing is done per read or
write but a connection adding one to a counter. The sweep compares what it sees (`io_mark`) with
what it saw last time: changed, the connection was active since; unchanged for the timeout, it
is idle. Time is passed in, so the rule is tested with exact numbers.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Protocol, TypeVar

# The longest time between sweeps: a connection is closed at most twice this late.
MAX_SWEEP_SECONDS = 5.0


class Watched(Protocol):
    """A connection as the sweep sees it."""

    def io_mark(self) -> Hashable:
        """Anything that changes whenever a byte is read from or written to the client."""
        ...

    def owed(self) -> bool:
        """Whether the proxy or the broker owes the client something (it is then not idle)."""
        ...


W = TypeVar("W", bound=Watched)


class IdleSweep:
    """Which connections have had no I/O for `max_idle` seconds. A connection is never closed
    sooner than that after its last byte, and at most two sweep intervals later; one that is
    owed something (a request at the broker, say) is never idle."""

    def __init__(self, max_idle: float) -> None:
        self.max_idle = max_idle
        self.interval = min(max_idle / 10, MAX_SWEEP_SECONDS)
        self._seen: dict[Watched, tuple[Hashable, float]] = {}  # the mark, and since when

    def expired(self, conns: Iterable[W], now: float) -> list[W]:
        """The connections idle for `max_idle` at `now`; forgets those no longer given."""
        seen: dict[Watched, tuple[Hashable, float]] = {}
        last = self._seen
        out: list[W] = []
        for conn in conns:
            mark = conn.io_mark()
            before = last.get(conn)
            if before is None or before[0] != mark or conn.owed():
                seen[conn] = (mark, now)  # active since the last sweep, at most: counted from now
            elif now - before[1] >= self.max_idle:
                out.append(conn)
            else:
                seen[conn] = before
        self._seen = seen
        return out
