"""write_atomically: the order of its system calls, the temp files of killed writers, and the
quota state and credentials files read after writers were killed mid-write
(devkit/proxy_faults/file_kills.py; docs/reliability.md, "Proxy faults")."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.proxy_faults.file_kills import fork_kills
from kafka_quota_proxy.config.atomic_file import write_atomically


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_temp_files_of_dead_writers_are_removed_by_the_next_write(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    dead = _dead_pid()
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as alive:
        try:
            names = [f".state.json.{dead}.ab12cd.tmp",  # a killed writer's
                     f".state.json.{alive.pid}.ef34gh.tmp",  # a writer still writing
                     ".state.json.xy56zw.tmp",  # an older version's name, without a pid
                     f".other.json.{dead}.ab12cd.tmp"]  # another file's
            for name in names:
                (tmp_path / name).write_text("half")
            write_atomically(target, "whole\n")
            assert target.read_text() == "whole\n"
            assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:] + ["state.json"])
        finally:
            alive.kill()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_the_file_is_synced_then_renamed_then_the_directory_synced(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    target = tmp_path / "d" / "state.json"
    target.parent.mkdir()
    code = ("from pathlib import Path; from kafka_quota_proxy.config.atomic_file import write_atomically; "
            f"write_atomically(Path({str(target)!r}), 'x' * 100)")
    run = subprocess.run(["strace", "-f", "-o", str(trace), "-e",
                          "trace=openat,write,fsync,fdatasync,rename,renameat,renameat2,close",
                          sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    if run.returncode != 0 and "ptrace" in run.stderr:
        pytest.skip(f"strace cannot trace here: {run.stderr.strip()[:200]}")
    assert run.returncode == 0, run.stderr
    calls = [re.sub(r"^\d+\s+", "", line) for line in trace.read_text().splitlines()]  # "<pid>  <call>"

    def first(pattern: str, after: int = -1) -> int:
        return next(i for i, c in enumerate(calls) if i > after and re.match(pattern, c))

    def fd(at: int) -> str:
        return calls[at].rsplit("= ", 1)[1]

    d = re.escape(str(target.parent))
    opened = first(rf'openat\(AT_FDCWD, "{d}/\.state\.json\.\d+\..*\.tmp", .*O_EXCL')
    wrote = first(rf'write\({fd(opened)}, "xxx', opened)
    synced = first(rf"fsync\({fd(opened)}\)\s+= 0", wrote)
    renamed = first(rf'rename(at2?)?\(.*"{d}/state\.json".*= 0', synced)
    dir_opened = first(rf'openat\(AT_FDCWD, "{d}", O_RDONLY', renamed)
    dir_synced = first(rf"fsync\({fd(dir_opened)}\)\s+= 0", dir_opened)
    assert opened < wrote < synced < renamed < dir_opened < dir_synced


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "kills"), [("quota-state", 100), ("credentials", 40)])
def test_a_writer_killed_mid_write_leaves_the_old_or_the_new_file_whole(
        tmp_path: Path, kind: str, kills: int) -> None:
    report = fork_kills(kind, tmp_path, kills, seed=7)
    assert report.torn == [], report
    assert report.whole == report.kills == kills
    assert report.versions_finished >= kills // 10, report  # the kills fell all over the writes
    assert report.leftovers_max <= 1, report  # a killed writer's temp file, gone at the next write
    assert report.leftovers_end == 0


@pytest.mark.slow
def test_the_check_catches_a_file_written_in_place(tmp_path: Path) -> None:
    # The same kills against a writer that truncates and rewrites the file: torn files found,
    # so the check above can fail.
    report = fork_kills("naive", tmp_path, 40, seed=7)
    assert report.torn != []
