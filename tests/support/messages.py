"""Hypothesis strategies for whole Kafka messages, built from kafka-python's schemas.

`message(cls, version)` fills every field a message has at that version (tagged ones sometimes)
with values of its type, so a property test can encode a valid message of any API and version,
hand the bytes to the proxy's decoders, and compare field by field. The values come from the
schema kafka-python generates from Kafka's own message JSON; nothing here knows an API by name.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from hypothesis import strategies as st
from kafka.protocol.schemas.fields.codecs import (
    UUID,
    BitField,
    Boolean,
    Bytes,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    String,
    UnsignedInt16,
)

# Small enough that a hundred examples cost milliseconds, large enough to cross a varint's
# one-byte boundary (127) in compact lengths.
MAX_ITEMS = 3
MAX_TEXT = 20
MAX_BYTES = 140

_INTS = {Int8: 8, Int16: 16, Int32: 32, Int64: 64}


def _simple(field: Any, version: int, element: bool = False) -> st.SearchStrategy[Any]:
    codec = field._type
    # An array's elements are never null in Kafka, whatever the array is (its parser refuses a
    # null element); kafka-python gives the elements the array's nullability.
    nullable = field.nullable_for_version_q(version) and not element
    if codec in _INTS:
        bits = _INTS[codec]
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if codec is UnsignedInt16:
        return st.integers(0, 2**16 - 1)
    if codec is Boolean:
        return st.booleans()
    if codec is Float64:
        return st.floats(allow_nan=False)
    if codec is UUID:
        return st.uuids()  # None encodes as the zero UUID and decodes as it: not a round trip
    if codec is BitField:
        return st.none() | st.frozensets(st.integers(0, 30)).map(set)
    if isinstance(codec, String):
        text = st.text(max_size=MAX_TEXT)
        return st.none() | text if nullable else text
    if codec is Bytes:
        raw = st.binary(max_size=MAX_BYTES)
        return st.none() | raw if nullable else raw
    raise AssertionError(f"no strategy for {field.type_str}")


def _array(field: Any, version: int, element: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    items = st.lists(element, max_size=MAX_ITEMS)
    return st.none() | items if field.nullable_for_version_q(version) else items


def _field(field: Any, version: int) -> st.SearchStrategy[Any]:
    if field.is_struct_array():
        return _array(field, version, _struct(field.data_class, field, version))
    if field.is_array():
        return _array(field, version, _simple(field.array_of, version, element=True))
    if field.is_struct():
        inner = _struct(field.data_class, field, version)
        return st.none() | inner if field.nullable_for_version_q(version) else inner
    return _simple(field, version)


def _struct(cls: Any, struct: Any, version: int, top: bool = False) -> st.SearchStrategy[Any]:
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for f in struct.fields.values():
        if not f.for_version_q(version):
            continue
        (optional if f.tagged_field_q(version) else required)[f.name] = _field(f, version)
    values = st.fixed_dictionaries(required, optional=optional)
    if top:
        return values.map(lambda kw: cls(version=version, **kw))
    return values.map(lambda kw: cls(**kw))


@cache
def message(cls: Any, version: int) -> st.SearchStrategy[Any]:
    """A kafka-python message of class `cls` at `version`, every field drawn from its type."""
    return _struct(cls, cls._struct, version, top=True)


def encode(msg: Any, version: int) -> bytes:
    return bytes(msg.encode(version=version))


@cache
def has_nullable_struct(cls: Any, version: int) -> bool:
    """Whether a message has a nullable struct at `version`, at any depth. kafka-python reads
    its int8 marker as null only when it is -1 (0xff), Kafka's parsers (and the proxy's request
    check) when it is negative: bytes with another negative marker are read by kafka-python as
    a struct that is not there, and it may run out of bytes where Kafka would not."""
    def walk(struct: Any) -> bool:
        for f in struct.fields.values():
            if not f.for_version_q(version):
                continue
            if f.is_struct() and (f.nullable_for_version_q(version) or walk(f)):
                return True
            if f.is_struct_array() and walk(f.array_of):
                return True
        return False
    return walk(cls._struct)
