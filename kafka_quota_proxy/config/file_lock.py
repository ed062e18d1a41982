"""An exclusive lock around a read-modify-write of a file that is replaced by rename.

The lock is on a sidecar, `<file>.lock`, never on the file itself: each atomic write gives the
file a new inode, so a lock taken on the old one would guard nothing once it is replaced. The
sidecar is never deleted either (a writer could lock a sidecar just unlinked while the next
one creates and locks a fresh one). flock(2) locks belong to the open file, so the kernel
drops the lock when its holder exits, killed or not.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the exclusive lock of `path` (waiting for it); OSError if the sidecar cannot be opened."""
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
