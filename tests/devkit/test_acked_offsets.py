"""devkit.acked_offsets' verdict on made-up rounds: where each acknowledged record was found."""

from devkit.acked_offsets import Round, compare

A, B, C = b"\x00\x00\x00\x00\x01", b"\x00\x00\x00\x00\x02", b"\x01\x00\x00\x00\x01"


def test_every_record_where_it_was_acknowledged_is_a_pass() -> None:
    acked = {A: (0, 0), B: (0, 1), C: (2, 0)}
    r = compare(acked, dict(acked))
    assert (r.acked, r.read, r.shared, r.missing, r.moved, r.ok) == (3, 3, [], [], [], True)


def test_a_record_the_log_does_not_hold_is_missing_where_it_was_acknowledged() -> None:
    r = compare({A: (0, 0), B: (1, 7)}, {A: (0, 0)})
    assert (r.missing, r.moved, r.ok) == ([(1, 7)], [], False)


def test_one_offset_acknowledged_for_two_records_is_named() -> None:
    # The broker gave two records one offset: the log holds one of them there, the other nowhere.
    r = compare({A: (0, 5), B: (0, 5)}, {A: (0, 5)})
    assert (r.shared, r.missing, r.ok) == ([(0, 5)], [(0, 5)], False)


def test_a_record_found_at_another_offset_has_moved() -> None:
    r = compare({A: (0, 3)}, {A: (0, 4)})
    assert (r.missing, r.moved, r.ok) == ([], [(0, 3, 4)], False)


def test_a_read_back_that_stopped_short_fails_the_round() -> None:
    r = Round(topic="t", acked=1, read=1, read_whole=False)
    assert not r.ok
    assert "did not reach every acknowledged offset" in r.line()
