"""bench/procfs.py's readings of a process, on this test's own process."""

from __future__ import annotations

import os

from bench.procfs import cpu_seconds, cpu_split, syscalls


def test_user_and_system_cpu_add_up_to_the_process_cpu() -> None:
    user, system = cpu_split(os.getpid())
    assert user > 0 and system >= 0
    assert abs(cpu_seconds(os.getpid()) - (user + system)) < 0.05  # read a moment apart


def test_each_read_and_write_is_counted_as_a_system_call() -> None:
    r, w = os.pipe()
    try:
        reads, writes = syscalls(os.getpid())
        for _ in range(10):
            os.write(w, b"x")
            os.read(r, 1)
        after_reads, after_writes = syscalls(os.getpid())
        # 10 each, and the read of /proc/PID/io itself (an open, reads) between the two readings
        assert after_writes - writes == 10
        assert 10 <= after_reads - reads <= 14
    finally:
        os.close(r)
        os.close(w)
