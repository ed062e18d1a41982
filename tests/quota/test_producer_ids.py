"""KIP-936's seen-producer-id cache: Bloom filter sizing and accuracy, the 1.5-window rotation,
the memory caps. The clock is a plain int (W = 1000 ms unless stated)."""

from __future__ import annotations

import math
import random

import pytest

from kafka_quota_proxy.quota.producer_ids import (
    DEFAULT_WINDOW_MS,
    PRODUCER_ID_QUOTA_CACHE_CLEANUP_INTERVAL_MS,
    PRODUCER_ID_QUOTA_WINDOW_NUM,
    PRODUCER_ID_QUOTA_WINDOW_SIZE_SECONDS,
    BloomFilter,
    ProducerIdCache,
)

W = 1000
MAX_PID = 2**63 - 1


def cache(window_ms: int = W, expected: int = 1000, fp_rate: float = 0.01, max_users: int = 100,
          max_bits: int = 1 << 20) -> ProducerIdCache:
    return ProducerIdCache(window_ms, expected, fp_rate, max_users, max_bits)


# --- constants -------------------------------------------------------------------------------------

def test_kip_936_defaults() -> None:
    assert PRODUCER_ID_QUOTA_WINDOW_NUM == 11
    assert PRODUCER_ID_QUOTA_WINDOW_SIZE_SECONDS == 3600
    assert PRODUCER_ID_QUOTA_CACHE_CLEANUP_INTERVAL_MS == 10
    assert DEFAULT_WINDOW_MS == 3_600_000
    assert ProducerIdCache().window_ms == 3_600_000


# --- BloomFilter ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("n", "p", "m", "k"), [
    (1000, 0.01, 9586, 7),            # 9585.06 bits, 6.64 hashes
    (1_000_000, 0.01, 9_585_059, 7),  # 9585058.38
    (100, 0.1, 480, 3),               # 479.25, 3.33
    (10_000, 0.001, 143_776, 10),     # 143775.88, 9.97
    (1, 0.5, 2, 1),                   # 1.44, 1.39
])
def test_sizing_formula(n: int, p: float, m: int, k: int) -> None:
    bloom = BloomFilter(n, p)
    assert bloom.num_bits == m
    assert bloom.num_hashes == k
    assert bloom.size_bytes == math.ceil(m / 8)
    assert bloom.capacity == n
    assert bloom.count == 0
    assert bloom.bits_set == 0


def test_sizing_with_a_bit_cap() -> None:
    bloom = BloomFilter(1000, 0.01, max_bits=4096)
    assert bloom.num_bits == 4096
    assert bloom.num_hashes == 3  # round(4096 / 1000 * ln 2) = round(2.84)
    assert bloom.size_bytes == 512
    # (1 - e^(-3n/4096))^3 <= 0.01 up to n = 331.3
    assert bloom.capacity == 331
    # A cap above the computed size changes nothing.
    assert BloomFilter(1000, 0.01, max_bits=9586).num_bits == 9586
    assert BloomFilter(1000, 0.01, max_bits=9586).capacity == 1000


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"expected": 0, "fp_rate": 0.01}, "expected"),
    ({"expected": 10, "fp_rate": 0.0}, "fp_rate"),
    ({"expected": 10, "fp_rate": 1.0}, "fp_rate"),
    ({"expected": 10, "fp_rate": 0.01, "max_bits": 0}, "max_bits"),
])
def test_bloom_rejects_bad_shapes(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BloomFilter(**kwargs)  # type: ignore[arg-type]


def test_no_false_negatives() -> None:
    rng = random.Random(936)
    ids = [0, 1, MAX_PID, -1, -(2**63)] + [rng.randrange(2**63) for _ in range(20_000)]
    bloom = BloomFilter(20_000, 0.01)
    for pid in ids:
        bloom.add(pid)
    assert all(pid in bloom for pid in ids)
    assert bloom.count == len(ids)


@pytest.mark.slow  # seconds of CPU: make test, not make check
def test_measured_false_positive_rate_at_1m_ids() -> None:
    bloom = BloomFilter(1_000_000, 0.01)
    # Brokers hand out ids in blocks, so the added ids are consecutive; the probes are random
    # ids above them, never added.
    for pid in range(1_000_000):
        bloom.add(pid)
    rng = random.Random(936)
    probes = 1_000_000
    false_positives = sum(rng.randrange(1_000_000, 2**63) in bloom for _ in range(probes))
    fp = false_positives / probes
    print(f"\nBloomFilter(1e6, 0.01): measured fp {fp:.5f} ({false_positives}/{probes}), "
          f"estimated {bloom.estimated_fp_rate():.5f}, {bloom.size_bytes} bytes")
    assert fp <= 0.02
    assert bloom.estimated_fp_rate() <= 0.02


def test_estimated_fp_rate_rises_with_fill() -> None:
    bloom = BloomFilter(100, 0.01)
    assert bloom.estimated_fp_rate() == 0.0
    previous = at_capacity = 0.0
    for pid in range(300):
        bloom.add(pid)
        estimate = bloom.estimated_fp_rate()
        assert estimate >= previous
        assert estimate == (bloom.bits_set / bloom.num_bits) ** bloom.num_hashes
        previous = estimate
        if pid == 99:
            at_capacity = estimate
    assert 0.005 <= at_capacity <= 0.02  # near the designed p when holding the expected count
    assert previous > at_capacity > 0.0


def test_seed_changes_the_bits_not_the_answers() -> None:
    a, b = BloomFilter(100, 0.01, seed=0), BloomFilter(100, 0.01, seed=12345)
    for pid in range(50):
        a.add(pid)
        b.add(pid)
    assert a._bits != b._bits
    assert all(pid in a and pid in b for pid in range(50))


# --- rotation -------------------------------------------------------------------------------------

def test_an_id_is_remembered_until_its_filter_is_1_5_windows_old() -> None:
    c = cache()
    assert c.track("alice", 42, 0) is True
    assert c.track("alice", 42, 900) is False   # 0.9 W: same filter
    assert c.track("alice", 42, 1400) is False  # 1.4 W: the first filter is still alive
    assert c.track("alice", 42, 1499) is False
    assert c.track("alice", 42, 1500) is True   # 1.5 W: dropped, so the id is new again
    assert c.track("alice", 42, 1501) is False
    assert c.ids_tracked("alice", 1501) == 1


def test_additions_after_a_window_go_to_a_second_filter() -> None:
    c = cache()
    assert c.track("alice", 1, 0) is True
    assert c.track("alice", 2, 999) is True     # still the first filter
    assert c.memory_bytes() == 1199
    assert c.track("alice", 3, 1000) is True    # a window old: the second filter opens at 1000
    assert c.memory_bytes() == 2 * 1199
    assert c.ids_tracked("alice", 1000) == 3
    assert c.track("alice", 1, 1200) is False   # found in the first
    assert c.track("alice", 3, 1200) is False   # found in the second
    # At 1500 the first filter goes; the ids in it are forgotten, the second's are not.
    assert c.ids_tracked("alice", 1500) == 1
    assert c.track("alice", 3, 1500) is False
    assert c.track("alice", 2, 1500) is True
    assert c.memory_bytes() == 1199
    # The third filter opens at the first addition a window after the second (at 2000 or later).
    assert c.track("alice", 4, 2100) is True
    assert c.ids_tracked("alice", 2100) == 3
    assert c.ids_tracked("alice", 2500) == 1    # the second filter (opened at 1000) died at 2500
    assert c.track("alice", 4, 2500) is False
    assert c.track("alice", 3, 2500) is True


def test_a_filter_opens_at_the_addition_that_needs_it() -> None:
    c = cache()
    c.track("alice", 1, 0)
    assert c.track("alice", 2, 1400) is True    # opens the second filter at 1400, not 1000
    assert c.track("alice", 2, 2800) is False   # 1.4 W after 1400: alive
    assert c.track("alice", 2, 2900) is True


def test_a_long_lived_producer_counts_again_every_1_to_1_5_windows() -> None:
    # Alone, its id opens every filter, and each lives 1.5 W.
    c = cache()
    assert [t for t in range(0, 5000, 10) if c.track("alice", 7, t)] == [0, 1500, 3000, 4500]
    # Among a stream of new ids a filter opens every W, and the id lands in one opened before it.
    c = cache(expected=1000)
    new_at = []
    for t in range(0, 5000, 10):
        c.track("alice", 1_000_000 + t, t)
        if c.track("alice", 7, t):
            new_at.append(t)
    assert new_at == [0, 1500, 2500, 3500, 4500]


def test_a_user_with_no_live_filter_leaves_the_cache() -> None:
    c = cache()
    c.track("alice", 1, 0)
    c.track("bob", 1, 300)
    c.track("bob", 2, 1300)                     # bob's second filter opens at 1300
    assert sorted(c.users()) == ["alice", "bob"]
    assert c.expire(1499) == 0
    assert c.expire(1500) == 1                  # alice's only filter, opened at 0
    assert c.users() == ["bob"]
    assert c.memory_bytes() == 2 * 1199
    assert c.expire(1800) == 0                  # bob's first filter goes, his second stays
    assert c.memory_bytes() == 1199
    assert c.ids_tracked("bob", 1800) == 1
    assert c.expire(2799) == 0
    assert c.expire(2800) == 1
    assert c.users() == []
    assert len(c) == 0
    assert c.memory_bytes() == 0
    assert c.ids_tracked("bob", 2800) == 0
    assert c.estimated_fp_rate("bob", 2800) == 0.0
    # A user that returns starts afresh.
    assert c.track("alice", 1, 3000) is True


def test_track_drops_dead_filters_without_waiting_for_expire() -> None:
    c = cache()
    c.track("alice", 1, 0)
    assert c.track("alice", 2, 2000) is True    # the filter of 0 was dropped and a new one opened
    assert c.memory_bytes() == 1199
    assert c.expire(2000) == 0                  # its stale due entry removes nothing
    assert c.users() == ["alice"]
    assert c.expire(3500) == 1


def test_negative_ids_are_ignored() -> None:
    c = cache()
    assert c.track("alice", -1, 0) is False
    assert c.track("alice", -2, 0) is False
    assert c.users() == []
    assert c.track("alice", 0, 0) is True


# --- memory bounds --------------------------------------------------------------------------------

def test_users_beyond_the_cap_are_not_tracked() -> None:
    c = cache(max_users=2)
    assert c.track("alice", 1, 0) is True
    assert c.track("bob", 1, 100) is True
    assert c.track("carol", 1, 200) is False    # no room: treated as seen, never throttled
    assert c.track("carol", 1, 300) is False
    assert c.dropped_users == 2
    assert sorted(c.users()) == ["alice", "bob"]
    assert c.track("alice", 2, 300) is True     # users already in are still tracked
    assert c.dropped_users == 2
    # Once alice's filter dies, a new user takes her place (the cap runs expire first).
    assert c.track("carol", 1, 1500) is True
    assert sorted(c.users()) == ["bob", "carol"]
    assert c.dropped_users == 2


def test_a_zero_user_cap_tracks_nobody() -> None:
    c = cache(max_users=0)
    assert c.track("alice", 1, 0) is False
    assert c.dropped_users == 1
    assert c.memory_bytes() == 0


def test_bits_cap_and_overfull_adds() -> None:
    c = cache(expected=1000, max_bits=4096)
    new = sum(c.track("alice", pid, 0) for pid in range(400))
    assert c.memory_bytes() == 512
    assert c.ids_tracked("alice", 0) == new
    assert 390 <= new <= 400                    # a few ids look seen: the filter is over capacity
    assert c.overfull_adds == new - 331         # every id added beyond the capacity of 331
    assert c.estimated_fp_rate("alice", 0) > 0.01


def test_overfull_adds_without_a_cap() -> None:
    c = cache(expected=100)
    new = sum(c.track("alice", pid, 0) for pid in range(100))
    assert new == c.ids_tracked("alice", 0)
    assert c.overfull_adds == max(0, new - 100)
    before = c.overfull_adds
    assert c.track("alice", 1_000_000, 0) is True
    assert c.track("alice", 1_000_001, 0) is True
    assert c.overfull_adds == before + 2
    # The next window's filter starts empty.
    assert c.track("alice", 2_000_000, 1000) is True
    assert c.overfull_adds == before + 2


def test_memory_bytes_is_the_bit_arrays() -> None:
    c = cache(expected=1000, fp_rate=0.01)      # 9586 bits: 1199 bytes a filter
    assert c.memory_bytes() == 0
    c.track("alice", 1, 0)
    assert c.memory_bytes() == 1199
    for pid in range(2, 500):
        c.track("alice", pid, 10)
    assert c.memory_bytes() == 1199             # fixed size, whatever the fill
    c.track("bob", 1, 10)
    assert c.memory_bytes() == 2398
    c.track("alice", 10_000, 1000)
    assert c.memory_bytes() == 3597
    c.expire(1500)
    assert c.memory_bytes() == 2398             # alice's first filter
    c.expire(2500)
    assert c.memory_bytes() == 0
    capped = cache(expected=1000, max_bits=64)  # 8 bytes a filter
    capped.track("alice", 1, 0)
    capped.track("alice", 2, 1000)
    assert capped.memory_bytes() == 16


def test_estimated_fp_rate_combines_the_live_filters() -> None:
    c = cache(expected=100)
    assert c.estimated_fp_rate("alice", 0) == 0.0
    previous = 0.0
    for pid in range(150):
        c.track("alice", pid, 0)
        estimate = c.estimated_fp_rate("alice", 0)
        assert estimate >= previous
        previous = estimate
    first = c.estimated_fp_rate("alice", 1000)
    for pid in range(1000, 1050):
        c.track("alice", pid, 1000)
    second_alone = c.estimated_fp_rate("alice", 1500)
    assert c.estimated_fp_rate("alice", 1000) == pytest.approx(1 - (1 - first) * (1 - second_alone))
    assert c.estimated_fp_rate("alice", 1000) > first


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"window_ms": 0}, "window_ms"),
    ({"expected_per_window": 0}, "expected"),
    ({"fp_rate": 1.5}, "fp_rate"),
    ({"max_users": -1}, "max_users"),
    ({"max_bits_per_user": 0}, "max_bits"),
])
def test_cache_rejects_bad_config(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProducerIdCache(**kwargs)  # type: ignore[arg-type]
