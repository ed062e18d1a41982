"""Polling files for changes: the config, certificates and the credentials file reload in place.

Polling (not inotify) works on every filesystem and with files bind-mounted into containers,
where an editor or a secret rotation replaces the file rather than writing into it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence


def stamp(paths: Sequence[str]) -> tuple[tuple[int, int, int], ...] | None:
    """What changes when any of the files does; None while one of them is missing."""
    try:
        return tuple((st.st_mtime_ns, st.st_size, st.st_ino) for st in map(os.stat, paths))
    except OSError:
        return None


async def watch_files(paths: Sequence[str], poll_seconds: float, on_change: Callable[[], object]) -> None:
    """Call `on_change` each time the files change. A missing file is waited for, not reported:
    it is usually a replacement half done."""
    seen = stamp(paths)
    while True:
        await asyncio.sleep(poll_seconds)
        now = stamp(paths)
        if now is None or now == seen:
            continue
        seen = now
        on_change()
