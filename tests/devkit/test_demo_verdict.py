"""The demo's verdict on a mismatch (devkit/demo/summary.py, diagnosis.py) and make demo-stress's
reading of it (devkit/demo/stress.py), on made-up runs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from devkit.demo import stress
from devkit.demo.clients import ReadBack
from devkit.demo.counts import ProxyCounts
from devkit.demo.diagnosis import BEYOND_END, ON_BROKER, SKIPPED, Lookup, verdict
from devkit.demo.summary import Demo, summary


def producer(client_id: str, acked: set[int]) -> Any:
    return SimpleNamespace(client_id=client_id, acked=acked, purged_in_flight=set(), bytes=0, purged=0,
                           errors=0, unflushed=0, rate=None, quota=None, throttle_max_seen=0.0)


def demo(seen: set[int], read_back: ReadBack | None, lookups: list[Lookup]) -> Demo:
    producers = [producer("demo-free", {1, 2, 3}), producer("demo-limited", {4, 5})]
    d = SimpleNamespace(broker=None, broker_name="Tansu", proxy=None, producers=producers,
                        consumer=SimpleNamespace(seen=seen, duplicates=0, errors=0), ran_for=20.0,
                        history=[], final_proxy=ProxyCounts(), failed_reason="", lookups=lookups,
                        read_back=read_back, acked={1, 2, 3, 4, 5})
    return cast(Demo, d)


def test_a_mismatch_names_each_missing_record_and_whose_loss_it_is() -> None:
    back = ReadBack({3, 4})
    back.complete, back.seconds = False, 60.04
    lookups = [Lookup(0, 7, 7, ON_BROKER), Lookup(2, 40, 40, SKIPPED, "the next offset in the log is 41")]
    lines, ok = summary(demo({1, 2}, back, lookups), [])
    assert not ok
    text = "\n".join(lines)
    assert "  produced 5 records (acknowledged), consumed 2: MISMATCH\n" in text
    assert "  1 acknowledged record(s) never reached the consumer, nor the log read back\n" in text
    assert ("  produced 5 records (acknowledged), consumed 2: MISMATCH\n"
            "  the log read back through the proxy: 2 records in 60.0 s, stopped at its deadline "
            "before the end of every partition\n") in text
    assert ("  each missing record at the partition and offset the broker acknowledged for it, read "
            "straight from the broker:\n"
            "    partition 0, offset 7: on the broker\n"
            "    partition 2, offset 40: not on the broker: the log goes on past it (the next offset in "
            "the log is 41)\n"
            "  cause: broker loss: the broker acknowledged 1 record(s) it does not have; proxy or "
            "consumer loss: the broker has 1 record(s) that the reads through the proxy did not "
            "return\n") in text


def test_a_match_needs_no_look_up() -> None:
    lines, ok = summary(demo({1, 2, 3}, ReadBack({4, 5}), []), [])
    assert ok
    text = "\n".join(lines)
    assert "consumed 3: MATCH" in text
    assert "cause:" not in text and "stopped at its deadline" not in text
    assert "  the log read back through the proxy: 2 records in 0.0 s" in lines


def test_verdict_counts_each_kind() -> None:
    assert verdict([Lookup(1, 0, 61, BEYOND_END, "the log ends at offset 0")]) == \
        "cause: broker loss: the broker acknowledged 62 record(s) it does not have"
    assert verdict([]) == "cause: none"


def test_stress_reads_the_demos_verdict() -> None:
    ok = "Summary\n  produced 10 records (acknowledged), consumed 10: MATCH\n"
    assert stress.verdict(0, ok) == "MATCH"
    lost = ("  produced 10 records (acknowledged), consumed 8: MISMATCH\n"
            "  cause: proxy or consumer loss: the broker has 2 record(s) that the reads through the "
            "proxy did not return\n")
    v = stress.verdict(1, lost)
    assert v == ("MISMATCH, cause: proxy or consumer loss: the broker has 2 record(s) that the reads "
                 "through the proxy did not return")
    assert stress.cause_kind(v) == ("MISMATCH, cause: proxy or consumer loss: the broker has N "
                                    "record(s) that the reads through the proxy did not return")
    assert stress.verdict(2, "  stopped early: Tansu did not start\n") == \
        "the demo failed (exit 2): Tansu did not start"
    assert stress.verdict(None, "") == "the demo did not end in time"


def test_stress_reads_the_quota_line() -> None:
    out = ("    demo-limited    1.07 MiB/s, quota 1.00 MiB/s: +7% of its quota, within the 15% allowed\n"
           "    demo-free       4.00 MiB/s, quota none\n")
    assert stress.held(out) == "demo-limited 1.07 MiB/s, +7% of its quota, within the 15% allowed"
    assert stress.held("") == "no quota line"


def test_stress_counts_the_records_the_read_back_found() -> None:
    out = ("  62 acknowledged record(s) the live consumer passed over were in the log read back at the "
           "end (Tansu answered a Fetch without a batch not yet stored; docs/reliability.md)\n")
    assert stress.passed_over(out) == 62
    assert stress.passed_over("consumed 10: MATCH") == 0
