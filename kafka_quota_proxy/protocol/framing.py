"""Splitting a byte stream into Kafka frames (a 4-byte big-endian size, then that many bytes).

`FrameDecoder.feed` returns complete frames, size prefix included, so the proxy can forward a
frame exactly as received. When a frame lies wholly inside one received chunk it is returned as a
memoryview slice of that (immutable) chunk: no copy. A frame split across chunks is held once:
a small one as views of the chunks, and copies of pieces too small to be worth a view
(`COPY_BELOW`), joined when its last byte arrives; a large one (`GATHER_FROM`) copied piece by
piece into one buffer that grows as bytes arrive and is handed over as it is, so it never exists
twice. `StreamingFrameDecoder` does the same, but hands large frames over as they arrive;
`FrameDecoder` is the one that never does.
"""

from __future__ import annotations

from dataclasses import dataclass
from io import BytesIO
from typing import TYPE_CHECKING

from kafka_quota_proxy.protocol.errors import FrameTooLarge, NegativeFrameLength
from kafka_quota_proxy.protocol.primitives import INT32

DEFAULT_MAX_FRAME_BYTES = 104_857_600  # Kafka's socket.request.max.bytes default
# A piece of an unfinished frame smaller than this is copied, not held as a view: a view and its
# chunk cost about 230 bytes whatever the chunk's size, so a peer trickling a frame a byte per read
# would otherwise make the decoder hold ~230 bytes per byte (a frame of max_frame_bytes, 23 GB).
# Views of larger pieces add at most 1.4%.
COPY_BELOW = 16 * 1024
# A frame handed over whole from this size up that does not arrive in one chunk is gathered into
# one buffer rather than joined at the end, which would hold it twice for that instant. Below it,
# the join costs at most this much more.
GATHER_FROM = 64 * 1024


def frame_size(prefix: bytes | memoryview, max_frame_bytes: int) -> int:
    """The whole frame's size, prefix included, from its 4-byte size prefix; checked."""
    (size,) = INT32.unpack_from(prefix, 0)
    if size < 0:
        raise NegativeFrameLength(f"negative frame length {size}")
    if size > max_frame_bytes:
        raise FrameTooLarge(f"frame of {size} bytes exceeds the limit of {max_frame_bytes}")
    return size + 4


@dataclass(frozen=True, slots=True)
class FrameHead:
    """The start of a frame handed over as it arrives: `data` holds its first bytes (size prefix
    included), `size` is the whole frame's size (prefix included)."""

    data: bytes
    size: int


@dataclass(frozen=True, slots=True)
class FramePiece:
    """The next bytes of a frame handed over as it arrives; `last` on the piece that ends it."""

    data: memoryview
    last: bool


FrameEvent = memoryview | FrameHead | FramePiece


class _FrameSplitter:
    """What both decoders share: frames of `stream_from` bytes or more are handed over as a
    FrameHead and FramePieces, smaller ones whole."""

    __slots__ = ("max_frame_bytes", "stream_from", "head_bytes", "gather_from", "_parts", "_tail",
                 "_gather", "_exact", "_have", "_need", "_streaming")

    def __init__(self, max_frame_bytes: int, stream_from: int, head_bytes: int = 256,
                 gather_from: int = GATHER_FROM) -> None:
        if not 4 <= head_bytes < stream_from:
            raise ValueError("head_bytes must be at least 4 and below stream_from")
        self.max_frame_bytes = max_frame_bytes
        self.stream_from = stream_from
        self.head_bytes = head_bytes
        self.gather_from = gather_from
        # The frame so far: views of (immutable) chunks, and small pieces copied together (_keep);
        # or, for a large frame, the one buffer it is copied into (_gather_in).
        self._parts: list[memoryview | bytearray] = []
        self._tail: bytearray | None = None  # the last part, when small pieces are being copied into it
        self._gather: BytesIO | None = None
        self._exact = False  # _gather has been grown to the frame's size
        self._have = 0
        self._need = -1  # the frame's size once its prefix is known
        self._streaming = 0  # bytes of a streamed frame still to come

    @property
    def buffered(self) -> int:
        """Bytes received for a frame (or a large frame's head) not yet handed over."""
        return self._have

    def _goal(self, total: int) -> int:
        """Bytes to gather before handing over: the whole frame, or the head of a large one."""
        return total if total < self.stream_from else self.head_bytes

    def _hand_over(self, data: bytes | memoryview, total: int, out: list[FrameEvent]) -> None:
        if total < self.stream_from:
            out.append(data if isinstance(data, memoryview) else memoryview(data))
        else:
            out.append(FrameHead(bytes(data), total))
            self._streaming = total - self.head_bytes

    def _sized(self) -> None:
        """The unfinished frame's size is known: a large one is gathered from here on."""
        if self._goal(self._need) >= self.gather_from:
            self._gather, self._exact = BytesIO(), False
            if self._parts:  # a size prefix that came in pieces
                self._gather_in(b"".join(self._parts), self._have)
                self._parts, self._tail = [], None

    def _keep(self, piece: memoryview) -> None:
        """Hold a piece of the unfinished frame: a view of a large one, a copy of a small one."""
        self._have += len(piece)
        if self._gather is not None:
            self._gather_in(piece, self._have)
        elif len(piece) >= COPY_BELOW:
            self._parts.append(piece)
            self._tail = None
        elif self._tail is not None:
            self._tail += piece
        else:
            self._tail = bytearray(piece)
            self._parts.append(self._tail)

    def _gather_in(self, piece: memoryview | bytes, end: int) -> None:
        """Copy a piece of a large frame into its buffer; `end`: the bytes gathered with it.

        The buffer grows as pieces come, by reallocation, to at most an eighth more than it holds
        (CPython's BytesIO), until that eighth could take it past the frame's size: then it grows
        once to exactly that size, zeroing the rest (about a fifth of the frame when its pieces
        are small), which the pieces overwrite. So it stays under 1.27 times what has arrived,
        plus 16 bytes, and ends at the frame's size, never past it."""
        gather = self._gather
        assert gather is not None
        if not self._exact:
            goal = self._goal(self._need)
            # Grown to `end` it could reach end * 1.125 + 7, and from there a growth to `goal`
            # is exact only if goal exceeds that by another eighth: end * 1.125**2 and some.
            if end + (end >> 2) + (end >> 6) + 16 >= goal:
                if end < goal:
                    at = end - len(piece)
                    gather.seek(goal - 1)
                    gather.write(b"\0")
                    gather.seek(at)
                self._exact = True
        gather.write(piece)

    def _split(self, data: bytes) -> list[FrameEvent]:
        """Add received bytes (an immutable chunk); return the frames, heads and pieces they make."""
        out: list[FrameEvent] = []
        view = memoryview(data)
        pos, end = 0, len(view)
        while pos < end:
            if self._streaming:
                take = min(self._streaming, end - pos)
                self._streaming -= take
                out.append(FramePiece(view[pos:pos + take], self._streaming == 0))
                pos += take
                continue
            if not self._have:
                if end - pos >= 4:
                    total = frame_size(view[pos:pos + 4], self.max_frame_bytes)
                    if total < self.stream_from and end - pos >= total:
                        # The common case, inlined: a whole small frame in this chunk.
                        out.append(view[pos:pos + total])
                        pos += total
                        continue
                    goal = self._goal(total)
                    if end - pos >= goal:  # the head of a large frame lies in this chunk
                        self._hand_over(view[pos:pos + goal], total, out)
                        pos += goal
                        continue
                    self._need = total
                    self._sized()
                self._keep(view[pos:])
                return out
            if self._need < 0:  # the size prefix itself was split
                take = min(4 - self._have, end - pos)
                self._keep(view[pos:pos + take])
                pos += take
                if self._have < 4:
                    return out
                self._need = frame_size(b"".join(self._parts), self.max_frame_bytes)
                self._sized()
            goal = self._goal(self._need)
            missing = goal - self._have
            if end - pos < missing:
                self._keep(view[pos:])
                return out
            whole: bytes | memoryview
            if self._gather is not None:
                self._gather_in(view[pos:pos + missing], goal)
                whole = self._gather.getbuffer()  # the buffer itself, not a copy
                self._gather = None
            else:
                self._parts.append(view[pos:pos + missing])
                whole = b"".join(self._parts)
            pos += missing
            total = self._need
            self._parts, self._tail, self._have, self._need = [], None, 0, -1
            self._hand_over(whole, total, out)
        return out


class StreamingFrameDecoder(_FrameSplitter):
    """Like FrameDecoder, but a frame of `stream_from` bytes or more is not held until complete:
    a FrameHead comes as soon as its first `head_bytes` have arrived, then FramePieces, views of
    the received chunks (no copy), up to its end. Smaller frames come whole, as memoryviews:
    slices of one chunk when they lie in one, else joined once.

    A proxy writes the pieces of a large response on as they come (cut-through) instead of
    waiting for the last byte and copying the whole frame together first."""

    __slots__ = ()

    feed = _FrameSplitter._split

    @property
    def streaming_left(self) -> int:
        """Bytes of the frame being handed over in pieces still to come (0 between frames)."""
        return self._streaming

    def take_rest(self) -> int:
        """Take the rest of the frame being handed over away from the decoder: the caller moves
        those bytes itself (proxy/datapath/splice.py) and feeds what follows them. Returns how many."""
        rest, self._streaming = self._streaming, 0
        return rest


class FrameDecoder(_FrameSplitter):
    """Incremental frame splitter with a size limit: every frame comes whole, as a memoryview.
    The streaming decoder's splitting, with `stream_from` beyond any frame the limit allows."""

    __slots__ = ()

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 gather_from: int = GATHER_FROM) -> None:
        super().__init__(max_frame_bytes, stream_from=max_frame_bytes + 5, head_bytes=4,
                         gather_from=gather_from)

    if TYPE_CHECKING:
        def feed(self, data: bytes) -> list[memoryview]:
            """Add received bytes (an immutable chunk); return every frame completed by them."""
            ...
    else:
        # The splitter itself, not a wrapper around it: feed runs for every read on the request
        # path, and a wrapper call cost ~150 ns a read. With nothing streamed, every event it
        # returns is a memoryview.
        feed = _FrameSplitter._split
