"""The `usage_log:` section: the per-tenant usage log (off unless `dir` is set).

    usage_log:
      dir: /var/lib/kafka-quota-proxy/usage   # where the hourly files go; no dir, no log
      interval_seconds: 10                    # one record per active tenant per interval
      instance: null                          # names this proxy in records and file names;
                                              # default: <host name>-<listen port>
      max_tenants: 100000                     # tenants kept per interval; the rest are counted
      queue_intervals: 360                    # intervals waiting for the writer (an hour)
      topics: false                           # also each tenant's bytes per topic (costs a walk
                                              # of every Produce and Fetch: docs/usage-log.md)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.validators import mapping, whole_number

_INSTANCE = re.compile(r"[A-Za-z0-9._-]{1,100}\Z")


@dataclass(frozen=True, slots=True)
class UsageLogSettings:
    """The `usage_log:` section: where and how often the usage log is written."""

    dir: str
    interval_seconds: int = 10
    instance: str | None = None
    max_tenants: int = 100_000
    queue_intervals: int = 360
    topics: bool = False


def parse_usage_log(raw: Any) -> UsageLogSettings | None:
    if raw is None:
        return None
    raw = mapping("usage_log", raw, "a mapping with at least `dir`")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        full = f"usage_log.{key}"
        if key == "dir":
            if not isinstance(value, str) or not value:
                raise ConfigError(full, "expected a directory path")
            values[key] = value
        elif key in ("interval_seconds", "max_tenants", "queue_intervals"):
            whole_number(full, value)
            if key == "interval_seconds" and 3600 % value:
                raise ConfigError(full, f"must divide an hour evenly (1, 2, 5, 10, 30, 60, ...), got {value}")
            values[key] = value
        elif key == "instance":
            if value is not None and (not isinstance(value, str) or not _INSTANCE.match(value)):
                raise ConfigError(full, "expected 1-100 letters, digits, '.', '_' or '-' "
                                        "(it is part of file names)")
            values[key] = value
        elif key == "topics":
            if not isinstance(value, bool):
                raise ConfigError(full, f"expected true or false, got {value!r}")
            values[key] = value
        else:
            raise ConfigError(full, "unknown key (known: dir, interval_seconds, instance, max_tenants, "
                                    "queue_intervals, topics)")
    if "dir" not in values:
        raise ConfigError("usage_log.dir", "required: where to write the usage log")
    return UsageLogSettings(**values)
