"""A message body made of several buffers, written with writelines instead of being joined.

Rewriting one field of a large response (a tagged tail, throttle_time_ms) must not copy the
megabytes around it: the new body is the untouched slices of the old one plus the new bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

Buffer = bytes | memoryview


@dataclass(frozen=True, slots=True)
class Pieces:
    """A body as a sequence of buffers, written with writelines rather than joined."""

    parts: tuple[Buffer, ...]

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def join(self) -> bytes:
        return b"".join(self.parts)
