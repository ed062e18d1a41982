"""A client's requests between the socket and their handling: cut out of the bytes read, and
handled in order, none while a pause that holds lasts. Pure: no socket, no clock; the connection
passes its read gate's reasons in, handles what it is given, and hands back what it could not."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence, Set

from kafka_quota_proxy.protocol.framing import FrameDecoder
from kafka_quota_proxy.proxy.datapath.read_gate import Pause


def holds(reasons: Set[Pause]) -> bool:
    """Whether frames already read must wait: a pause for anything but the in-flight bound
    (a throttle, a paced quota's turn, an authentication still being decided, a client not
    reading its responses, a connection about to close)."""
    return bool(reasons) and (len(reasons) > 1 or Pause.INFLIGHT not in reasons)


class Intake:
    """The requests read and not yet handled. Frames read in one go come out together; once a
    pause that holds begins, the rest of them wait (`hold`), and frames read later wait behind
    them, until `release` finds nothing holding."""

    __slots__ = ("decoder", "held")

    def __init__(self, max_frame_bytes: int) -> None:
        self.decoder = FrameDecoder(max_frame_bytes)
        # Frames read but not yet handled: a pause that holds began while they were in the same
        # read. Handled, in order, once it ends.
        self.held: deque[memoryview] = deque()

    def received(self, data: bytes) -> Sequence[memoryview] | None:
        """The requests in bytes just read, to handle now (perhaps none: a frame not yet whole);
        None while earlier ones wait, these behind them. ProtocolError for bytes that are no
        Kafka frame."""
        frames = self.decoder.feed(data)
        if self.held:
            self.held.extend(frames)
            return None
        return frames

    def hold(self, frames: Sequence[memoryview]) -> None:
        """`frames`, not handled, wait (in order, after any already waiting)."""
        self.held.extend(frames)

    def release(self, reasons: Set[Pause]) -> list[memoryview]:
        """The frames that waited, to handle now that nothing in `reasons` holds them."""
        if not self.held or holds(reasons):
            return []
        frames = list(self.held)
        self.held.clear()
        return frames

    def drop(self) -> None:
        """Forget what waits: the connection will handle nothing more."""
        self.held.clear()
