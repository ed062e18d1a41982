"""Whether a request body parses by its schema, checked without decoding it.

A broker parses every request whole before acting on it, and refuses one that does not parse.
The proxy forwards most requests after reading their header alone, so this is the broker's
parser's check, done first: the body is walked by the request's schema (compiled once per API
and version from Kafka's message JSON, as kafka-python ships it) and refused where Kafka's own
generated parsers refuse it:

- an array count larger than the bytes left ("Tried to allocate a collection of size ...");
- a string, bytes or records length that runs past the bytes left, or a string over 32,767 bytes;
- a null (length -1) where the schema allows none at that version, or any other negative length.

A tagged field the schema knows must fit in its own size. Bytes after the body are left alone,
as Kafka leaves them: librdkafka writes the null topics array of Metadata v9+ in 4 bytes where
the varint takes 1 (confluentinc/librdkafka#5049), so its "all topics" request ends 3 bytes
after the body, and Kafka answers it. Records are skipped by their length, never read. A body
that passes need not make sense (a partition count of a billion); every length in it is true.

Each (API, version) is compiled to one Python function with the walk unrolled (kafka-python
generates its codecs the same way): a closure per field cost about four microseconds per Produce
request, twice what reading its header costs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from kafka_quota_proxy.protocol.apis import message_json
from kafka_quota_proxy.protocol.errors import MalformedMessage, ProtocolError, TruncatedMessage
from kafka_quota_proxy.protocol.headers import RequestHeader
from kafka_quota_proxy.protocol.primitives import INT16, INT32
from kafka_quota_proxy.protocol.walk import in_versions, inline_fields

# (buffer, position, end) -> the position after what it checked; a ProtocolError if it is not there.
Check = Callable[[memoryview, int, int], int]

_FIXED = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
          "int64": 8, "float64": 8, "uuid": 16}
STRING_MAX = 0x7FFF  # Kafka: "string field ... had invalid length"


def _short(name: str, pos: int, end: int) -> NoReturn:
    raise TruncatedMessage(f"{name}: runs past the end ({max(end - pos, 0)} bytes were left)")


def _collection(name: str, n: int, left: int) -> NoReturn:
    raise TruncatedMessage(f"{name}: an array of {n}, {left} bytes left")


def _length(name: str, n: int) -> NoReturn:
    raise MalformedMessage(f"{name}: length {n}")


def _null(name: str, n: int) -> NoReturn:
    if n != -1:
        _length(name, n)
    raise MalformedMessage(f"{name}: null in a field that is not nullable")


def _uvarint(buf: memoryview, pos: int, end: int, name: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end:
            _short(name, pos, end)
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise MalformedMessage(f"{name}: varint longer than 5 bytes")


def _tagged_fields(name: str, known: dict[int, Check]) -> Check:
    """A tagged-field section: a count, then (tag, size, value) each; a known tag's value must
    fit in its size, an unknown one is skipped by it."""
    def check(buf: memoryview, pos: int, end: int) -> int:
        count, pos = _uvarint(buf, pos, end, name)
        if count > end - pos:
            _collection(name, count, end - pos)
        for _ in range(count):
            tag, pos = _uvarint(buf, pos, end, name)
            size, pos = _uvarint(buf, pos, end, name)
            stop = pos + size
            if stop > end:
                _short(f"{name}, tag {tag}", pos, end)
            value = known.get(tag)
            if value is not None:
                value(buf, pos, stop)
            pos = stop
        return pos
    return check


class _Source:
    """The body of one check function, written field by field from the schema."""

    def __init__(self, version: int, flexible: bool) -> None:
        self.version = version
        self.flexible = flexible
        self.lines: list[str] = []
        self.names: dict[str, Any] = {"_short": _short, "_collection": _collection, "_length": _length,
                                      "_null": _null, "_uvarint": _uvarint, "_i16": INT16.unpack_from,
                                      "_i32": INT32.unpack_from}
        self.fixed = 0  # bytes of fixed-size fields not yet added to pos
        self.fixed_name = ""

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def constant(self, value: Any) -> str:
        key = f"_c{len(self.names)}"
        self.names[key] = value
        return key

    def flush(self, indent: int) -> None:
        if self.fixed:
            self.emit(indent, f"pos += {self.fixed}")
            self.emit(indent, f"if pos > end: _short({self.fixed_name!r}, pos - {self.fixed}, end)")
            self.fixed = 0

    def count(self, indent: int, var: str, compact: bool, wide: bool, name: str) -> None:
        """`var` = a length or count; a compact one is a varint of the value + 1."""
        if compact:
            self.emit(indent, f"if pos >= end: _short({name!r}, pos, end)")
            self.emit(indent, f"{var} = buf[pos]")
            self.emit(indent, f"if {var} < 0x80: pos += 1")
            self.emit(indent, f"else: {var}, pos = _uvarint(buf, pos, end, {name!r})")
            self.emit(indent, f"{var} -= 1")
        else:
            width = 4 if wide else 2
            self.emit(indent, f"if pos + {width} > end: _short({name!r}, pos, end)")
            self.emit(indent, f"{var} = _i{width * 8}(buf, pos)[0]")
            self.emit(indent, f"pos += {width}")

    def null_or(self, indent: int, var: str, nullable: bool, name: str) -> int:
        """Open the branch for a length that is not null; return its indent."""
        self.emit(indent, f"if {var} < 0:")
        refused = f"if {var} != -1: _length({name!r}, {var})" if nullable else f"_null({name!r}, {var})"
        self.emit(indent + 1, refused)
        self.emit(indent, "else:")
        return indent + 1

    def sized(self, indent: int, depth: int, name: str, compact: bool, wide: bool, nullable: bool) -> None:
        """A string (int16 length), or bytes and records (int32 length)."""
        var = f"n{depth}"
        self.count(indent, var, compact, wide, name)
        inner = self.null_or(indent, var, nullable, name)
        if not wide:
            self.emit(inner, f"if {var} > {STRING_MAX}: _length({name!r}, {var})")
        self.emit(inner, f"pos += {var}")
        self.emit(inner, f"if pos > end: _short({name!r}, pos - {var}, end)")

    def field(self, f: dict[str, Any], indent: int, depth: int, path: str) -> None:
        ftype: str = f["type"]
        name = path + f["name"]
        if ftype in _FIXED:
            if not self.fixed:
                self.fixed_name = name
            self.fixed += _FIXED[ftype]
            return
        self.flush(indent)
        version = self.version
        compact = in_versions(f["flexibleVersions"], version) if "flexibleVersions" in f else self.flexible
        nullable = in_versions(f.get("nullableVersions"), version)
        if ftype in ("string", "bytes", "records"):
            self.sized(indent, depth, name, compact, ftype != "string", nullable)
        elif ftype.startswith("[]"):
            self.array(f, indent, depth, name, compact, nullable)
        elif "fields" in f:
            if nullable:  # an int8 marker, negative for null, as Kafka reads it
                self.emit(indent, f"if pos >= end: _short({name!r}, pos, end)")
                self.emit(indent, "pos += 1")
                self.emit(indent, "if not buf[pos - 1] & 0x80:")
                self.struct(f["fields"], indent + 1, depth + 1, name + ".")
                self.emit(indent + 1, "pass")
            else:
                self.struct(f["fields"], indent, depth, name + ".")
        else:
            raise ValueError(f"{name}: unknown field type {ftype}")

    def array(self, f: dict[str, Any], indent: int, depth: int, name: str, compact: bool,
              nullable: bool) -> None:
        var = f"n{depth}"
        self.count(indent, var, compact, True, name)
        inner = self.null_or(indent, var, nullable, name)
        # Every element takes a byte at least: Kafka refuses a count beyond the bytes left.
        self.emit(inner, f"if {var} > end - pos: _collection({name!r}, {var}, end - pos)")
        element = f["type"][2:]
        if element in _FIXED:
            size = _FIXED[element]
            self.emit(inner, f"pos += {var} * {size}")
            self.emit(inner, f"if pos > end: _short({name!r}, pos - {var} * {size}, end)")
            return
        self.emit(inner, f"for _ in range({var}):")
        if element == "string":
            self.sized(inner + 1, depth + 1, name + "[]", compact, False, False)
        else:
            self.struct(f["fields"], inner + 1, depth + 1, name + "[].")
            self.emit(inner + 1, "pass")

    def struct(self, fields: Any, indent: int, depth: int, path: str) -> None:
        for f in inline_fields(fields, self.version, self.flexible):
            self.field(f, indent, depth, path)
        self.flush(indent)
        if not self.flexible:
            return
        version = self.version
        known = {f["tag"]: _compile_field(f, version, self.flexible, path)
                 for f in fields if "tag" in f and in_versions(f.get("versions"), version)
                 and in_versions(f.get("taggedVersions"), version)}
        name = (path.rstrip(".") or "body") + " tagged fields"
        tags = self.constant(_tagged_fields(name, known))
        self.emit(indent, f"if pos >= end: _short({name!r}, pos, end)")
        self.emit(indent, f"if buf[pos]: pos = {tags}(buf, pos, end)")  # nearly always none
        self.emit(indent, "else: pos += 1")

    def function(self, label: str) -> Check:
        source = "def check(buf, pos, end):\n" + "\n".join(self.lines) + "\n    return pos\n"
        code = compile(source, f"<well_formed:{label}>", "exec")
        exec(code, self.names)  # noqa: S102 - source written above from the schema, nothing else
        return self.names["check"]  # type: ignore[no-any-return]


def _compile_field(f: dict[str, Any], version: int, flexible: bool, path: str) -> Check:
    """The check of one field on its own (a tagged field's value)."""
    src = _Source(version, flexible)
    src.field(f, 1, 0, path)
    src.flush(1)
    return src.function(path + f["name"])


def compile_check(message: str, version: int, flexible: bool) -> Check:
    """The check of a whole message body, from its schema (kafka-python's copy of Kafka's JSON)."""
    src = _Source(version, flexible)
    src.struct(message_json(message)["fields"], 1, 0, "")
    return src.function(f"{message}v{version}")


_compiled: dict[tuple[int, int], Check] = {}


def check_request(frame: memoryview, header: RequestHeader) -> None:
    """Raise a ProtocolError (TruncatedMessage or MalformedMessage) naming the field, unless the
    body of the request `frame` (whose header is `header`) parses by its schema."""
    spec = header.spec
    if spec is None:
        return  # a newer ApiVersions than the codec knows: the proxy answers it itself
    key = (header.api_key, header.api_version)
    check = _compiled.get(key)
    if check is None:
        version = header.api_version
        check = _compiled[key] = compile_check(spec.request.name, version, spec.is_flexible(version))
    try:
        check(frame, header.body_offset, len(frame))
    except ProtocolError as exc:
        raise type(exc)(f"{spec.name} v{header.api_version}: {exc}") from None
