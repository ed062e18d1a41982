"""The summary of one analysis run: what it read and found, and how long each stage took."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass
class Summary:
    """What a run read and found, and how long each stage took; also written as summary.json."""

    usage: str
    out: str
    lines: int = 0
    bad_lines: int = 0
    records: int = 0
    tenants: int = 0
    users: int = 0
    topics: int = 0
    first_ms: int = 0
    end_ms: int = 0
    window_num: int = 11
    window_size_seconds: int = 1
    current: str = "the quotas recorded in the log"
    candidate: str = "the recommended quotas"
    seconds: dict[str, float] = field(default_factory=dict)
    replay: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"
