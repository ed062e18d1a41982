"""bench.many_connections' measured span: producers from the warm-up, consumers from the warm-up
after the group's first record, wherever the group joined."""

from __future__ import annotations

from bench.many_connections import span_start
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
