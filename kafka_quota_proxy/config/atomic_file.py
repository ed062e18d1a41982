"""Writing a file so that a crash or a concurrent reader never sees half of it.

Temp file in the same directory, fsync, rename over the old file, fsync the directory: a reader
(a proxy reloading the file, a restart after a crash) finds the old content or the new.

A writer killed between creating its temp file and the rename leaves the temp file behind. Its
name carries the writer's process id (`.<name>.<pid>.<random>.tmp`), so the next write removes
the temp files of writers that are no longer running; readers never look at them.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str, mode: int | None = None) -> None:
    """Replace `path` with `text`; raise OSError (the old file intact, no temp file left)."""
    remove_leftovers(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.",
                                    suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        raise
    _fsync_directory(path.parent)


def leftovers(path: Path) -> list[Path]:
    """Temp files of earlier writes of `path` whose writer is no longer running."""
    prefix, found = f".{path.name}.", []
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            found.append(path.parent / name)
    return found


def remove_leftovers(path: Path) -> None:
    for leftover in leftovers(path):
        try:
            leftover.unlink()
        except OSError:
            pass  # gone already, or not ours to remove: it is never read either way


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable. Not every platform can open a directory (Windows)."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory; the rename has still happened
    finally:
        os.close(dir_fd)
