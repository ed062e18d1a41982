"""A Hypothesis strategy that damages valid bytes the way a fuzzer does: bit flips, truncation,
inserted and deleted runs, and lengths overwritten with boundary values.

Arbitrary bytes rarely get past a decoder's first length check; bytes that were valid until
one change reach its deep branches, where the forgotten bounds checks are."""

from __future__ import annotations

from hypothesis import strategies as st

# Values a length or count field gets when it lies: null, zero, off by one, huge, negative.
_BOUNDARIES = [b"\x00", b"\xff", b"\x7f", b"\x80", b"\x00\x00", b"\xff\xff", b"\x7f\xff",
               b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00",
               b"\x00\x00\x00\x01", b"\xff\xff\xff\xff\x0f"]


@st.composite
def _mutate_once(draw: st.DrawFn, data: bytes) -> bytes:
    if not data:
        return draw(st.binary(min_size=1, max_size=8))
    at = draw(st.integers(0, len(data) - 1))
    kind = draw(st.sampled_from(["flip", "byte", "truncate", "insert", "delete", "boundary"]))
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1:]
    if kind == "byte":
        return data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    if kind == "truncate":
        return data[:at]
    if kind == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    if kind == "delete":
        return data[:at] + data[at + draw(st.integers(1, 8)):]
    value = draw(st.sampled_from(_BOUNDARIES))
    return data[:at] + value + data[at + len(value):]


@st.composite
def mutated(draw: st.DrawFn, data: bytes, max_mutations: int = 3) -> bytes:
    """`data` with one to `max_mutations` damages applied in turn."""
    for _ in range(draw(st.integers(1, max_mutations))):
        data = draw(_mutate_once(data))
    return data
