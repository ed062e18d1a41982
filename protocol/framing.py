"""Splitting a byte stream into Kafka frames (a 4-byte big-endian size, then that many bytes).

`FrameDecoder.feed` returns complete frames, size prefix included, so the proxy can forward a
frame exactly as received. When a frame lies wholly inside one received chunk it is returned as a
memoryview slice of that (immutable) chunk: no copy. Only a frame split across chunks is
assembled, with one join when its last byte arrives.
"""

from __future__ import annotations

from .errors import FrameTooLarge, NegativeFrameLength
from .primitives import INT32

DEFAULT_MAX_FRAME_BYTES = 104_857_600  # Kafka's socket.request.max.bytes default


class FrameDecoder:
    """Incremental frame splitter with a size limit."""

    __slots__ = ("max_frame_bytes", "_parts", "_have", "_need")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._parts: list[bytes] = []  # pieces of an incomplete frame
        self._have = 0  # bytes held in _parts
        self._need = -1  # total size of the frame being assembled (prefix included), -1 = unknown

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return self._have

    def _frame_size(self, prefix: bytes | memoryview) -> int:
        (size,) = INT32.unpack_from(prefix, 0)
        if size < 0:
            raise NegativeFrameLength(f"negative frame length {size}")
        if size > self.max_frame_bytes:
            raise FrameTooLarge(f"frame of {size} bytes exceeds the limit of {self.max_frame_bytes}")
        return size + 4

    def feed(self, data: bytes) -> list[memoryview]:
        """Add received bytes; return every frame completed by them, in order."""
        frames: list[memoryview] = []
        view = memoryview(data)
        pos = 0
        end = len(data)
        if self._parts:
            pos = self._continue(view, frames)
            if pos < 0:
                return frames
        while pos < end:
            if end - pos < 4:
                self._start(view[pos:], -1)
                break
            total = self._frame_size(view[pos : pos + 4])
            if end - pos < total:
                self._start(view[pos:], total)
                break
            frames.append(view[pos : pos + total])
            pos += total
        return frames

    def _start(self, piece: memoryview, total: int) -> None:
        self._parts = [bytes(piece)]
        self._have = len(piece)
        self._need = total

    def _continue(self, view: memoryview, frames: list[memoryview]) -> int:
        """Extend the pending frame; return where the rest of `view` starts, or -1 if all used."""
        if self._need < 0:
            # The size prefix itself was split.
            take = min(4 - self._have, len(view))
            self._parts.append(bytes(view[:take]))
            self._have += take
            if self._have < 4:
                return -1
            prefix = b"".join(self._parts)
            self._parts = [prefix]
            self._need = self._frame_size(prefix)
            used = take
        else:
            used = 0
        missing = self._need - self._have
        rest = len(view) - used
        if rest < missing:
            self._parts.append(bytes(view[used:]))
            self._have += rest
            return -1
        self._parts.append(bytes(view[used : used + missing]))
        frames.append(memoryview(b"".join(self._parts)))
        self._parts = []
        self._have = 0
        self._need = -1
        return used + missing
