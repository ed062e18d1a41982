"""A message's schema as a newer Kafka might send it: every struct (the message itself, each
array element, each nested struct) gains tagged fields the proxy's own schema does not have.

A message drawn from the future schema (tests/support/messages.py draws tagged fields sometimes)
and encoded by kafka-python carries unknown tagged fields at every level, written by code that
knows nothing of the proxy's walker. A property test changes the same message as the proxy would
and encodes it the same way, which gives the bytes the proxy must produce: every unknown tag kept.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from kafka.protocol.data_container import DataContainer
from kafka.protocol.schemas import StructField

# One tag whose number takes one varint byte and one that takes two; no Kafka message uses either.
FUTURE_TAGS = (63, 200)


def _with_future_tags(fields: list[dict[str, Any]], flexible: str) -> list[dict[str, Any]]:
    out = []
    for field in fields:
        field = dict(field)
        if "fields" in field:
            field["fields"] = _with_future_tags(field["fields"], flexible)
        out.append(field)
    out += [{"name": f"Future{tag}", "type": "bytes", "versions": flexible, "taggedVersions": flexible,
             "tag": tag, "about": "a tagged field from a newer Kafka"} for tag in FUTURE_TAGS]
    return out


@cache
def future(cls: Any) -> Any:
    """A data class like kafka-python's `cls` whose schema has the future tagged fields in every
    struct of its flexible versions; encode its messages with `encode_future`."""
    spec = copy.deepcopy(cls._json)
    flexible = spec["flexibleVersions"]
    if flexible != "none":
        spec["fields"] = _with_future_tags(spec["fields"], flexible)
    struct = StructField(spec)
    struct._versions = (0, struct._versions[1])  # as kafka-python's message classes do
    return type(cls.__name__, (DataContainer,), {"_struct": struct, "flexible": cls.flexible_version_q})


def encode_future(msg: Any, version: int) -> bytes:
    flexible = type(msg).flexible(version)
    return bytes(msg.encode(version=version, compact=flexible, tagged=flexible))
