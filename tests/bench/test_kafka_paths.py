"""bench/kafka_paths.py without a broker: the perf tools' summaries read as they print them, the
HAProxy configuration, the broker's second listener for it, Kroxylicious's configuration, and
the medians, ratios and targets the report is made of."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kafka_paths import (
    Result,
    broker_with_haproxy_listener,
    consumer_summary,
    haproxy_config,
    producer_summary,
    summarize,
    targets,
)
from devkit import kroxylicious

# ProducerPerformance's progress lines, then its total (org.apache.kafka.tools.ProducerPerformance)
PRODUCER_OUT = """\
40862 records sent, 8170.8 records/sec (7.98 MB/sec), 1875.3 ms avg latency, 2860.0 ms max latency.
262144 records sent, 35231.9 records/sec (34.41 MB/sec), 812.45 ms avg latency, 2860.00 ms max latency, \
753 ms 50th, 1522 ms 95th, 2711 ms 99th, 2840 ms 99.9th.
"""
CONSUMER_OUT = """\
start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, \
fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
2026-11-30 01:40:01:123, 2026-11-30 01:40:09:456, 256.0000, 30.7213, 262144, 31458.2, 3012, 5321, \
48.1113, 49266.3
"""


def test_the_producer_tools_total_is_read_and_its_progress_lines_are_not() -> None:
    assert producer_summary(PRODUCER_OUT) == (262144, 34.41, {"avg": 812.45, "p50": 753.0, "p99": 2711.0,
                                                             "p99.9": 2840.0})
    assert producer_summary(PRODUCER_OUT.splitlines()[0]) is None


def test_the_consumer_tools_fetch_rate_is_read_rebalance_excluded() -> None:
    assert consumer_summary(CONSUMER_OUT) == (256.0, 48.1113)
    assert consumer_summary("start.time, end.time\n") is None
    assert consumer_summary("") is None


def test_haproxy_forwards_tcp_from_its_port_to_the_brokers_second_listener() -> None:
    text = haproxy_config(9100, 9200)
    assert "mode tcp" in text
    assert "bind 127.0.0.1:9100" in text and "server b1 127.0.0.1:9200" in text


def test_the_brokers_second_listener_advertises_haproxys_address(tmp_path: Path) -> None:
    broker = broker_with_haproxy_listener(9100, 9200)
    props = broker.properties()
    assert props["listeners"].endswith(",HAPROXY://127.0.0.1:9200")
    assert props["advertised.listeners"].endswith(",HAPROXY://127.0.0.1:9100")
    assert props["listener.security.protocol.map"].endswith(",HAPROXY:PLAINTEXT")
    assert props["listeners"].startswith(f"PLAINTEXT://127.0.0.1:{broker.port}")  # the broker's own first


def test_kroxylicious_fronts_the_target_with_a_port_identifies_node_gateway() -> None:
    text = kroxylicious.config("127.0.0.1:9092", 9192, node_id=3)
    assert "bootstrapServers: 127.0.0.1:9092" in text
    assert "portIdentifiesNode:\n        bootstrapAddress: 127.0.0.1:9192" in text
    # the broker's node id alone: one node port, 9193
    assert "nodeIdRanges:\n        - name: broker\n          start: 3\n          end: 3" in text
    assert "filterDefinitions" not in text  # passthrough


def test_trim_takes_out_the_unserved_modules_and_the_apps_test_dependencies(tmp_path: Path) -> None:
    modules = "".join(f"\n        <module>{m}</module>" for m in
                      ("kroxylicious-api", "kroxylicious-app", *kroxylicious.DROPPED_MODULES))
    (tmp_path / "pom.xml").write_text(f"<project><modules>{modules}\n    </modules></project>")
    (tmp_path / "kroxylicious-app").mkdir()
    (tmp_path / "kroxylicious-app" / "pom.xml").write_text(
        "<dependencies>\n<dependency><artifactId>kroxylicious-runtime</artifactId></dependency>\n"
        "<dependency><artifactId>assertj-core</artifactId>\n<scope>test</scope>\n</dependency>\n"
        "<dependency><artifactId>picocli</artifactId></dependency>\n</dependencies>")
    kroxylicious.trim(tmp_path)
    root = (tmp_path / "pom.xml").read_text()
    assert "kroxylicious-app" in root and not any(m in root for m in kroxylicious.DROPPED_MODULES)
    app = (tmp_path / "kroxylicious-app" / "pom.xml").read_text()
    assert "kroxylicious-runtime" in app and "picocli" in app and "assertj" not in app
    with pytest.raises(kroxylicious.KroxyliciousError, match="lists no module kroxylicious-kubernetes"):
        kroxylicious.trim(tmp_path)  # trimmed already: not the tag's layout


def result(path: str, round_: int, mib_s: float, p50: float = 10.0, avg: float = 12.0,
           cpu: float | None = 20.0) -> Result:
    return Result("produce-1k", path, round_, mib_s, {"avg": avg, "p50": p50, "p99": 40.0, "p99.9": 50.0},
                  None if path == "direct" else cpu, 0.9, 0.1)


def test_each_paths_ratio_is_to_direct_in_its_own_round_then_the_median() -> None:
    results = [result("direct", 0, 100.0), result("proxy", 0, 90.0, p50=11.0, avg=12.5),
               result("direct", 1, 50.0), result("proxy", 1, 49.0, p50=11.0, avg=12.5),
               result("direct", 2, 80.0), result("proxy", 2, 76.0, p50=12.0, avg=12.7)]
    rows = dict(summarize(results, ["direct", "proxy"]))
    # ratios 0.90, 0.98, 0.95 in their rounds: median 0.95
    assert rows["produce-1k, proxy"].startswith("76.0 MiB/s; 0.950 of direct; latency avg 12.50, "
                                                "p50/p99/p99.9 11/40/50 ms; adds +0.50 ms avg, +1 ms p50; "
                                                "20.0 CPU ms per MiB; broker 0.90 cores, idle 0.10 (3 runs)")
    assert rows["produce-1k, proxy: targets"] == "0.950 of direct (met 0.95)"


def test_a_path_that_failed_every_run_says_why() -> None:
    failed = Result("produce-1k", "proxy", 0, error="ProducerPerformance exited 1: boom")
    rows = dict(summarize([result("direct", 0, 100.0), failed], ["direct", "proxy"]))
    assert rows["produce-1k, proxy"] == "ProducerPerformance exited 1: boom"


def test_the_targets_against_haproxy_and_kroxylicious() -> None:
    ratios: dict[str, float | None] = {"proxy": 0.93, "haproxy": 0.99, "kroxylicious": 0.90}
    cpu: dict[str, float | None] = {"proxy": 30.0, "kroxylicious": 25.0}
    assert dict(targets("produce-1k", ratios, cpu))["produce-1k, proxy: targets"] == (
        "0.930 of direct (missed 0.95); HAProxy - 0.03 = 0.960 (missed); Kroxylicious 0.900 (met); "
        "CPU 30.0 against 25.0 ms per MiB (missed)")
