"""A connection's throttle mute (KIP-219), as Kafka's broker keeps a channel's: the logic without
the timer. Pure: the connection passes its loop's time in and keeps the one timer itself."""

from __future__ import annotations


class Mute:
    """When a throttled connection may read again. Reading stops while a request charged over
    its quota on arrival waits for its response (`due`), and until the throttle each response
    over quota carries has run from the moment it went out (`until`), as a broker mutes the
    channel when it sends the response. Several throttles overlap: the latest end holds."""

    __slots__ = ("until", "due")

    def __init__(self) -> None:
        self.until = 0.0  # loop time the latest throttle ends
        self.due = 0  # requests charged over quota whose responses have not gone out yet

    def charged_over(self) -> None:
        """A forwarded request was charged over its quota on arrival: nothing more is read until
        its response has gone out and its throttle has run."""
        self.due += 1

    def answered(self) -> None:
        """The response of a request `charged_over` has gone out (its throttle starts: `start`)."""
        self.due -= 1

    def start(self, now: float, throttle_ms: int) -> float | None:
        """A throttle of `throttle_ms` runs from `now`: the time the mute now ends, where that is
        later than it was (set the timer for it), else None (a longer one already holds)."""
        until = now + throttle_ms / 1000
        if until <= self.until:
            return None
        self.until = until
        return until

    def may_end(self) -> bool:
        """At the timer: whether reading may resume, or a response over quota is still to go
        out, whose own throttle ends the pause."""
        return not self.due
