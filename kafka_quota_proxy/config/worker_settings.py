"""`workers:`, the number of worker processes on one host, and the role a supervisor hands each
worker it starts (an internal setting: never read from a file, never typed by a user)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.validators import whole_number

MAX_WORKERS = 1024  # a sanity bound: a typo of 20000 should not fork 20,000 interpreters
WORKER_ROLE_FLAG = "--worker-role"  # hidden: the supervisor's command line for each worker


def parse_workers(key: str, value: Any) -> int:
    """A whole number of worker processes, 1..MAX_WORKERS; a flag's text "2" counts as 2."""
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        value = int(value)
    count = whole_number(key, value)
    if count > MAX_WORKERS:
        raise ConfigError(key, f"expected at most {MAX_WORKERS} workers, got {value!r}")
    return count


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """What makes a proxy process one of a supervisor's workers: which one (index of count),
    whom to die with, where to serve its metrics for the supervisor to merge, and the quota
    store the workers share (None until one is wired)."""

    index: int
    count: int
    supervisor_pid: int
    metrics_socket: str
    store_url: str | None = None

    @property
    def name(self) -> str:
        """"w0", "w1", ...: the worker's tag in log lines and usage-log instance names."""
        return f"w{self.index}"

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def parse_worker_role(text: str) -> WorkerRole:
    try:
        raw = json.loads(text)
        role = WorkerRole(**raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(WORKER_ROLE_FLAG, f"internal: not a worker role ({exc})") from None
    if not 0 <= role.index < role.count:
        raise ConfigError(WORKER_ROLE_FLAG, f"internal: worker {role.index} of {role.count}")
    return role
