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


# Replace body[start:end] with the buffer (start == end inserts it).
Edit = tuple[int, int, Buffer]


def spliced(body: memoryview, edits: list[Edit]) -> Pieces:
    """The body with each edit applied; the stretches between them are views of it, not copies,
    so every byte no edit names (unknown tagged fields included) is the body's own."""
    parts: list[Buffer] = []
    at = 0
    for start, end, new in sorted(edits, key=lambda e: e[0]):
        if start < at or end < start:
            raise ValueError(f"edit {start}..{end} overlaps another or is reversed")
        parts += (body[at:start], new)
        at = end
    parts.append(body[at:])
    return Pieces(tuple(p for p in parts if len(p)))
