"""Find the request that kills the broker in a whole-proxy fuzz run recorded with --record.

    python -m tests.fuzz.proxy_fuzz --seconds 300 --record sessions.log
    python -m tests.fuzz.isolate sessions.log [--through-proxy]

The request frames the proxy would have forwarded (those whose header it reads, in the order the
sessions were sent, up to the broker's death) are sent again, each on its own connection, to a
fresh Tansu, and then a Metadata request for all topics: a broker may take a request and die
only when it next describes what it holds (Tansu 0.6.0 creates a topic of a billion partitions,
then aborts listing it). First all of them, then halves of the set that killed it, until one
frame is left.
That frame's body is then shrunk (cut short, runs of it removed, bytes zeroed) for as long as it
still kills a fresh Tansu, and the smallest one found is printed in hex with what the request
schema walker says of it. Each try starts a Tansu of its own, so a run takes minutes, not hours.
With --through-proxy the frame found is also sent through a kafka-quota-proxy process to check
that the proxy forwards it (before the fix) or refuses it (after).
"""

from __future__ import annotations

import argparse
import socket
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kafka.protocol.metadata import MetadataRequest

from devkit.processes import LOOPBACK, ProxyProcess
from devkit.tansu import Broker
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.framing import FrameDecoder
from kafka_quota_proxy.protocol.headers import frame_request, parse_request_header
from tests.fuzz.proxy_fuzz import read_sessions

# Metadata v12 for every topic: what the fuzz's own producer and consumers ask now and then.
ALL_TOPICS = frame_request(MetadataRequest(version=12, topics=None, allow_auto_topic_creation=False,
                                           include_topic_authorized_operations=False), 12, 1, "isolate")


def forwarded_frames(data: bytes) -> list[bytes]:
    """The whole request frames of one session's bytes that the proxy reads a header from,
    up to the first it refuses (it closes the connection there)."""
    out: list[bytes] = []
    try:
        for frame in FrameDecoder().feed(data):
            header = parse_request_header(frame)
            if header.spec is None:  # a newer ApiVersions: answered by the proxy itself
                continue
            out.append(bytes(frame))
    except ProtocolError:
        pass
    return out


def send(port: int, frames: Sequence[bytes], wait: float = 0.0) -> None:
    """Each frame on its own connection, its size prefix and all; `wait` seconds for an answer."""
    for frame in frames:
        try:
            with socket.create_connection((LOOPBACK, port), timeout=2) as sock:
                sock.sendall(frame)
                if wait:
                    sock.settimeout(wait)
                    try:
                        sock.recv(65536)
                    except TimeoutError:
                        pass
        except OSError:
            pass


def kills(frames: Sequence[bytes], settle: float = 0.5) -> bool:
    """Whether sending `frames`, then a Metadata request for all topics, to a fresh Tansu makes
    it exit."""
    broker = Broker().start()
    try:
        send(broker.port, frames)
        time.sleep(settle)  # it may still be handling the last ones
        send(broker.port, [ALL_TOPICS], wait=2.0)
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and not broker.stopped:
            time.sleep(0.02)
        return broker.stopped
    finally:
        broker.stop()


def bisect(frames: list[bytes], dies: Callable[[Sequence[bytes]], bool]) -> bytes | None:
    """One frame that kills the broker on its own, if the whole list does."""
    if not dies(frames):
        return None
    while len(frames) > 1:
        half = len(frames) // 2
        first, second = frames[:half], frames[half:]
        if dies(first):
            frames = first
        elif dies(second):
            frames = second
        else:
            return None  # only together (broker state): not what this tool looks for
        print(f"  {len(frames)} frames left", flush=True)
    return frames[0]


def reframe(frame: bytes, body: bytes, body_at: int) -> bytes:
    payload = frame[4:body_at] + body
    return struct.pack(">i", len(payload)) + payload


def shrink(frame: bytes, dies: Callable[[Sequence[bytes]], bool], budget: int = 150) -> bytes:
    """The frame with as little body left as still kills the broker: its end cut, runs removed,
    then bytes set to zero, each kept only if the broker still dies (`budget` tries)."""
    body_at = parse_request_header(memoryview(frame)).body_offset
    body = frame[body_at:]
    tries = 0

    def still(candidate: bytes) -> bool:
        nonlocal tries
        tries += 1
        return dies([reframe(frame, candidate, body_at)])

    # the shortest prefix that still kills it
    lo, hi = 0, len(body)
    while lo < hi and tries < budget:
        mid = (lo + hi) // 2
        if still(body[:mid]):
            hi = mid
        else:
            lo = mid + 1
    body = body[:hi]
    # runs removed, halving their length (ddmin's complement step)
    size = max(len(body) // 2, 1)
    while size >= 1 and tries < budget:
        at = 0
        while at < len(body) and tries < budget:
            candidate = body[:at] + body[at + size:]
            if candidate != body and still(candidate):
                body = candidate
            else:
                at += size
        size //= 2
    # bytes zeroed, one at a time
    for i in range(len(body)):
        if tries >= budget:
            break
        if body[i] and still(body[:i] + b"\0" + body[i + 1:]):
            body = body[:i] + b"\0" + body[i + 1:]
    print(f"  shrunk in {tries} tries", flush=True)
    return reframe(frame, body, body_at)


def describe(frame: bytes) -> str:
    header = parse_request_header(memoryview(frame))
    assert header.spec is not None
    return (f"{header.spec.name} v{header.api_version} (API key {header.api_key}), "
            f"{len(frame) - 4} bytes after the size prefix, body at {header.body_offset - 4}")


def through_proxy(frame: bytes) -> tuple[bool, str]:
    """Whether the broker behind a proxy process survives `frame`, then a Metadata request for
    all topics, sent to the proxy; and what the proxy logged about them."""
    broker = Broker().start()
    proxy = ProxyProcess(broker.address, broker.node_id())
    try:
        proxy.start()
        send(proxy.port, [frame], wait=1.0)
        send(proxy.port, [ALL_TOPICS], wait=2.0)
        time.sleep(0.5)
        return not broker.stopped, proxy.log_text()
    finally:
        proxy.stop()
        broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sessions", type=Path, help="a file written by proxy_fuzz --record")
    parser.add_argument("--budget", type=int, default=150, help="tries for shrinking the frame")
    parser.add_argument("--through-proxy", action="store_true")
    args = parser.parse_args()
    sessions = read_sessions(args.sessions)
    frames = [f for _, _, _, data in sessions for f in forwarded_frames(data)]
    print(f"{len(sessions)} sessions before the broker died, {len(frames)} frames the proxy would forward",
          flush=True)
    found = bisect(frames, kills)
    if found is None:
        print("no single frame kills a fresh Tansu")
        return 1
    print("kills Tansu:", describe(found), found.hex(), sep="\n")
    small = shrink(found, kills, args.budget)
    print("smallest found:", describe(small), small.hex(), sep="\n")
    if args.through_proxy:
        survived, log = through_proxy(small)
        print(f"through the proxy: Tansu {'survived' if survived else 'died'}")
        print("\n".join(line for line in log.splitlines() if "closing connection" in line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
