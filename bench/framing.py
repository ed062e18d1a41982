"""What cutting frames out of a client's bytes costs (protocol/framing.py's FrameDecoder), and how
much a frame that arrives in pieces makes it hold.

Every request passes through `FrameDecoder.feed`, so its cost per small frame is part of the
proxy's cost per request; the throughput benchmark measures that end to end, but on a shared
2-core machine its ratios move by more than a change here could. This one times the decoder
alone, best of five rounds, and reads the peak it holds with tracemalloc: the most a client can
make it buffer for one frame.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable

from bench.producer_ids import ROUNDS
from kafka_quota_proxy.protocol.framing import FrameDecoder

KIB = 1024
MIB = 1024 * KIB
READ = 256 * KIB  # the most one read hands over (asyncio's and uvloop's read size)
SMALL = KIB  # a Produce of one 1 KiB record is about this size
FRAMES = 20_000  # small frames per round
LARGE_FRAMES = 40  # 1 MiB frames per round
PEAK_FRAME = 16 * MIB


def frame(size: int) -> bytes:
    """A frame of `size` bytes, size prefix included."""
    return (size - 4).to_bytes(4, "big") + bytes(range(256)) * ((size - 4) // 256) + b"x" * ((size - 4) % 256)


def reads(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def best_per_frame_ns(chunks: list[bytes], frames: int) -> float:
    """Nanoseconds per frame to feed `chunks` (which hold `frames` whole frames) to a decoder."""
    best = float("inf")
    for _ in range(ROUNDS):
        decoder = FrameDecoder()
        feed = decoder.feed
        got = 0
        start = time.perf_counter()
        for chunk in chunks:
            got += len(feed(chunk))
        best = min(best, (time.perf_counter() - start) / frames * 1e9)
        assert got == frames and decoder.buffered == 0
    return best


def peak_held(size: int, piece: int) -> int:
    """The most the decoder and the reads it holds on to take (tracemalloc) while one frame of
    `size` bytes arrives `piece` bytes a read; each read is a new bytes object, as a transport's."""
    whole = frame(size)
    decoder = FrameDecoder()
    tracemalloc.start()
    try:
        for i in range(0, size, piece):
            out = decoder.feed(whole[i:i + piece])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(out) == 1 and len(out[0]) == size
    return peak


def cases() -> list[tuple[str, Callable[[], float], str]]:
    small = frame(SMALL)
    one_each = [small] * FRAMES
    pipelined = reads(small * FRAMES, 16 * SMALL)  # 16 frames a read
    # Each frame cut in two at a random-looking point: the split path, joined once.
    straddling = reads(small * FRAMES, SMALL + 300)
    large = frame(MIB)
    large_reads = reads(large, READ) * LARGE_FRAMES
    tls_reads = reads(large, 16 * KIB) * LARGE_FRAMES  # a TLS record's worth a read
    return [
        ("1 KiB frames, one a read", lambda: best_per_frame_ns(one_each, FRAMES), "ns"),
        ("1 KiB frames, 16 a read", lambda: best_per_frame_ns(pipelined, FRAMES), "ns"),
        ("1 KiB frames, cut across reads of 1,324 B", lambda: best_per_frame_ns(straddling, FRAMES), "ns"),
        ("1 MiB frames in reads of 256 KiB", lambda: best_per_frame_ns(large_reads, LARGE_FRAMES), "µs"),
        ("1 MiB frames in reads of 16 KiB", lambda: best_per_frame_ns(tls_reads, LARGE_FRAMES), "µs"),
    ]


def run() -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for name, timed, unit in cases():
        ns = timed()
        rows.append((f"feed: {name}, per frame", f"{ns:,.0f} ns" if unit == "ns" else f"{ns / 1000:,.1f} µs"))
    for piece in (64 * KIB, KIB):
        peak = peak_held(PEAK_FRAME, piece)
        rows.append((f"peak held for one {PEAK_FRAME / MIB:g} MiB frame in reads of {piece // KIB} KiB",
                     f"{peak / MIB:.2f} MiB ({peak / PEAK_FRAME:.2f}x the frame)"))
    return rows
