"""The rest of a large Fetch response moved from the broker's socket to the client's inside the
kernel, with splice(2) through a pipe, instead of being read into Python and written out again.

Why, and what it measured: docs/architecture.md, "Splice".
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Callable
from typing import Any

# A splice starts only with at least this much still to come, so that its setup (two dup(2)s, the
# event-loop registrations, two close(2)s) is spread over that many bytes. Chosen, not tuned.
SPLICE_FROM = 64 * 1024

PIPE_BYTES = 1 << 20  # the default /proc/sys/fs/pipe-max-size, which anyone may ask for
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
_MORE = getattr(os, "SPLICE_F_MORE", 4)


def supported() -> bool:
    return hasattr(os, "splice")


def plain_socket_fd(transport: Any) -> int | None:
    """The descriptor of a transport's TCP socket when nothing (TLS) stands between it and the
    bytes on the wire; else None."""
    if transport is None or transport.get_extra_info("ssl_object") is not None:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        fd = sock.fileno()
    except (OSError, ValueError):
        return None
    return fd if fd >= 0 else None


class PipePool:
    """Empty pipes for splices to borrow: creating one (pipe2 and F_SETPIPE_SZ) costs three system
    calls, and a consumer fetching large batches splices hundreds of times a second."""

    def __init__(self, keep: int = 64) -> None:
        self._keep = keep
        self._free: list[tuple[int, int, int]] = []

    def take(self) -> tuple[int, int, int]:
        """(read end, write end, capacity in bytes); raises OSError when none can be made."""
        if self._free:
            return self._free.pop()
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            capacity = fcntl.fcntl(w, _F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:  # a lower pipe-max-size, or a pipe-user-pages limit reached
            capacity = fcntl.fcntl(w, _F_GETPIPE_SZ)
        return r, w, capacity

    def give_back(self, pipe: tuple[int, int, int]) -> None:
        """Return an empty pipe."""
        if len(self._free) < self._keep:
            self._free.append(pipe)
        else:
            _close_pipe(pipe)

    def close(self) -> None:
        for pipe in self._free:
            _close_pipe(pipe)
        self._free.clear()


def _close_pipe(pipe: tuple[int, int, int]) -> None:
    os.close(pipe[0])
    os.close(pipe[1])


class SpliceFailed(Exception):
    """A splice ended early; `side` says which connection failed ("broker" or "client")."""

    def __init__(self, side: str, reason: str) -> None:
        super().__init__(f"{side}: {reason}")
        self.side = side
        self.reason = reason


class Splice:
    """Moves exactly `size` bytes from `src` (a socket's descriptor) to `dst`'s socket, then calls
    `done(None)`; on a failure it calls `done(SpliceFailed)`. `cancel()` stops it without a call.

    The bytes go to the client only once `dst`'s transport has written everything it holds, so
    they come after what was written to it before. `dst` is the client transport, asked for its
    write buffer size; nothing may be written to it until `done` is called."""

    __slots__ = ("_loop", "_pool", "_src", "_dst", "_dst_transport", "_pipe", "_to_read", "_in_pipe",
                 "_reading", "_writing", "_done", "moved")

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: PipePool, src_fd: int, dst_fd: int,
                 dst_transport: Any, size: int, done: Callable[[SpliceFailed | None], None]) -> None:
        """Raises OSError when the descriptors or the pipe cannot be had (too many open files):
        the caller then copies the bytes the ordinary way."""
        self._loop = loop
        self._pool = pool
        self._pipe = pool.take()
        # The loop refuses to watch a descriptor a transport owns (add_reader), so the splice
        # watches duplicates of the two sockets' descriptors, closed when it ends.
        try:
            self._src = os.dup(src_fd)
            try:
                self._dst = os.dup(dst_fd)
            except OSError:
                os.close(self._src)
                raise
        except OSError:
            pool.give_back(self._pipe)
            raise
        self._dst_transport = dst_transport
        self._to_read = size  # bytes still in the broker's socket (or on their way)
        self._in_pipe = 0
        self._reading = False  # registered with the loop for the broker socket's readability
        self._writing = False  # and for the client socket's writability
        self._done: Callable[[SpliceFailed | None], None] | None = done
        self.moved = 0  # bytes written to the client so far

    def start(self) -> None:
        self._pump()

    def _pump(self) -> None:
        """Move what can be moved now; then wait for whichever socket holds things up."""
        pipe_r, pipe_w, capacity = self._pipe
        while True:
            progress = False
            want_read = want_write = False
            if self._to_read and self._in_pipe < capacity:
                room = capacity - self._in_pipe
                try:
                    n = os.splice(self._src, pipe_w, min(self._to_read, room), flags=_FLAGS)
                except BlockingIOError:
                    # Nothing to read, or a pipe full of partly filled pages: if the pipe holds
                    # anything, emptying it is what comes next, so wait only for that then.
                    want_read = not self._in_pipe
                except OSError as exc:
                    self._finish(SpliceFailed("broker", exc.strerror or str(exc)))
                    return
                else:
                    if n == 0:
                        self._finish(SpliceFailed("broker", "connection closed mid-response"))
                        return
                    self._to_read -= n
                    self._in_pipe += n
                    progress = True
            if self._in_pipe:
                if self._dst_transport.get_write_buffer_size():
                    want_write = True  # earlier writes still queued in the transport go first
                else:
                    flags = _FLAGS | _MORE if self._to_read else _FLAGS
                    try:
                        n = os.splice(pipe_r, self._dst, self._in_pipe, flags=flags)
                    except BlockingIOError:
                        want_write = True
                    except OSError as exc:
                        self._finish(SpliceFailed("client", exc.strerror or str(exc)))
                        return
                    else:
                        self._in_pipe -= n
                        self.moved += n
                        progress = progress or n > 0
            if not self._to_read and not self._in_pipe:
                self._finish(None)
                return
            if not progress:
                self._watch(want_read, want_write)
                return

    def _watch(self, read: bool, write: bool) -> None:
        loop = self._loop
        if read != self._reading:
            if read:
                loop.add_reader(self._src, self._pump)
            else:
                loop.remove_reader(self._src)
            self._reading = read
        if write != self._writing:
            if write:
                loop.add_writer(self._dst, self._pump)
            else:
                loop.remove_writer(self._dst)
            self._writing = write

    def _finish(self, failure: SpliceFailed | None) -> None:
        done = self._done
        self._release(clean=failure is None)
        if done is not None:
            done(failure)

    def cancel(self) -> None:
        """Stop without calling `done` (the connection is going away)."""
        self._release(clean=False)

    def _release(self, clean: bool) -> None:
        if self._done is None:
            return
        self._done = None
        self._watch(False, False)
        os.close(self._src)
        os.close(self._dst)
        if clean and not self._in_pipe:
            self._pool.give_back(self._pipe)
        else:
            _close_pipe(self._pipe)  # it may hold bytes no one will read
