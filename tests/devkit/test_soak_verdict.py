"""The soak's rules (devkit/soak/verdict.py) on made-up samples, logs and records: each one
passes what it should and catches what it should."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from devkit.soak import verdict
from devkit.soak.samples import Sample, read_csv, write_csv

MiB = 1024 * 1024


def sample(seconds: float, rss_mib: float, fds: int = 30, conns: int = 8, quiet: bool = False) -> Sample:
    return Sample(seconds, int(rss_mib * MiB), fds, 3, 1.0, conns, 10, 100, 0, 0, 5, 5, 5, int(quiet))


def run_of(rss: list[float]) -> list[Sample]:
    """One sample a minute, RSS in MiB."""
    return [sample(60.0 * i, r) for i, r in enumerate(rss)]


def test_memory_growth_during_warm_up_is_not_judged() -> None:
    m = verdict.memory(run_of([10, 30, 40, 50, 50, 50, 51, 50, 50, 51]), warm_up=180, window=180)
    assert (m.baseline / MiB, m.tail / MiB, m.peak / MiB) == (50, pytest.approx(50.333, abs=1e-3), 51)
    assert m.ok


def test_memory_tail_over_five_percent_fails() -> None:
    m = verdict.memory(run_of([50, 50, 50, 50, 52, 53, 53, 53]), warm_up=60, window=180)
    assert m.tail / m.baseline == pytest.approx(53 / 50)
    assert not m.ok


def test_memory_peak_over_five_percent_fails_even_if_it_comes_back() -> None:
    assert not verdict.memory(run_of([50, 50, 50, 50, 53, 50, 50, 50]), warm_up=60, window=180).ok
    assert verdict.memory(run_of([50, 50, 50, 50, 52.4, 50, 50, 50]), warm_up=60, window=180).ok


def test_memory_needs_samples_in_both_windows() -> None:
    with pytest.raises(ValueError):
        verdict.memory(run_of([50]), warm_up=60, window=60)


def test_descriptors_grow_only_beyond_open_connections() -> None:
    warm = sample(300, 50, fds=34, conns=8, quiet=True)
    same = verdict.descriptors([warm, sample(310, 50, fds=90, conns=30), replace(warm, seconds=1800)])
    assert same.ok and same.warm.seconds == 300 and same.end.seconds == 1800
    more_clients = verdict.descriptors([warm, sample(1800, 50, fds=38, conns=10, quiet=True)])
    assert more_clients.ok  # two more connections, two descriptors each
    leaked = verdict.descriptors([warm, sample(1800, 50, fds=35, conns=8, quiet=True)])
    assert not leaked.ok
    assert leaked.lines() == ["fds with the churn paused: 34 at 300 s (8 client connections) -> 35 at "
                              "1800 s (8); not held by a connection: 18 -> 19: GROWTH"]
    with pytest.raises(ValueError):
        verdict.descriptors([warm])


LOG = """\
2026-11-23 21:00:00,001 INFO kqp.reload: config reloaded from /tmp/p.yaml: 2 quota entities in force
2026-11-23 21:00:01,002 WARNING kqp.client: closing connection from 127.0.0.1:40001: truncated: 3 bytes
2026-11-23 21:00:02,003 WARNING kqp.client: closing connection from 127.0.0.1:40002: truncated: 7 bytes
2026-11-23 21:00:03,004 ERROR kqp.reload: config reload refused, the last good quotas stay in force: x
Traceback (most recent call last):
  File "kafka_quota_proxy/proxy/server.py", line 1, in run
ValueError: no
"""


def test_log_problems_are_errors_and_tracebacks() -> None:
    assert verdict.log_problems(LOG) == LOG.splitlines()[3:6]
    assert verdict.log_problems(LOG.splitlines()[0] + "\n") == []


def test_warnings_count_alike_lines_together() -> None:
    assert verdict.warnings(LOG) == {"kqp.client: closing connection from N.N.N.N:N: truncated: N bytes": 2}


def key(producer: int, seq: int) -> int:
    return (producer << 56) | seq


def reader(seen: set[int], *jumps: verdict.Jump) -> verdict.LiveReader:
    return verdict.LiveReader(seen, list(jumps))


def test_records_exactly_once_for_idempotent_producers_only() -> None:
    acked = {key(1, 0), key(1, 1), key(12, 0), key(12, 1)}
    clean = verdict.records(acked, {1}, acked | {key(1, 2)}, [], {}, reader(acked), [], reader(acked))
    assert clean.ok and clean.acked == 4
    twice = verdict.records(acked, {1}, acked, [key(12, 0), key(12, 0)], {}, reader(acked), [key(1, 0)],
                            reader(acked))
    assert twice.ok and (twice.duplicated_other, twice.group_repeats) == (1, 1)
    dup = verdict.records(acked, {1}, acked, [key(1, 1)], {}, reader(acked), [], reader(acked))
    assert not dup.ok and dup.duplicated_idempotent == 1


def test_records_missing_from_the_log_fail() -> None:
    acked = {key(1, 0), key(12, 1)}
    lost = verdict.records(acked, {1}, acked - {key(12, 1)}, [], {}, reader(acked), [], reader(acked))
    assert not lost.ok and lost.missing_log == 1 and lost.examples == ["12/1"]
    # A record not in the log is that, and not also one the readers passed over.
    assert (lost.group.unexplained, lost.live.unexplained) == (0, 0)


def test_records_a_reader_passed_over_in_a_jump_of_its_offsets_are_reported_not_failed() -> None:
    acked = {key(1, s) for s in range(6)}
    where = {key(1, s): (0, 10 + s) for s in range(6)}  # partition 0, offsets 10..15
    jumped = reader(acked - {key(1, 2), key(1, 3)}, verdict.Jump(0, 12, 14))
    r = verdict.records(acked, {1}, acked, [], where, reader(acked), [], jumped)
    assert r.ok
    assert (r.live.jumped, r.live.unexplained, r.group.jumped) == (2, 0, 0)
    assert r.jumps == ["plain-fetch reader: partition 0, offsets 12..13"]
    # The group alike.
    g = verdict.records(acked, {1}, acked, [], where, jumped, [], reader(acked))
    assert g.ok and (g.group.jumped, g.group.unexplained) == (2, 0)


def test_records_a_reader_did_not_return_without_a_jump_fail() -> None:
    acked = {key(1, s) for s in range(6)}
    where = {key(1, s): (0, 10 + s) for s in range(6)}
    # A jump on another partition, or over other offsets, does not explain it.
    elsewhere = reader(acked - {key(1, 2)}, verdict.Jump(1, 12, 13), verdict.Jump(0, 13, 14))
    r = verdict.records(acked, {1}, acked, [], where, reader(acked), [], elsewhere)
    assert not r.ok and (r.live.jumped, r.live.unexplained) == (0, 1)
    assert r.live.examples == ["1/2 (partition 0 offset 12)"]
    never = verdict.records(acked, {1}, acked, [], {}, reader(acked - {key(1, 5)}), [], reader(acked))
    assert not never.ok and never.group.examples == ["1/5 (place unknown)"]


def test_samples_survive_the_csv(tmp_path: Path) -> None:
    taken = [sample(0.0, 40.5), sample(5.2, 41, quiet=True)]
    write_csv(taken, tmp_path / "s.csv")
    assert read_csv(tmp_path / "s.csv") == taken


def _readings(steady_fds: int, quiet_fds: list[int], conns: int = 8) -> object:
    """A `take`: `steady_fds` while the reading waits for the proxy to hold still, then the
    quiet readings' descriptor counts in turn."""
    quiet_ones = iter(quiet_fds)

    def take(quiet: bool) -> Sample:
        return sample(1.0, 50, fds=next(quiet_ones) if quiet else steady_fds, conns=conns, quiet=quiet)
    return take


def test_the_quiet_reading_keeps_the_one_with_fewest_descriptors_no_connection_holds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection a long-lived client is closing holds a descriptor for a moment: one reading
    of three catches it (35 fds, 8 connections: 19 unexplained); the others do not (33: 17)."""
    from devkit.soak import run as soak_run

    monkeypatch.setattr(soak_run, "pause", lambda workers, timeout: True)
    monkeypatch.setattr(soak_run, "resume", lambda workers: None)
    monkeypatch.setattr(soak_run.time, "sleep", lambda s: None)
    clock = iter(float(t) for t in range(1000))
    monkeypatch.setattr(soak_run.time, "monotonic", lambda: next(clock))
    # Steady from the start; then the three readings: 35 (the closing one), 33, 33.
    take = _readings(33, [35, 33, 33])
    got = soak_run._quiet_reading(None, [], take)  # type: ignore[arg-type]
    assert (got.fds, verdict.Descriptors.unexplained(got)) == (33, 17)
    # A leaked descriptor stays in every reading: it is kept.
    take = _readings(34, [35, 35, 35])
    got = soak_run._quiet_reading(None, [], take)  # type: ignore[arg-type]
    assert verdict.Descriptors.unexplained(got) == 19
