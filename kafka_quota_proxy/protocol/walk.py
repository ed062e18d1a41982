"""Walking a message's bytes by its schema without decoding it.

Produce and Fetch responses are never decoded on the hot path, yet the proxy must find fields
that sit after variable-length data: Produce's throttle_time_ms follows the partition results,
and KIP-951's node_endpoints is a tagged field at the very end of both responses. A `Walker`
is compiled once per (message, version) from Kafka's message JSON and skips over each field by
its length prefix, so records are jumped over, never copied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from kafka_quota_proxy.protocol.apis import codec, message_json
from kafka_quota_proxy.protocol.errors import MalformedMessage
from kafka_quota_proxy.protocol.primitives import (
    INT16,
    INT32,
    need,
    read_length,
    read_uvarint,
    skip_tagged_fields,
)

Skip = Callable[[memoryview, int], int]

_FIXED = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
          "int64": 8, "float64": 8, "uuid": 16}


def _versions(spec: str | None) -> tuple[int, int] | None:
    if spec is None or spec.strip() == "" or spec.strip() == "none":
        return None
    if spec.endswith("+"):
        return int(spec[:-1]), 1 << 15
    lo, _, hi = spec.partition("-")
    return int(lo), int(hi or lo)


def in_versions(spec: str | None, version: int) -> bool:
    r = _versions(spec)
    return r is not None and r[0] <= version <= r[1]


def _skip_fixed(n: int) -> Skip:
    def skip(buf: memoryview, pos: int) -> int:
        need(buf, pos, n)
        return pos + n
    return skip


def _skip_sized(compact: bool, wide: bool) -> Skip:
    """string (int16 length) or bytes/records (int32 length), or their compact forms."""
    def skip(buf: memoryview, pos: int) -> int:
        if compact:
            n, pos = read_uvarint(buf, pos)
            n -= 1
        else:
            need(buf, pos, 4 if wide else 2)
            n = (INT32 if wide else INT16).unpack_from(buf, pos)[0]
            pos += 4 if wide else 2
        if n < 0:
            if n != -1:
                raise MalformedMessage(f"length {n}")
            return pos
        need(buf, pos, n)
        return pos + n
    return skip


def _skip_array(compact: bool, element: Skip) -> Skip:
    def skip(buf: memoryview, pos: int) -> int:
        if compact:
            n, pos = read_uvarint(buf, pos)
            n -= 1
        else:
            need(buf, pos, 4)
            n = INT32.unpack_from(buf, pos)[0]
            pos += 4
        if n < -1:
            raise MalformedMessage(f"array length {n}")
        for _ in range(n):
            pos = element(buf, pos)
        return pos
    return skip


def _field_skip(field: dict[str, Any], version: int, flexible: bool) -> Skip:
    ftype: str = field["type"]
    compact = flexible
    if "flexibleVersions" in field:
        compact = in_versions(field["flexibleVersions"], version)
    if ftype.startswith("[]"):
        inner = ftype[2:]
        if inner in _FIXED:
            elem = _skip_fixed(_FIXED[inner])
        elif inner == "string":
            elem = _skip_sized(compact, wide=False)
        else:
            elem = _struct_skip(tuple(field["fields"]), version, flexible)
        return _skip_array(compact, elem)
    if ftype in _FIXED:
        return _skip_fixed(_FIXED[ftype])
    if ftype == "string":
        return _skip_sized(compact, wide=False)
    if ftype in ("bytes", "records"):
        return _skip_sized(compact, wide=True)
    if "fields" in field:
        return _struct_skip(tuple(field["fields"]), version, flexible)
    raise ValueError(f"unknown field type {ftype}")


def inline_fields(fields: Any, version: int, flexible: bool) -> list[dict[str, Any]]:
    return [f for f in fields if in_versions(f.get("versions"), version)
            and not (flexible and in_versions(f.get("taggedVersions"), version) and "tag" in f)]


def _coalesced(fields: list[dict[str, Any]], version: int, flexible: bool) -> list[Skip]:
    """The skips of `fields` in order, each run of adjacent fixed-size fields made one skip: a
    closure call per field was most of a ShareFetch partition's walk."""
    steps: list[Skip] = []
    run = 0
    for f in fields:
        size = _FIXED.get(f["type"])
        if size is not None:
            run += size
            continue
        if run:
            steps.append(_skip_fixed(run))
            run = 0
        steps.append(_field_skip(f, version, flexible))
    if run:
        steps.append(_skip_fixed(run))
    return steps


def _skip_tags(buf: memoryview, pos: int) -> int:
    """A tagged-field section; the usual empty one read in line."""
    if pos < len(buf) and buf[pos] == 0:
        return pos + 1
    return skip_tagged_fields(buf, pos)


def _struct_skip(fields: tuple[Any, ...], version: int, flexible: bool) -> Skip:
    steps = _coalesced(inline_fields(fields, version, flexible), version, flexible)

    def skip(buf: memoryview, pos: int) -> int:
        for step in steps:
            pos = step(buf, pos)
        if flexible:
            pos = _skip_tags(buf, pos)
        return pos
    return skip


@dataclass(slots=True)
class WalkResult:
    """Where a message's (or one struct element's) in-line fields, its tagged fields and its end are."""

    offsets: dict[str, int]  # in-line field name -> offset of its first byte, in field order
    tags_at: int  # offset of the tagged-field section, or the end if not flexible
    end: int

    @property
    def start(self) -> int:
        return next(iter(self.offsets.values()), self.tags_at)

    def span(self, name: str) -> tuple[int, int]:
        """(start, end) of an in-line field: it ends where the next field (or the tags) starts."""
        start = self.offsets[name]
        later = [at for at in self.offsets.values() if at > start]
        return start, min(later, default=self.tags_at)


class Layout:
    """A struct's in-line fields for one version: walks one element of it and says where each
    field starts, and gives the layout of an array field's elements, so that a rewrite can
    replace a few fields' bytes and keep every other byte (unknown tagged fields included)."""

    def __init__(self, fields: Any, version: int, flexible: bool) -> None:
        self.version = version
        self.flexible = flexible
        inline = inline_fields(fields, version, flexible)
        self._json = {f["name"]: f for f in inline}
        self._names = [f["name"] for f in inline]
        self._steps = [_field_skip(f, version, flexible) for f in inline]
        self._items: dict[str, Layout] = {}

    def walk(self, buf: memoryview, pos: int) -> WalkResult:
        offsets: dict[str, int] = {}
        for name, step in zip(self._names, self._steps, strict=True):
            offsets[name] = pos
            pos = step(buf, pos)
        tags_at = pos
        if self.flexible:
            pos = skip_tagged_fields(buf, pos)
        return WalkResult(offsets, tags_at, pos)

    def walk_to(self, buf: memoryview, pos: int, last: str) -> WalkResult:
        """Walk only as far as the field `last`: the offsets of it and of the fields before it,
        and `tags_at` and `end` where it ends. For a change to `last` and what precedes it, the
        rest passing as it came, unread (Metadata's topics after its brokers, say)."""
        offsets: dict[str, int] = {}
        for name, step in zip(self._names, self._steps, strict=True):
            offsets[name] = pos
            pos = step(buf, pos)
            if name == last:
                return WalkResult(offsets, pos, pos)
        raise ValueError(f"no field {last}")

    def around(self, name: str) -> tuple[Skip, Skip]:
        """Two skips for a walk that goes into the field `name` itself (an array, element by
        element, as ShareFetch's topics and partitions are walked): one over the fields before
        it, one from its end over the fields after it and the tagged fields, to the struct's end.
        So the struct is walked once, and nothing is kept of the fields on either side."""
        at = self._names.index(name)
        inline = [self._json[n] for n in self._names]
        before = _coalesced(inline[:at], self.version, self.flexible)
        after = _coalesced(inline[at + 1:], self.version, self.flexible)
        flexible = self.flexible

        def skip_before(buf: memoryview, pos: int) -> int:
            for step in before:
                pos = step(buf, pos)
            return pos

        def skip_after(buf: memoryview, pos: int) -> int:
            for step in after:
                pos = step(buf, pos)
            return _skip_tags(buf, pos) if flexible else pos
        return skip_before, skip_after

    def field_names(self) -> list[str]:
        """The in-line fields, in the order they lie."""
        return list(self._names)

    def field_type(self, name: str) -> str:
        return str(self._json[name]["type"])

    def nullable(self, name: str) -> bool:
        """Whether a field may be null (length -1) at this version."""
        return in_versions(self._json[name].get("nullableVersions"), self.version)

    def compact(self, name: str) -> bool:
        """Whether a field's length or count prefix is a compact (varint) one."""
        field = self._json[name]
        if "flexibleVersions" in field:
            return in_versions(field["flexibleVersions"], self.version)
        return self.flexible

    def items(self, name: str) -> Layout:
        """The layout of the elements of an array-of-structs field."""
        found = self._items.get(name)
        if found is None:
            field = self._json[name]
            if not field["type"].startswith("[]") or "fields" not in field:
                raise ValueError(f"{name} is not an array of structs")
            found = self._items[name] = Layout(tuple(field["fields"]), self.version, self.flexible)
        return found

    def elements(self, buf: memoryview, at: WalkResult, name: str) -> list[WalkResult]:
        """Each element of the array-of-structs field `name` of the struct walked as `at`; none
        for a null array."""
        n, pos = read_length(buf, at.offsets[name], self.compact(name))
        if n < -1:
            raise MalformedMessage(f"array length {n}")
        layout = self.items(name)
        found = []
        for _ in range(n):
            element = layout.walk(buf, pos)
            found.append(element)
            pos = element.end
        return found


class Walker(Layout):
    """Finds the offsets of a message's top-level fields and of its tagged-field section."""

    def __init__(self, message: str, version: int, flexible: bool) -> None:
        super().__init__(message_json(message)["fields"], version, flexible)

    def walk(self, buf: memoryview, pos: int) -> WalkResult:
        result = super().walk(buf, pos)
        if result.end != len(buf):
            raise MalformedMessage(f"{len(buf) - result.end} trailing bytes after the message")
        return result


def tagged_fields(buf: memoryview, pos: int) -> dict[int, tuple[int, int]]:
    """Tag -> (start, end) of each field in the tagged-field section at `pos`."""
    found: dict[int, tuple[int, int]] = {}
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        need(buf, pos, size)
        found[tag] = (pos, pos + size)
        pos += size
    return found


@cache
def walker(message: str, version: int, flexible: bool) -> Walker:
    return Walker(message, version, flexible)


def request_walker(api_key: int, version: int) -> Walker:
    """The walker of an API's request at a version."""
    spec = codec()[api_key]
    return walker(spec.request.name, version, spec.is_flexible(version))


def response_walker(api_key: int, version: int) -> Walker:
    """The walker of an API's response at a version."""
    spec = codec()[api_key]
    return walker(spec.response.name, version, spec.is_flexible(version))
