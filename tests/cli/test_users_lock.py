"""`kafka-quota-proxy users add` run many at once, and killed mid-run: real processes on one
credentials file (devkit/proxy_faults/file_kills.py; docs/identity.md)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from devkit.proxy_faults.file_kills import cli_kills, concurrent_adds
from kafka_quota_proxy.config.atomic_file import write_atomically
from kafka_quota_proxy.config.file_lock import lock_path, locked


def _try_lock(path: Path) -> bool:
    """Whether another open file could take the lock now."""
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_the_lock_is_on_a_sidecar_and_holds_across_a_replace_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    write_atomically(path, "version: 1\n")
    with locked(path):
        write_atomically(path, "version: 1\nusers: []\n")  # a new inode for the file itself
        assert not _try_lock(path)
    assert _try_lock(path)
    assert lock_path(path) == tmp_path / "users.yaml.lock"


@pytest.mark.slow
def test_users_added_at_the_same_instant_are_all_kept(tmp_path: Path) -> None:
    # Without the lock, 1 or 2 of 10 (or of 20) were left: each run wrote what it had read.
    assert concurrent_adds(tmp_path, 10) == sorted(f"user{i}" for i in range(10))


@pytest.mark.slow
def test_users_add_killed_mid_run_leaves_the_file_whole(tmp_path: Path) -> None:
    report = cli_kills(tmp_path, 8, seed=3)
    assert report.torn == [], report
    assert report.whole == report.kills == 8
    assert report.leftovers_end == 0
