"""How long to hold back the answer to a failed login, per source address.

Password guessing is slowed by answering failures late: the first few failures from an address
are answered at once (people mistype), then each one waits twice as long as the last, up to a
cap. A success clears the address; so do `forget_after_ms` without a failure. Kafka itself has
a fixed delay (connection.failed.authentication.delay.ms, default 100 ms); this grows instead,
because the proxy may face the open internet.

Pure: the caller passes the time, in milliseconds from any monotonic clock, and applies the
delay itself (e.g. loop.call_later before sending the failed SaslAuthenticate response).
Memory is bounded: beyond `max_entries` addresses the one idle longest is dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    failures: int
    last_failure_ms: int


class FailureBackoff:
    """Per-address failed-login counter that turns into a response delay."""

    __slots__ = ("max_delay_ms", "free_failures", "forget_after_ms", "initial_delay_ms",
                 "max_entries", "_entries")

    def __init__(self, max_delay_ms: int = 5000, free_failures: int = 3, forget_after_ms: int = 600_000,
                 *, initial_delay_ms: int = 250, max_entries: int = 100_000) -> None:
        if max_delay_ms < 0 or free_failures < 0 or initial_delay_ms < 0:
            raise ValueError("delays and free_failures must not be negative")
        if forget_after_ms <= 0 or max_entries <= 0:
            raise ValueError("forget_after_ms and max_entries must be positive")
        self.max_delay_ms = max_delay_ms
        self.free_failures = free_failures
        self.forget_after_ms = forget_after_ms
        self.initial_delay_ms = initial_delay_ms
        self.max_entries = max_entries
        # Least recently failed first, so expired and evicted entries are always at the front.
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def on_failure(self, addr: str, now_ms: int) -> int:
        """Count a failed login from `addr`; return how many ms to wait before answering it."""
        self._expire(now_ms)
        entry = self._entries.get(addr)
        if entry is None:
            entry = self._entries[addr] = _Entry(0, now_ms)
            if len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(addr)
        entry.failures += 1
        entry.last_failure_ms = now_ms
        return self._delay(entry.failures)

    def on_success(self, addr: str) -> None:
        """A successful login from `addr` forgives its earlier failures."""
        self._entries.pop(addr, None)

    def failures(self, addr: str, now_ms: int) -> int:
        """Failures counted for `addr` that are not yet forgotten (for metrics and tests)."""
        entry = self._entries.get(addr)
        if entry is None or self._expired(entry, now_ms):
            return 0
        return entry.failures

    def _delay(self, failures: int) -> int:
        over = failures - self.free_failures
        if over <= 0:
            return 0
        # The exponent is capped so that a very long run of failures stays cheap to compute.
        return min(self.max_delay_ms, self.initial_delay_ms << min(over - 1, 40))

    def _expire(self, now_ms: int) -> None:
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if not self._expired(oldest, now_ms):
                break
            self._entries.popitem(last=False)

    def _expired(self, entry: _Entry, now_ms: int) -> bool:
        return now_ms - entry.last_failure_ms >= self.forget_after_ms
