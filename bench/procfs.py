"""What the benchmarks read from /proc: a process's CPU, memory and descriptors, and the
machine's busy time and load, so a result can say what else was running."""

from __future__ import annotations

import os
from pathlib import Path

KIB = 1024
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, all its threads."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def syscalls(pid: int) -> tuple[int, int]:
    """(read, write) system calls a process has made so far (/proc/PID/io's syscr and syscw:
    read, readv, recv... and write, writev, send...)."""
    found = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(found["syscr"]), int(found["syscw"])


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy (not idle, not waiting for I/O)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / TICKS


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * KIB
    raise RuntimeError(f"no VmRSS for {pid}")


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
