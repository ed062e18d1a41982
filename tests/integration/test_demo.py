"""`kafka-quota-proxy demo` end to end: it runs, the quota holds one producer and not the other,
every acknowledged record comes back, nothing is left running."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.tansu import Broker

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.parametrize("broker", ["tansu", pytest.param("kafka", marks=pytest.mark.kafka)])
# make demo, make demo BROKER=kafka
def test_demo_runs_throttles_and_cleans_up(broker: str) -> None:
    result = subprocess.run([sys.executable, "-m", "devkit.demo", "--seconds", "20", "--broker", broker],
                            cwd=REPO, capture_output=True, text=True, timeout=180)
    out = result.stdout
    assert result.returncode == 0, f"exit {result.returncode}\n{out}\n{result.stderr}"

    # Not a terminal: plain progress lines, no live view, with both producers' rates.
    progress = re.findall(r"^\[\s*\d+\.\ds\] demo-free [\d.]+ MiB/s .* \| demo-limited [\d.]+ MiB/s ",
                          out, re.MULTILINE)
    assert len(progress) >= 5, out

    summary = out[out.index("\nSummary"):]
    m = re.search(r"produced ([\d,]+) records \(acknowledged\), consumed ([\d,]+): (MATCH|MISMATCH)",
                  summary)
    assert m, out
    produced, consumed = number(m[1]), number(m[2])
    assert produced > 0
    assert produced == consumed
    assert m[3] == "MATCH"

    # The quota: the limited producer was throttled, by the proxy and as librdkafka saw it; the
    # free one not at all.
    limited = re.search(r"demo-limited\s+throttled ([\d,]+) responses \(([\d,]+) ms in all", summary)
    assert limited, out
    assert number(limited[1]) > 0 and number(limited[2]) > 0
    assert re.search(r"demo-limited\s+throttled .*librdkafka saw up to [\d,]+ ms", summary), out
    assert re.search(r"demo-free\s+not throttled", summary), out
    # Its rate is summed up over the quota's own window (11 samples of 1 s) at the end of the run,
    # which is where Kafka holds it to its quota; the bursts inside that window are explained.
    assert re.search(r"^  over the last 1[12]\.\d s of the run, one quota window \(11 samples of 1 s\), "
                     r"in acknowledged key\+value bytes:$", summary, re.MULTILINE), out
    assert re.search(r"^    demo-limited +[\d.]+ MiB/s, quota 1\.00 MiB/s: [+-]\d+% of its quota, "
                     r"(within the 15% allowed|under its quota by more than 15%: its next window-sized "
                     r"burst had not come by the end of the run)$", summary, re.MULTILINE), out
    assert "OUTSIDE" not in summary, out  # the quota held over its window
    assert re.search(r"^    demo-free +[\d.]+ MiB/s, quota none$", summary, re.MULTILINE), out
    assert ("\n  a flat-out client moves in window-sized bursts, on Kafka too: it runs ahead, is "
            "throttled until its rate over the window is back at its quota, and bursts again\n") in summary
    assert "NOT within" not in out

    # The clients were only ever told the proxy's address, never the broker's.
    name = {"tansu": "Tansu", "kafka": "Apache Kafka"}[broker]
    started = re.search(rf"{name} broker: pid (\d+), listening on (\S+)", out)
    told = re.search(r"clients were told: broker \d+ at (\S+)", out)
    assert started and told, out
    assert told[1] != started[2]

    # The broker the demo started is gone (stopped and reaped, so not even a zombie).
    with pytest.raises(ProcessLookupError):
        os.kill(int(started[1]), 0)
    assert "stopped; proxy stopped; clients closed" in out


def test_replicas_demo_shows_the_quota_multiplied_then_shared() -> None:
    result = subprocess.run([sys.executable, "-m", "devkit.demo", "--replicas", "2"],
                            cwd=REPO, capture_output=True, text=True, timeout=240)
    out = result.stdout
    print(out)
    assert result.returncode == 0, f"exit {result.returncode}\n{out}\n{result.stderr}"
    assert "1. Without a store: 2 proxy processes" in out
    assert "2. With a shared Valkey" in out
    assert "x the quota: each replica enforces it alone" in out
    assert "x the quota: the replicas enforce it together" in out


def test_the_demo_reads_the_log_back_when_its_live_consumer_passed_over_records(
        broker: Broker, topic_name: str) -> None:
    """The judgement's second look (devkit/demo/run.py): every record in the log is found."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from devkit.demo.clients import read_back

    admin = AdminClient({"bootstrap.servers": broker.address})
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(30)
    p = Producer({"bootstrap.servers": broker.address})
    for seq in range(300):
        p.produce(topic_name, b"v", key=seq.to_bytes(8, "big"), partition=seq % 2)
    assert p.flush(30) == 0
    assert read_back(broker.address, topic_name, 2) == set(range(300))


def test_a_missing_record_is_looked_up_on_the_broker_at_its_acknowledged_offset(
        broker: Broker, topic_name: str) -> None:
    """The demo's verdict on a mismatch (devkit/demo/diagnosis.py): a record the broker has at
    its acknowledged offset is the proxy's or the consumer's miss; one whose offset holds another
    record, or lies past the log's end, is the broker's loss."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from devkit.demo.diagnosis import BEYOND_END, ON_BROKER, OTHER_RECORD, Lookup, look_up, verdict

    admin = AdminClient({"bootstrap.servers": broker.address})
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(30)
    p = Producer({"bootstrap.servers": broker.address})
    acked: dict[int, tuple[int, int]] = {}

    def delivered(err: object, msg: object) -> None:
        assert err is None
        acked[int.from_bytes(msg.key(), "big")] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]

    for seq in range(10):
        p.produce(topic_name, b"v", key=seq.to_bytes(8, "big"), partition=seq % 2, on_delivery=delivered)
    assert p.flush(30) == 0
    assert sorted(acked.values()) == [(0, o) for o in range(5)] + [(1, o) for o in range(5)]
    # 2 and 4 are on the broker where it acknowledged them (partition 0, offsets 1 and 2); 100 was
    # "acknowledged" at partition 0's offset 3, which holds 6; 101 and 102 past partition 1's end.
    acked |= {100: (0, 3), 101: (1, 7), 102: (1, 8)}
    found = look_up(broker.address, topic_name, acked, [2, 4, 100, 101, 102])
    assert found == [
        Lookup(0, 1, 2, ON_BROKER),
        Lookup(0, 3, 3, OTHER_RECORD, f"key {(6).to_bytes(8, 'big')!r}"),
        Lookup(1, 7, 8, BEYOND_END, "the log ends at offset 5"),
    ]
    assert found[0].line() == "partition 0, offsets 1-2 (2 records): on the broker"
    assert verdict(found) == ("cause: broker loss: the broker acknowledged 3 record(s) it does not have; "
                              "proxy or consumer loss: the broker has 2 record(s) that the reads through "
                              "the proxy did not return")
