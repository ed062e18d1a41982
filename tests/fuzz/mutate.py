"""Plain-Python mutations of corpus inputs, for the replay in `make test` and the whole-proxy fuzz
(no atheris needed): bit flips, byte changes, interesting integers, inserted, deleted and
duplicated runs, truncation, and splices with another input."""

from __future__ import annotations

import random
import struct
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus"
_INTERESTING = [struct.pack(">i", v) for v in (-1, 0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF,
                                               0x7FFFFFFF, -0x80000000)] + [b"\xff", b"\x00", b"\x80"]


def seeds(target: str) -> list[bytes]:
    """The committed seed inputs of a target, in a stable order."""
    return [p.read_bytes() for p in sorted((CORPUS / target).iterdir())]


def mutate(data: bytes, rng: random.Random, others: list[bytes]) -> bytes:
    """One to four random mutations of `data`."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        at = rng.randrange(len(out) + 1)
        if op == 0 and out:
            i = min(at, len(out) - 1)
            out[i] ^= 1 << rng.randrange(8)
        elif op == 1 and out:
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif op == 2:
            value = rng.choice(_INTERESTING)
            out[at:at + len(value)] = value
        elif op == 3:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 4:
            del out[at:at + rng.randint(1, 16)]
        elif op == 5 and out:
            start = rng.randrange(len(out))
            out[at:at] = out[start:start + rng.randint(1, 32)]
        elif op == 6:
            del out[at:]
        elif op == 7 and others:
            other = rng.choice(others)
            cut = rng.randrange(len(other) + 1)
            out[at:] = other[cut:]
    return bytes(out)
