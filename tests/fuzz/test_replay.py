"""The short version of `make fuzz`, without atheris: every fuzz target replays its committed
seed corpus (recorded from real clients, tests/fuzz/record.py) and a fixed set of mutations of
it. A target raising anything but its decoder's own error type fails the test."""

from __future__ import annotations

import random

import pytest

from tests.fuzz.mutate import mutate, seeds
from tests.fuzz.targets import TARGETS

MUTATIONS = 1500  # per target; fixed seeds, so every run tries the same inputs


@pytest.mark.parametrize("name", list(TARGETS))
def test_seed_corpus_replays(name: str) -> None:
    inputs = seeds(name)
    assert len(inputs) >= 8, "the seed corpus is missing: python -m tests.fuzz.record"
    for data in inputs:
        TARGETS[name](data)


@pytest.mark.parametrize("name", list(TARGETS))
def test_mutated_corpus(name: str) -> None:
    inputs = seeds(name)
    rng = random.Random(f"replay-{name}")
    for _ in range(MUTATIONS):
        data = mutate(rng.choice(inputs), rng, inputs)
        try:
            TARGETS[name](data)
        except Exception as exc:
            raise AssertionError(f"{name} crashed on {data.hex()}") from exc
