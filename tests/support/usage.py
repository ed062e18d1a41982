"""Reading a usage log in tests, without Spark."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def usage_records(directory: Path, instance: str) -> list[dict[str, Any]]:
    """Every record of one instance's usage log under `directory`, in hour order: the current
    hour's plain file and the closed hours' gzipped ones. A run that crosses a UTC hour has both
    (reading the plain files alone lost an hour's records in a CI run at 09:00)."""
    out: list[dict[str, Any]] = []
    for path in sorted(directory.rglob(f"usage-{instance}.jsonl*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            out += [json.loads(line) for line in f]
    return out


def topic_totals(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """The records' bytes per topic (usage_log.topics), summed over tenants and intervals."""
    out: dict[str, dict[str, int]] = {}
    for record in records:
        for topic, counts in record["topics"].items():
            mine = out.setdefault(topic, dict.fromkeys(counts, 0))
            for key, value in counts.items():
                mine[key] += value
    return out
