"""Properties of the frame decoders: any split of a stream of frames gives back the same frames,
whichever frames are gathered into one growing buffer (`gather_from`) and which are joined;
arbitrary bytes raise nothing but ProtocolError; what a decoder holds stays within its limit."""

from __future__ import annotations

import struct

from hypothesis import example, given
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.errors import FrameTooLarge, NegativeFrameLength, ProtocolError
from kafka_quota_proxy.protocol.framing import FrameDecoder, FrameHead, FramePiece, StreamingFrameDecoder

MAX_FRAME = 400  # small, so that generated streams reach the limit
# The size from which a split frame is gathered: from every frame (4) to none (past the limit).
gather_sizes = st.integers(4, MAX_FRAME + 5)


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


payloads = st.lists(st.binary(max_size=300), max_size=8)


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """`data` cut at arbitrary points (empty chunks included: a read may return nothing new)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@st.composite
def split_stream(draw: st.DrawFn) -> tuple[list[bytes], list[bytes]]:
    frames = [framed(p) for p in draw(payloads)]
    return frames, draw(chunked(b"".join(frames)))


@given(split_stream(), gather_sizes)
@example(([b"\x00\x00\x00\x06abcdef"], [b"\x00\x00", b"\x00\x06a", b"bc", b"", b"def"]), 5)  # prefix split
@example(([b"\x00\x00\x00\x40" + bytes(64)], [b"\x00\x00\x00\x40" + bytes(60), bytes(4)]), 20)  # one jump
def test_any_split_gives_the_same_frames(case: tuple[list[bytes], list[bytes]], gather_from: int) -> None:
    frames, chunks = case
    decoder = FrameDecoder(MAX_FRAME, gather_from=gather_from)
    got: list[bytes] = []
    for chunk in chunks:
        out = decoder.feed(chunk)
        assert all(isinstance(f, memoryview) for f in out)
        got += [bytes(f) for f in out]
    assert got == frames
    assert decoder.buffered == 0


@st.composite
def streaming_case(draw: st.DrawFn) -> tuple[int, int, int, list[bytes], list[bytes]]:
    stream_from = draw(st.integers(5, 200))
    head_bytes = draw(st.integers(4, stream_from - 1))
    frames, chunks = draw(split_stream())
    return stream_from, head_bytes, draw(gather_sizes), frames, chunks


@given(streaming_case())
def test_streamed_frames_reassemble_exactly(case: tuple[int, int, int, list[bytes], list[bytes]]) -> None:
    stream_from, head_bytes, gather_from, frames, chunks = case
    decoder = StreamingFrameDecoder(MAX_FRAME, stream_from, head_bytes, gather_from)
    got: list[bytes] = []
    current: bytearray | None = None  # the large frame being handed over in pieces
    expected_size = 0
    for chunk in chunks:
        for event in decoder.feed(chunk):
            if isinstance(event, FrameHead):
                assert current is None
                assert len(event.data) == head_bytes and event.size >= stream_from
                current, expected_size = bytearray(event.data), event.size
            elif isinstance(event, FramePiece):
                assert current is not None and len(event.data) > 0
                current += event.data
                assert event.last == (len(current) == expected_size)
                if event.last:
                    got.append(bytes(current))
                    current = None
            else:
                assert current is None and len(event) < stream_from
                got.append(bytes(event))
    assert got == frames
    assert current is None and decoder.streaming_left == 0 and decoder.buffered == 0


@given(st.lists(st.binary(max_size=64), max_size=10), st.integers(0, 3), gather_sizes)
@example([b"\xff\xff\xff\xff"], 0, MAX_FRAME + 5)  # size -1
@example([b"\x00\x00\x01", b"\x91"], 0, MAX_FRAME + 5)  # size 401, one over the limit, its prefix split
def test_arbitrary_bytes_raise_only_protocol_errors(chunks: list[bytes], which: int,
                                                    gather_from: int) -> None:
    decoder: FrameDecoder | StreamingFrameDecoder
    if which == 0:
        decoder = FrameDecoder(MAX_FRAME, gather_from)
    else:
        decoder = StreamingFrameDecoder(MAX_FRAME, stream_from=16 * which, head_bytes=4 * which,
                                        gather_from=gather_from)
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            # A client can make the decoder hold at most one frame (or one large frame's head).
            assert decoder.buffered <= MAX_FRAME + 4
    except ProtocolError:
        pass


@given(st.integers(-(2**31), 2**31 - 1), st.integers(0, 3))
def test_size_prefix_checked_before_any_body_arrives(size: int, split: int) -> None:
    decoder = FrameDecoder(MAX_FRAME)
    prefix = struct.pack(">i", size)
    try:
        frames = decoder.feed(prefix[:split]) + decoder.feed(prefix[split:])
    except NegativeFrameLength:
        assert size < 0
    except FrameTooLarge:
        assert size > MAX_FRAME
    else:
        assert 0 <= size <= MAX_FRAME
        assert [bytes(f) for f in frames] == ([prefix] if size == 0 else [])
