"""Linux's parent-death signal: a child the kernel signals when its parent dies, so that kill -9
of a supervisor leaves no worker (nor a store it started) running on its own."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask for `sig` when the parent dies (strictly: when the thread that started this process
    ends; the supervisor starts its children from its main thread). False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def die_with(parent_pid: int, sig: int = signal.SIGTERM) -> bool:
    """In a worker: `sig` when the supervisor `parent_pid` dies. False if it already has (it
    died before the request was in place, and the signal would never come)."""
    set_parent_death_signal(sig)
    return os.getppid() == parent_pid


def die_with_parent_in_child() -> None:  # pragma: no cover - runs between fork and exec
    """`preexec_fn` for a server binary the supervisor starts (the embedded store): SIGTERM
    when the supervisor dies. Only while the supervisor has no other thread (preexec_fn and
    threads do not mix), which is why it starts the store first."""
    set_parent_death_signal(signal.SIGTERM)
