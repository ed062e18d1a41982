"""SIGTERM and kill -9 of a real proxy process in front of a real Tansu, with real clients
(docs/reliability.md, "Proxy faults"); the long version is `make faults-proxy`."""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit.proxy_faults import file_kills, in_flight, under_load
from devkit.tansu import Broker

pytestmark = pytest.mark.integration


def test_sigterm_answers_every_request_in_flight(broker: Broker, broker_node_id: int) -> None:
    # 20 Produce requests wait at the broker behind a 2.5 s long poll when the signal comes.
    r = in_flight.pipelined_then_sigterm(broker, broker_node_id, n=20)
    assert r.fetch_answered
    assert r.answers == [(i, 0, 0) for i in range(20)]
    assert r.closed_cleanly
    assert r.at_broker == list(range(20))
    assert r.exit_status == 0
    assert "shutting down: draining 1 connection(s)" in r.log


def test_sigterm_drains_a_throttled_client_without_waiting_for_its_throttle(
        broker: Broker, broker_node_id: int) -> None:
    # 50 kB at 1000 B/s: the first Produce is over quota on arrival, is forwarded, and the
    # proxy reads nothing more from the client; the other four are never forwarded.
    r = in_flight.pipelined_then_sigterm(broker, broker_node_id, n=5, record_bytes=50_000, quota=1000)
    assert r.fetch_answered
    assert [(c, e) for c, e, _ in r.answers] == [(0, 0)]
    throttle_ms = r.answers[0][2]
    assert throttle_ms > 20_000
    assert r.closed_cleanly
    assert r.at_broker == [0]  # the held ones were neither answered nor written
    assert r.exit_status == 0
    assert r.exit_seconds < 15 < throttle_ms / 1000


def test_sigterm_loses_no_answer_to_a_slow_reader_with_requests_left_unread(
        broker: Broker, broker_node_id: int) -> None:
    # Before the lingering close (ClientConnection._linger), the proxy closed a socket that
    # still held an unread request, the kernel reset the connection, and this client lost the
    # last two or three of its 20 answers.
    r = in_flight.slow_reader_then_sigterm(broker, broker_node_id, n=20)
    assert r.answered == list(range(20))
    assert r.ending == "end of stream"
    assert r.exit_status == 0


@pytest.mark.parametrize("fault", under_load.FAULTS)
def test_fault_under_load_loses_no_acknowledged_record(broker: Broker, broker_node_id: int,
                                                       fault: str) -> None:
    run = under_load.run(broker, broker_node_id, fault, rounds=1, rate=1000, warmup=2.0,
                         pause=2.0, between=1.5)
    assert run.verdict is not None
    assert run.verdict.lost == []
    assert run.verdict.duplicated == []
    assert run.verdict.out_of_order == []
    assert run.verdict.misplaced == []
    assert run.verdict.acked == run.sent > 2000
    assert run.failures == [] and run.undecided == 0
    assert run.reader_missing == 0
    [fault_round] = run.rounds
    assert fault_round.exit_status == (0 if fault == "sigterm" else -9)
    assert fault_round.reconnect_seconds < 30  # librdkafka came back through the new proxy
    assert fault_round.read_again_seconds < 30
    if fault == "sigterm":
        # Every request the producer had in flight was answered before the proxy went away.
        assert run.verdict.offset_unknown == 0
        assert "Traceback" not in "".join(run.proxy_logs)


def test_the_proxy_killed_while_changing_quotas_keeps_every_acknowledged_change(
        broker: Broker, broker_node_id: int, tmp_path: Path) -> None:
    report = file_kills.proxy_kills(broker, broker_node_id, tmp_path, kills=3, seed=5)
    assert report.torn == [], report
    assert report.whole == report.kills == 3
    assert report.versions_finished > 3  # changes were acknowledged between the kills
    assert report.leftovers_end == 0
