"""FrameDecoder: bytes in, whole frames (size prefix included) out; StreamingFrameDecoder: large
frames as a head and pieces."""

from __future__ import annotations

import random
import struct
import tracemalloc
from typing import Any

import pytest

from kafka_quota_proxy.protocol.errors import FrameTooLarge, NegativeFrameLength, ProtocolError
from kafka_quota_proxy.protocol.framing import (
    COPY_BELOW,
    DEFAULT_MAX_FRAME_BYTES,
    GATHER_FROM,
    FrameDecoder,
    FrameHead,
    FramePiece,
    StreamingFrameDecoder,
)


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def prefix(size: int) -> bytes:
    return struct.pack(">i", size)


# Frames of assorted sizes, including an empty one and one whose size prefix has no zero bytes.
FRAMES = [
    frame(b"a"),
    frame(b""),
    frame(b"hello, world"),
    frame(bytes(range(256))),
    frame(b"\x00\x00\x00\x05"),  # looks like a size prefix itself
    frame(bytes(range(2)) * 0x0081),  # size 0x0102 -> prefix 00 00 01 02: two non-zero bytes
]
STREAM = b"".join(FRAMES)

# A short stream for the quadratic two-cut test.
SMALL_FRAMES = [frame(b"xy"), frame(b""), frame(b"abcde"), frame(b"q")]
SMALL_STREAM = b"".join(SMALL_FRAMES)


def feed_all(decoder: FrameDecoder, chunks: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for chunk in chunks:
        got = decoder.feed(chunk)
        assert all(isinstance(f, memoryview) for f in got)
        out.extend(bytes(f) for f in got)
    return out


def test_default_limit_is_kafkas_socket_request_max_bytes() -> None:
    assert DEFAULT_MAX_FRAME_BYTES == 104_857_600
    assert FrameDecoder().max_frame_bytes == DEFAULT_MAX_FRAME_BYTES


def test_new_decoder_holds_nothing() -> None:
    d = FrameDecoder()
    assert d.buffered == 0
    assert d.feed(b"") == []
    assert d.buffered == 0


def test_one_frame_per_chunk() -> None:
    d = FrameDecoder()
    for f in FRAMES:
        got = d.feed(f)
        assert len(got) == 1
        assert isinstance(got[0], memoryview)
        assert bytes(got[0]) == f
        assert d.buffered == 0


def test_several_frames_in_one_chunk() -> None:
    d = FrameDecoder()
    got = d.feed(STREAM)
    assert [bytes(f) for f in got] == FRAMES
    assert d.buffered == 0


def test_frames_inside_a_chunk_are_zero_copy_slices_of_it() -> None:
    d = FrameDecoder()
    chunk = STREAM
    got = d.feed(chunk)
    start = 0
    for f, expected in zip(got, FRAMES, strict=True):
        assert f.obj is chunk  # a view of the received bytes, not a copy
        assert f.nbytes == len(expected)
        assert bytes(f) == chunk[start : start + len(expected)]
        start += len(expected)


def test_frames_after_a_reassembled_one_are_still_slices_of_their_chunk() -> None:
    d = FrameDecoder()
    first, second = FRAMES[2], FRAMES[3]
    assert d.feed(first[:5]) == []
    chunk = first[5:] + second
    got = d.feed(chunk)
    assert [bytes(f) for f in got] == [first, second]
    assert got[0].obj is not chunk  # assembled from two chunks: one join
    assert got[1].obj is chunk  # wholly inside the second chunk: no copy


def test_reassembled_frame_does_not_alias_the_input_chunks() -> None:
    d = FrameDecoder()
    f = FRAMES[2]
    part1 = bytearray(f[:7])
    part2 = bytearray(f[7:])
    d.feed(part1)
    (got,) = d.feed(part2)
    part1[:] = b"\xee" * len(part1)
    part2[:] = b"\xee" * len(part2)
    assert bytes(got) == f


def test_a_frame_trickled_a_byte_per_read_is_held_at_about_a_byte_per_byte() -> None:
    # A slowloris client: each read brings one byte. Held as a view per read, that cost ~320
    # bytes per byte (a frame of max_frame_bytes, 32 GB); copied, about one.
    d = FrameDecoder()
    trickled = 100_000
    tracemalloc.start()
    try:
        d.feed(prefix(10_000_000))
        for _ in range(trickled):
            d.feed(b"x")
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert d.buffered == 4 + trickled
    assert held < 2 * trickled + 64 * 1024


def _peak_while_feeding(decoder: FrameDecoder, whole: bytes, pieces: list[int]) -> tuple[int, list[bytes]]:
    """Feed `whole` cut into `pieces` (sizes, cycled), each read a new bytes object made under
    tracemalloc as a transport's would be; the peak traced meanwhile, and the frames that came."""
    out: list[bytes] = []
    tracemalloc.start()
    try:
        pos, i = 0, 0
        while pos < len(whole):
            n = pieces[i % len(pieces)]
            got = decoder.feed(whole[pos:pos + n])
            out += [bytes(f) for f in got[:-1]]
            if got:  # the last one is measured while it is held, then copied out for the check
                _, peak = tracemalloc.get_traced_memory()
                out.append(bytes(got[-1]))
            del got
            pos, i = pos + n, i + 1
    finally:
        tracemalloc.stop()
    return peak, out


# Read sizes from a trickle to a full read (asyncio and uvloop read at most 256 KiB at a time).
TRICKLE = [1, 7, 300, 4096, COPY_BELOW - 1, COPY_BELOW, 65_536, 200_000, 3]


@pytest.mark.parametrize("pieces", [TRICKLE, [65_536], [256 * 1024], [1000]],
                         ids=["mixed", "64K", "256K", "1000B"])
def test_a_large_frame_in_pieces_is_held_once(pieces: list[int]) -> None:
    # Before: views of the reads (or copies of small ones) and, when the last byte came, their
    # join: the frame twice. Now one buffer, grown as the pieces come and handed over as it is.
    whole = frame(random.Random(1).randbytes(8 * 1024 * 1024 - 4))
    peak, out = _peak_while_feeding(FrameDecoder(), whole, pieces)
    assert out == [whole]
    # The fixed amount: the read being handled (at most 256 KiB) and the decoder's own objects.
    assert peak <= len(whole) + 256 * 1024 + 16 * 1024, peak - len(whole)


def test_a_large_frame_that_stops_coming_holds_little_more_than_what_came() -> None:
    # A slowloris declaring the largest frame allowed and then trickling: the buffer grows with
    # what arrives (under 1.27 times it), it is not the declared size reserved on a header.
    d = FrameDecoder()
    sent = 4 + 1024 * 1024
    head = prefix(DEFAULT_MAX_FRAME_BYTES) + b"x" * (sent - 4)
    tracemalloc.start()
    try:
        for pos in range(0, sent, 1000):
            assert d.feed(head[pos:pos + 1000]) == []
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert d.buffered == sent
    assert held <= 1.27 * sent + 16 * 1024


@pytest.mark.parametrize("size", [GATHER_FROM - 1, GATHER_FROM, GATHER_FROM + 1, 3 * GATHER_FROM + 5])
def test_frames_either_side_of_the_gathering_size_come_back_exactly(size: int) -> None:
    rng = random.Random(size)
    frames = [frame(rng.randbytes(size - 4)) for _ in range(3)]
    stream = b"".join(frames)
    for cut in [100, COPY_BELOW, size - 1, size, size + 3]:
        d = FrameDecoder()
        assert feed_all(d, [stream[a:a + cut] for a in range(0, len(stream), cut)]) == frames, cut
        assert d.buffered == 0
    # The size prefix itself in pieces, then the rest in one read and in two.
    d = FrameDecoder()
    assert feed_all(d, [stream[:2], stream[2:3], stream[3:size + 1], stream[size + 1:]]) == frames
    assert feed_all(d, [stream[:size + 2], stream[size + 2:size + 4], stream[size + 4:]]) == frames
    assert d.buffered == 0


@pytest.mark.parametrize("seed", range(10))
def test_a_frame_in_pieces_large_and_small_is_reassembled_exactly(seed: int) -> None:
    rng = random.Random(seed)
    f = frame(rng.randbytes(300_000))
    chunks, pos = [], 0
    while pos < len(f):
        n = rng.choice([1, 3, 100, COPY_BELOW - 1, COPY_BELOW, 40_000])
        chunks.append(f[pos:pos + n])
        pos += n
    d = FrameDecoder()
    assert feed_all(d, chunks) == [f]
    assert d.buffered == 0


def test_stream_split_at_every_byte_boundary() -> None:
    ends = [sum(len(f) for f in FRAMES[: i + 1]) for i in range(len(FRAMES))]
    for cut in range(len(STREAM) + 1):
        d = FrameDecoder()
        first = d.feed(STREAM[:cut])
        # Every frame wholly before the cut comes out of the first chunk; the rest is held.
        complete = [f for f, end in zip(FRAMES, ends, strict=True) if end <= cut]
        assert [bytes(f) for f in first] == complete, cut
        assert d.buffered == cut - sum(len(f) for f in complete), cut
        second = d.feed(STREAM[cut:])
        assert [bytes(f) for f in first + second] == FRAMES, cut
        assert d.buffered == 0


@pytest.mark.parametrize("f", [FRAMES[3], FRAMES[5]], ids=["size-260", "size-262"])
def test_single_frame_split_at_every_boundary_including_size_prefix(f: bytes) -> None:
    for cut in range(1, len(f)):
        d = FrameDecoder()
        assert d.feed(f[:cut]) == []
        assert d.buffered == cut
        (got,) = d.feed(f[cut:])
        assert bytes(got) == f, cut
        assert d.buffered == 0


def test_stream_split_at_every_pair_of_boundaries() -> None:
    n = len(SMALL_STREAM)
    for i in range(n + 1):
        for j in range(i, n + 1):
            d = FrameDecoder()
            chunks = [SMALL_STREAM[:i], SMALL_STREAM[i:j], SMALL_STREAM[j:]]
            assert feed_all(d, chunks) == SMALL_FRAMES, (i, j)
            assert d.buffered == 0


def test_stream_fed_one_byte_at_a_time() -> None:
    d = FrameDecoder()
    out: list[bytes] = []
    for i in range(len(STREAM)):
        got = d.feed(STREAM[i : i + 1])
        out.extend(bytes(f) for f in got)
    assert out == FRAMES
    assert d.buffered == 0


def test_size_prefix_split_into_single_bytes() -> None:
    d = FrameDecoder()
    assert d.feed(b"\x00") == []
    assert d.buffered == 1
    assert d.feed(b"\x00") == []
    assert d.buffered == 2
    assert d.feed(b"\x00") == []
    assert d.buffered == 3
    assert [bytes(f) for f in d.feed(b"\x03abc")] == [b"\x00\x00\x00\x03abc"]
    assert d.buffered == 0


def test_prefix_completed_without_payload_then_payload_later() -> None:
    d = FrameDecoder()
    assert d.feed(b"\x00\x00") == []
    assert d.feed(b"\x00\x03") == []
    assert d.buffered == 4
    assert d.feed(b"ab") == []
    assert d.buffered == 6
    assert [bytes(f) for f in d.feed(b"c")] == [b"\x00\x00\x00\x03abc"]


def test_empty_chunk_in_the_middle_of_a_frame_changes_nothing() -> None:
    d = FrameDecoder()
    f = FRAMES[2]
    assert d.feed(f[:2]) == []
    assert d.feed(b"") == []
    assert d.buffered == 2
    assert d.feed(f[2:9]) == []
    assert d.feed(b"") == []
    assert d.buffered == 9
    assert [bytes(x) for x in d.feed(f[9:])] == [f]


def test_split_frame_completed_together_with_further_frames_and_a_partial_one() -> None:
    d = FrameDecoder()
    a, b, c = FRAMES[2], FRAMES[0], FRAMES[3]
    assert d.feed(a[:3]) == []
    got = d.feed(a[3:] + b + c[:10])
    assert [bytes(f) for f in got] == [a, b]
    assert d.buffered == 10
    assert [bytes(f) for f in d.feed(c[10:])] == [c]


def test_zero_length_frame() -> None:
    d = FrameDecoder()
    (got,) = d.feed(b"\x00\x00\x00\x00")
    assert bytes(got) == b"\x00\x00\x00\x00"
    assert d.buffered == 0


def test_zero_length_frame_with_split_prefix() -> None:
    d = FrameDecoder()
    assert d.feed(b"\x00\x00") == []
    got = d.feed(b"\x00\x00")
    assert [bytes(f) for f in got] == [b"\x00\x00\x00\x00"]
    assert d.buffered == 0


def test_many_zero_length_frames_in_one_chunk() -> None:
    d = FrameDecoder()
    got = d.feed(b"\x00\x00\x00\x00" * 5)
    assert [bytes(f) for f in got] == [b"\x00\x00\x00\x00"] * 5


@pytest.mark.parametrize("size", [-1, -2, -(2**31)])
def test_negative_size(size: int) -> None:
    d = FrameDecoder()
    with pytest.raises(NegativeFrameLength) as exc:
        d.feed(prefix(size) + b"payload")
    assert exc.value.kind == "negative_frame_length"
    assert isinstance(exc.value, ProtocolError)


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_negative_size_with_split_prefix_fails_when_the_prefix_completes(cut: int) -> None:
    d = FrameDecoder()
    data = prefix(-1)
    assert d.feed(data[:cut]) == []
    with pytest.raises(NegativeFrameLength):
        d.feed(data[cut:])


def test_negative_size_after_a_good_frame_in_the_same_chunk() -> None:
    d = FrameDecoder()
    with pytest.raises(NegativeFrameLength):
        d.feed(FRAMES[0] + prefix(-5))


def test_size_exactly_at_the_limit_is_accepted() -> None:
    d = FrameDecoder(max_frame_bytes=10)
    f = frame(b"0123456789")
    (got,) = d.feed(f)
    assert bytes(got) == f


def test_size_exactly_at_the_limit_split_is_accepted() -> None:
    d = FrameDecoder(max_frame_bytes=10)
    f = frame(b"0123456789")
    for cut in range(1, len(f)):
        assert d.feed(f[:cut]) == []
        assert [bytes(x) for x in d.feed(f[cut:])] == [f]


def test_size_one_over_the_limit_is_rejected() -> None:
    d = FrameDecoder(max_frame_bytes=10)
    with pytest.raises(FrameTooLarge) as exc:
        d.feed(frame(b"0123456789a"))
    assert exc.value.kind == "frame_too_large"
    assert isinstance(exc.value, ProtocolError)


def test_oversized_frame_is_rejected_from_its_prefix_alone() -> None:
    d = FrameDecoder(max_frame_bytes=10)
    with pytest.raises(FrameTooLarge):
        d.feed(prefix(11))


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_oversized_frame_with_split_prefix(cut: int) -> None:
    d = FrameDecoder(max_frame_bytes=10)
    data = prefix(11)
    assert d.feed(data[:cut]) == []
    with pytest.raises(FrameTooLarge):
        d.feed(data[cut:])


def test_default_limit_boundary_checked_from_the_prefix() -> None:
    d = FrameDecoder()
    assert d.feed(prefix(DEFAULT_MAX_FRAME_BYTES)) == []  # allowed: waits for the payload
    assert d.buffered == 4
    with pytest.raises(FrameTooLarge):
        FrameDecoder().feed(prefix(DEFAULT_MAX_FRAME_BYTES + 1))
    with pytest.raises(FrameTooLarge):
        FrameDecoder().feed(prefix(2**31 - 1))


def test_zero_limit_allows_only_empty_frames() -> None:
    d = FrameDecoder(max_frame_bytes=0)
    assert [bytes(f) for f in d.feed(frame(b""))] == [frame(b"")]
    with pytest.raises(FrameTooLarge):
        d.feed(frame(b"x"))


# --- StreamingFrameDecoder ---------------------------------------------------------------------------

def _reassemble(events: list[Any]) -> list[tuple[str, bytes]]:
    """('whole', frame) for frames handed over whole, ('streamed', frame) for head + pieces."""
    out: list[tuple[str, bytes]] = []
    current: list[bytes] | None = None
    size = 0
    for e in events:
        if isinstance(e, memoryview):
            assert current is None
            out.append(("whole", bytes(e)))
        elif isinstance(e, FrameHead):
            assert current is None
            current, size = [e.data], e.size
        else:
            assert current is not None
            current.append(bytes(e.data))
            if e.last:
                frame = b"".join(current)
                assert len(frame) == size
                out.append(("streamed", frame))
                current = None
    assert current is None
    return out


@pytest.mark.parametrize("seed", range(20))
def test_streaming_decoder_hands_large_frames_over_as_they_come(seed: int) -> None:
    rng = random.Random(seed)
    frames = [frame(rng.randbytes(rng.choice([0, 1, 50, 299, 300, 301, 2000, 5000]))) for _ in range(30)]
    stream = b"".join(frames)
    cuts = sorted(rng.sample(range(1, len(stream)), 60))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    d = StreamingFrameDecoder(10_000, stream_from=304, head_bytes=64)
    events: list[Any] = []
    for chunk in chunks:
        events += d.feed(chunk)
    assert [f for _, f in _reassemble(events)] == frames
    assert [kind for kind, _ in _reassemble(events)] == [
        "whole" if len(f) < 304 else "streamed" for f in frames]
    assert d.buffered == 0
    heads = [e for e in events if isinstance(e, FrameHead)]
    assert all(len(h.data) == 64 for h in heads)


def test_streamed_pieces_are_views_of_the_chunks() -> None:
    big = frame(b"x" * 1000)
    d = StreamingFrameDecoder(10_000, stream_from=500, head_bytes=100)
    first, second = big[:300], big[300:]
    head, piece = d.feed(first)
    assert isinstance(head, FrameHead) and head.data == big[:100] and head.size == len(big)
    assert isinstance(piece, FramePiece) and piece.data.obj is first and not piece.last
    (last,) = d.feed(second)
    assert isinstance(last, FramePiece) and last.data.obj is second and last.last


def test_streaming_decoder_checks_sizes() -> None:
    d = StreamingFrameDecoder(100, stream_from=50, head_bytes=10)
    with pytest.raises(FrameTooLarge):
        d.feed(struct.pack(">i", 101))
    with pytest.raises(NegativeFrameLength):
        StreamingFrameDecoder(100, stream_from=50, head_bytes=10).feed(struct.pack(">i", -1))
    with pytest.raises(ValueError):
        StreamingFrameDecoder(100, stream_from=10, head_bytes=10)
