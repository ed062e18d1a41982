"""bench.many_connections' measured span: producers from the warm-up, consumers from the warm-up
after the group's first record, wherever the group joined."""

from __future__ import annotations

from collections.abc import Callable

from bench.many_connections import span_start, stalls
from bench.shared_accuracy import fullest
from devkit.producing import Timeline


def timeline(*marks: tuple[float, int]) -> Timeline:
    tl = Timeline()
    tl.marks.extend(marks)
    return tl


def test_producers_are_measured_from_the_warm_up() -> None:
    assert span_start("produce", [timeline((0.0, 0), (0.25, 1000))], 11.0) == 11.0


def test_a_group_is_measured_a_window_after_its_first_record() -> None:
    # Two members: the group's first bytes at 4.5 s, however late the other member starts.
    members = [timeline((0.0, 0), (4.25, 0), (4.5, 1024), (5.0, 4096)),
               timeline((0.0, 0), (6.0, 0), (6.25, 2048))]
    assert span_start("consume", members, 11.0) == 15.5
    assert span_start("consume", [timeline((0.0, 0))], 11.0) == 11.0  # read nothing: from the start


def steps(*marks: tuple[float, int]) -> Callable[[float], int]:
    return timeline(*marks).at


def test_a_stall_is_a_span_without_bytes_of_at_least_two_seconds() -> None:
    # Bytes every 0.25 s to 2 s, none until 5.5 s, then more: one stall, from 2.0 s for 3.25 s
    # (the last step without growth is at 5.25 s); 1 s without (5.75-7 s) is too short to count.
    marks = [(t / 4, 1000 * (t + 1)) for t in range(9)]  # 0..2.0 s
    marks += [(5.5, 20_000), (5.75, 21_000), (7.0, 22_000), (8.0, 23_000), (8.25, 24_000)]
    assert stalls(steps(*marks), 0.0, 8.25) == [(2.0, 3.25)]


def test_a_stall_at_the_end_counts() -> None:
    assert stalls(steps((0.0, 0), (1.0, 500)), 0.0, 5.0) == [(1.0, 4.0)]
    assert stalls(steps((0.0, 0), (1.0, 500)), 0.0, 2.5) == []


def test_the_fullest_window_is_found_where_it_starts() -> None:
    # 1 byte a second, then 100 bytes at 20 s: the first window holding them starts at 9 s
    # (9 + 11 = 20), from a span from 0 to 30 s.
    marks = [(float(t), t) for t in range(20)] + [(20.0, 120), (30.0, 130)]
    assert fullest(steps(*marks), 0.0, 30.0) == (120 - 9, 9.0)
