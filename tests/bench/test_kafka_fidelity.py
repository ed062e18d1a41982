"""bench.kafka_fidelity without Kafka: what the clients' output says (throttled responses, the
Java tool's metrics), the rate and fullest window from the broker's end offsets, and each case's
medians against the fidelity bounds (rate 3%, worst window 0.05x, throttle per response 15%)."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.fidelity_clients import produce_statistics
from bench.fidelity_reading import (
    FAILED,
    REFUSED,
    Outcome,
    client_metrics,
    creations,
    fetch_positions,
    judge,
    longest_gap,
    responses,
    share_progress,
    throttles,
)
from bench.fidelity_table import gap, medians, rows_of, write_timeline
from bench.fidelity_workloads import CREATE_TOPICS, MUTATIONS, PARTITIONS, SCRAM_QUOTAS, SCRAM_TENANTS
from bench.kafka_fidelity import CASES, SHARE_CONSUME
from bench.many_connections import QUOTA, requests_sent, throttle_cb
from bench.shared_accuracy import SLIDING_S, fullest, fullest_between_readings
from devkit.producing import Timeline
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaResolver, QuotaStore

WORTH = QUOTA * SLIDING_S  # a window's worth of quota
STEP = 0.25


def test_each_throttled_response_the_java_client_logged_is_read_with_its_time() -> None:
    text = ("[2026-11-29 03:40:01,002] TRACE Connection to node 1 is throttled for 812 ms until "
            "timestamp 1764387601814 (org.apache.kafka.clients.NetworkClient)\n"
            "[2026-11-29 03:40:01,003] DEBUG Sending PRODUCE request with header ... "
            "(org.apache.kafka.clients.NetworkClient)\n"
            "[2026-11-29 03:40:02,900] TRACE Connection to node -1 is throttled for 0 ms until "
            "timestamp 1764387602900 (org.apache.kafka.clients.NetworkClient)\n"
            "[2026-11-29 03:40:03,001] TRACE Connection to node 1 is throttled for 1377 ms until "
            "timestamp 1764387604378 (org.apache.kafka.clients.NetworkClient)\n")
    assert throttles(text) == [812, 0, 1377]


def test_the_responses_of_the_quotas_api_the_java_client_logged_are_counted() -> None:
    def received(api: str) -> str:
        return (f"[2026-11-29 23:01:16,533] DEBUG [Producer clientId=bulk] Received {api} response "
                "from node 1 for request with header RequestHeader(apiKey=PRODUCE, ...): "
                "ProduceResponseData(..., throttleTimeMs=0) (org.apache.kafka.clients.NetworkClient)\n")
    text = (received("METADATA") + received("PRODUCE") + received("PRODUCE")
            + "[2026-11-29 23:01:16,519] DEBUG [Producer clientId=bulk] Sending PRODUCE request "
            "with header RequestHeader(apiKey=PRODUCE, ...) (org.apache.kafka.clients.NetworkClient)\n"
            + received("SHARE_FETCH") + received("FETCH"))
    assert (responses(text, "PRODUCE"), responses(text, "FETCH"), responses(text, "SHARE_FETCH"),
            responses(text, "CREATE_TOPICS")) == (2, 1, 1, 0)


def test_the_fetch_requests_librdkafkas_statistics_count_over_its_brokers() -> None:
    brokers = [{"nodeid": 1, "req": {"Fetch": 40, "Metadata": 2}}, {"nodeid": 2, "req": {"Fetch": 2}},
               {"nodeid": -1, "req": {"Metadata": 1}}]
    assert requests_sent(brokers, "Fetch") == 42
    assert requests_sent(brokers, "Produce") == 0


def test_the_throttle_per_response_counts_the_unthrottled_ones_as_nothing() -> None:
    # the same wait split two ways (perf-test at 1 KiB on Kafka's own broker, two runs in a row):
    # the mean of the throttled responses nearly halves, the throttle per response does not
    coarse = Outcome("java-producer-1k", "kafka", throttles=[60] * 923, responses=3700)
    fine = Outcome("java-producer-1k", "kafka", throttles=[33] * 1674, responses=3690)
    assert (coarse.mean_throttle, fine.mean_throttle) == (60, 33)
    assert coarse.throttle_per_response == pytest.approx(14.968, abs=1e-3)
    assert fine.throttle_per_response == pytest.approx(14.971, abs=1e-3)
    assert Outcome("c", "proxy", throttles=[60]).throttle_per_response is None  # not counted
    assert Outcome("c", "proxy", responses=10).throttle_per_response == 0.0


def test_print_metrics_lines_by_group_and_name_the_largest_over_tag_sets() -> None:
    text = """
Metric Name                                                              Value
producer-metrics:produce-throttle-time-avg:{client-id=bulk}            : 812.500
producer-metrics:produce-throttle-time-max:{client-id=bulk}            : 1377.000
producer-node-metrics:request-latency-max:{client-id=bulk, node-id=node--1} : 15.000
producer-node-metrics:request-latency-max:{client-id=bulk, node-id=node-1} : 2011.000
producer-metrics:record-error-rate:{client-id=bulk}                    : NaN
kafka-metrics-count:count:{client-id=bulk}                             : 112.000
producer-metrics:client-id:{client-id=bulk}                            : bulk
50000 records sent, 1130.2 records/sec (1.10 MB/sec)
"""
    assert client_metrics(text) == {
        "producer-metrics:produce-throttle-time-avg": 812.5,
        "producer-metrics:produce-throttle-time-max": 1377.0,
        "producer-node-metrics:request-latency-max": 2011.0,
        "kafka-metrics-count:count": 112.0,
    }


def fetch_line(stamp: str, offset: int) -> str:
    return (f"[2026-11-29 {stamp}] DEBUG [Consumer clientId=bulk, groupId=g] Sending FETCH request "
            "with header RequestHeader(apiKey=FETCH, apiVersion=17, clientId=bulk, correlationId=9) "
            "and timeout 30000 to node 1: FetchRequestData(clusterId=null, replicaId=-1, topics="
            "[FetchTopic(topic='', topicId=AAAAAAAAAAAAAAAAAAAAAA, partitions=[FetchPartition("
            f"partition=0, currentLeaderEpoch=0, fetchOffset={offset}, lastFetchedEpoch=-1, "
            "logStartOffset=-1, partitionMaxBytes=65536, replicaDirectoryId=AAAAAAAAAAAAAAAAAAAAAA)"
            "])]) (org.apache.kafka.clients.NetworkClient)")


def test_a_java_consumers_position_is_read_from_the_fetch_requests_it_logged() -> None:
    wall = datetime.strptime("2026-11-29 04:00:10,000", "%Y-%m-%d %H:%M:%S,%f").timestamp()
    # the run started at monotonic 500.0, which was wall time 04:00:10
    origin, wall_offset = 500.0, wall - 500.0
    log = "\n".join([
        fetch_line("04:00:10,500", 0),        # where it starts: nothing given yet
        fetch_line("04:00:11,000", 64),       # 64 records given
        "[2026-11-29 04:00:11,001] TRACE Connection to node 1 is throttled for 700 ms until "
        "timestamp 1 (org.apache.kafka.clients.NetworkClient)",
        fetch_line("04:00:11,750", 64),       # asked again after an empty (throttled) answer
        fetch_line("04:00:12,250", 128),
    ])
    tl = fetch_positions(log, origin, 1024, wall_offset)
    assert tl.marks == [(0.0, 0), (0.5, 0), (1.0, 64 * 1024), (2.25, 128 * 1024)]


def test_consumer_cases_are_judged_under_the_consumer_quota_producers_under_the_producer_one() -> None:
    assert {name: case.key for name, case in CASES.items()} == {
        "java-producer-1k": "producer_byte_rate", "java-producer-16k": "producer_byte_rate",
        "librdkafka-producer": "producer_byte_rate",
        "java-consumer-small": "consumer_byte_rate", "java-consumer-large": "consumer_byte_rate",
        "librdkafka-consumer-small": "consumer_byte_rate",
        "librdkafka-consumer-large": "consumer_byte_rate", "scram-precedence": "producer_byte_rate",
        "java-create-topics": "controller_mutation_rate", "three-brokers": "producer_byte_rate",
        "java-share-consumer": "consumer_byte_rate", "librdkafka-small-requests": "request_percentage"}
    # large fetches on Kafka's broker come ten seconds of quota at a time: those cases run longer
    assert {name for name, case in CASES.items() if case.longer > 1} == {
        "java-consumer-large", "librdkafka-consumer-large"}


def steady(rate: float, seconds: float, first: float = 1.0) -> Timeline:
    """`rate` bytes/s from `first`, read every 0.25 s."""
    t, marks = 0.0, []
    while t <= seconds:
        marks.append((t, int(max(0.0, t - first) * rate)))
        t = round(t + STEP, 6)
    return Timeline(marks)


def test_the_rate_is_counted_over_whole_windows_after_the_warm_up() -> None:
    out = judge(steady(1000.0, 60.0), Outcome("c", "kafka"), SLIDING_S)
    # From 12.25 s (the first byte read at 1.25 s, plus 11 s) to the last whole window before
    # 60 s: 56.25 s.
    assert out.span == (12.25, 56.25)
    assert out.rate == pytest.approx(1000.0, abs=1)
    assert out.worst == pytest.approx(11_000, abs=250)
    assert out.errors == []


def test_the_first_allowance_is_left_out_and_bytes_after_the_last_window_too() -> None:
    tl = steady(1000.0, 60.0)
    # 10 s of quota at once at the start, and a last burst after the last whole window
    tl.marks = [(t, n + (10_000 if t >= 1.25 else 0) + (30_000 if t >= 57 else 0)) for t, n in tl.marks]
    out = judge(tl, Outcome("c", "kafka"), SLIDING_S)
    assert out.span == (12.25, 56.25)
    assert out.rate == pytest.approx(1000.0, abs=1)


def test_a_run_too_short_for_a_whole_window_is_an_error_not_a_rate() -> None:
    out = judge(steady(1000.0, 20.0), Outcome("c", "proxy"), SLIDING_S)
    assert out.rate is None and out.worst is None
    assert out.errors == ["18.8 s from the first byte to the last: no whole 11 s window after "
                          "the 11 s warm-up"]
    nothing = judge(Timeline([(0.0, 0), (0.25, 0)]), Outcome("c", "proxy"), SLIDING_S)
    assert nothing.errors == ["the broker appended nothing"]


def outcome(path: str, rate: float, worst: float, told: list[int], case: str = "java-producer-1k") -> Outcome:
    return Outcome(case, path, rate=rate * QUOTA, worst=worst * WORTH, throttles=told)


def test_the_medians_of_each_path_and_a_gap_within_the_bounds() -> None:
    rows = medians([outcome("kafka", 1.10, 1.30, [100, 300]), outcome("proxy", 1.12, 1.31, [200, 240]),
                    outcome("kafka", 1.20, 1.40, [250]), outcome("proxy", 1.13, 1.36, [210]),
                    outcome("kafka", 1.12, 1.35, [190, 230]), outcome("proxy", 1.50, 1.50, [400])])
    assert rows == [
        # mean throttles 200, 250, 210 (median 210); 220, 210, 400 (median 220)
        ("java-producer-1k, kafka: median of 3",
         "1.120, worst 1.350x, mean throttle 210 ms (rates 1.100, 1.200, 1.120)"),
        ("java-producer-1k, proxy: median of 3",
         "1.130, worst 1.360x, mean throttle 220 ms (rates 1.120, 1.130, 1.500)"),
        # 1.130 / 1.120 - 1 = +0.9%; 1.360 - 1.350 = +0.010x; 220 / 210 - 1 = +4.8%
        ("java-producer-1k: proxy - Kafka",
         "rate +0.9%, worst +0.010x, mean throttle +4.8%: within 3%, 0.05x, 15%"),
    ]


def test_where_every_run_counted_its_responses_the_throttle_per_response_is_judged() -> None:
    def run(path: str, told: list[int], answered: int) -> Outcome:
        return Outcome("java-producer-1k", path, rate=0.987 * QUOTA, worst=0.987 * WORTH,
                       throttles=told, responses=answered)
    # Kafka's broker in its coarse split twice, the proxy in the fine one twice: the means of the
    # throttled responses are 45% apart (60 and 33 ms), the throttle per response 1.3%
    rows = medians([run("kafka", [60] * 9, 36), run("proxy", [33] * 16, 36),
                    run("kafka", [60] * 9, 36), run("proxy", [33] * 16, 36),
                    run("kafka", [33] * 16, 36), run("proxy", [60] * 9, 36)])
    assert rows == [
        ("java-producer-1k, kafka: median of 3",
         "0.987, worst 0.987x, throttle a response 15.0 ms (rates 0.987, 0.987, 0.987)"),
        ("java-producer-1k, proxy: median of 3",
         "0.987, worst 0.987x, throttle a response 14.7 ms (rates 0.987, 0.987, 0.987)"),
        ("java-producer-1k: proxy - Kafka",
         "rate +0.0%, worst +0.000x, throttle a response -2.2%: within 3%, 0.05x, 15%"),
    ]
    # one run without its responses counted: every path falls back to the throttled ones' mean
    rows = medians([run("kafka", [60] * 9, 36), run("proxy", [33] * 16, 36),
                    dataclasses.replace(run("proxy", [33] * 16, 36), responses=None)])
    assert rows[-1] == ("java-producer-1k: proxy - Kafka",
                        "rate +0.0%, worst +0.000x, mean throttle -45.0%: outside 3%, 0.05x, 15%")


def test_a_run_says_its_throttles_told_and_the_throttle_per_response() -> None:
    out = Outcome("java-producer-1k", "proxy", rate=0.987 * QUOTA, worst=0.987 * WORTH, span=(11.8, 55.8),
                  throttles=[60] * 9 + [30], responses=40, metrics={"produce-throttle-time-avg": 14.0})
    assert rows_of(out)[-1] == (
        "java-producer-1k, proxy, run 1: throttles told",
        "10 throttled, mean 57 ms, 14.2 ms a response of 40, the tool's produce-throttle-time-avg 14")


def test_a_gap_outside_any_bound_says_so() -> None:
    assert gap((1.00, 1.00, 200.0), (0.96, 1.00, 200.0)) == (
        "rate -4.0%, worst +0.000x, mean throttle +0.0%: outside 3%, 0.05x, 15%")
    assert gap((1.00, 0.99, 200.0), (1.00, 1.08, 200.0)) == (
        "rate +0.0%, worst +0.090x, mean throttle +0.0%: outside 3%, 0.05x, 15%")
    assert gap((1.00, 1.00, 200.0), (1.00, 1.00, 240.0)) == (
        "rate +0.0%, worst +0.000x, mean throttle +20.0%: outside 3%, 0.05x, 15%")
    # a path never throttled cannot be said to match the other's throttles
    assert gap((1.00, 1.00, None), (1.00, 1.00, 240.0)) == (
        "rate +0.0%, worst +0.000x, mean throttle not compared (no throttles on a path): "
        "outside 3%, 0.05x, 15%")


def test_a_run_without_a_rate_is_left_out_of_the_medians() -> None:
    failed = Outcome("librdkafka-producer", "proxy", errors=["the broker appended nothing"])
    rows = medians([failed, outcome("proxy", 0.99, 1.05, [], "librdkafka-producer")])
    assert rows == [("librdkafka-producer, proxy: median of 1",
                     "0.990, worst 1.050x, mean throttle - (rates 0.990)")]


def test_the_longest_time_the_end_offsets_went_unread() -> None:
    assert longest_gap(Timeline([(0.0, 0), (0.25, 10), (2.75, 30), (3.0, 40)])) == (2.5, 0.25)
    assert longest_gap(Timeline([(0.0, 0)])) == (0.0, 0.0)


def test_a_tenant_is_judged_against_its_own_quota() -> None:
    half = QUOTA / 2
    runs = [Outcome("scram-user-client", "kafka", rate=half * 1.02, worst=half * SLIDING_S * 1.08,
                    throttles=[900], quota=half),
            Outcome("scram-user-client", "proxy", rate=half * 1.01, worst=half * SLIDING_S * 1.09,
                    throttles=[920], quota=half)]
    assert medians(runs) == [
        ("scram-user-client, kafka: median of 1", "1.020, worst 1.080x, mean throttle 900 ms (rates 1.020)"),
        ("scram-user-client, proxy: median of 1", "1.010, worst 1.090x, mean throttle 920 ms (rates 1.010)"),
        ("scram-user-client: proxy - Kafka",
         "rate -1.0%, worst +0.010x, mean throttle +2.2%: within 3%, 0.05x, 15%"),
    ]


def entity(args: tuple[str, ...]) -> QuotaEntity:
    """kafka-configs' --entity-type/--entity-name/--entity-default arguments as a quota entity."""
    named: dict[str, str] = {}
    i = 0
    while i < len(args):
        kind = args[i + 1]
        if args[i + 2] == "--entity-default":
            named[kind], i = DEFAULT, i + 3
        else:
            named[kind], i = args[i + 3], i + 4
    return QuotaEntity(user=named.get("users"), client_id=named.get("clients"))


def test_each_scram_tenant_share_is_the_one_kip_55_precedence_picks() -> None:
    """The shares the SCRAM case judges each producer against are the quotas the proxy's own
    resolver picks from SCRAM_QUOTAS, and no two entities that could match a tenant give the same
    share: a wrong precedence shows as a rate off by a quarter or more."""
    store = QuotaStore({entity(args): {QuotaKey.PRODUCER_BYTE_RATE: QUOTA * share}
                        for args, share in SCRAM_QUOTAS})
    resolver = QuotaResolver(store, QuotaKey.PRODUCER_BYTE_RATE)
    assert [resolver.resolve(t.user, t.client_id).quota for t in SCRAM_TENANTS] == [
        QUOTA * t.share for t in SCRAM_TENANTS]
    assert len({share for _, share in SCRAM_QUOTAS}) == len(SCRAM_QUOTAS)


def test_the_partitions_created_over_time_and_the_refusals_from_create_topics_loop() -> None:
    text = ("12 created fidelity-0\n"
            "240 created fidelity-1\n"
            "251 refused 188\n"
            "450 created fidelity-2\n"
            "700 error TopicExistsException Topic 'fidelity-3' already exists.\n")
    assert creations(text, 2).marks == [(0.0, 0), (0.012, 2), (0.24, 4), (0.45, 6)]
    assert [int(m.group(2)) for m in REFUSED.finditer(text)] == [188]
    assert [m.group(1) for m in FAILED.finditer(text)] == [
        "TopicExistsException Topic 'fidelity-3' already exists."]


def test_the_mutations_case_creates_topics_under_the_controller_mutation_quota() -> None:
    case = CASES["java-create-topics"]
    assert (case.key, case.client) == ("controller_mutation_rate", "java")
    assert CREATE_TOPICS.is_file()
    # five topics a second: a window holds 55, so one topic more or less is under 2% of it
    assert MUTATIONS / PARTITIONS * SLIDING_S == 55


def test_one_budget_across_three_brokers_is_reported_after_the_two_paths_and_compared_with_neither() -> None:
    three = QUOTA * 3
    runs = [Outcome("three-brokers", "proxy-cluster", rate=QUOTA * 1.01, worst=WORTH * 1.04, throttles=[500]),
            Outcome("three-brokers", "proxy", rate=three * 0.99, worst=three * SLIDING_S * 1.03,
                    throttles=[480], quota=three),
            Outcome("three-brokers", "kafka", rate=three * 1.00, worst=three * SLIDING_S * 1.05,
                    throttles=[500], quota=three)]
    assert medians(runs) == [
        ("three-brokers, kafka: median of 1", "1.000, worst 1.050x, mean throttle 500 ms (rates 1.000)"),
        ("three-brokers, proxy: median of 1", "0.990, worst 1.030x, mean throttle 480 ms (rates 0.990)"),
        ("three-brokers, proxy-cluster: median of 1",
         "1.010, worst 1.040x, mean throttle 500 ms (rates 1.010)"),
        ("three-brokers: proxy - Kafka",
         "rate -1.0%, worst -0.020x, mean throttle -4.0%: within 3%, 0.05x, 15%"),
    ]


def test_what_share_consume_loop_was_given_over_time() -> None:
    text = ("[2026-11-29 07:08:08,724] DEBUG Received SHARE_FETCH response ...\n"
            "6299 990208\n"
            "6338 1980416\n"
            "36452 10892288\n")
    assert share_progress(text).marks == [(0.0, 0), (6.299, 990208), (6.338, 1980416), (36.452, 10892288)]
    assert SHARE_CONSUME.is_file()


def test_produce_requests_and_mean_batch_from_every_interval_of_librdkafka_statistics() -> None:
    def stats(produce: list[int], sum_: int, cnt: int) -> str:
        brokers = {f"b{i}": {"nodeid": i + 1, "req": {"Produce": n, "Metadata": 3}}
                   for i, n in enumerate(produce)}
        brokers["bootstrap"] = {"nodeid": -1, "req": {"Produce": 0, "Metadata": 1}}
        return json.dumps({"brokers": brokers, "topics": {"t": {"batchsize": {"sum": sum_, "cnt": cnt}}}})
    # the request counters are cumulative, each interval's batch window its own
    texts = [stats([10, 5], 300_000, 3), stats([30, 20], 100_000, 2)]
    assert produce_statistics(texts) == {"produce-requests": 50, "batch-avg-bytes": 80_000}
    assert produce_statistics(texts, per_broker=True) == {
        "produce-requests": 50, "batch-avg-bytes": 80_000, "produce-requests-1": 30, "produce-requests-2": 20}
    assert produce_statistics([]) == {}


def test_throttles_told_are_kept_by_broker_where_asked() -> None:
    told: list[int] = []
    by_broker: dict[int, list[int]] = {}
    callback = throttle_cb(told, by_broker)
    for broker_id, seconds in ((1, 0.25), (2, 0.0), (2, 0.4), (1, 0.1)):
        callback(SimpleNamespace(broker_id=broker_id, throttle_time=seconds))
    assert told == [250, 400, 100]  # not the 0 ms that says the throttling stopped
    assert by_broker == {1: [250, 100], 2: [400]}


def test_requests_per_second_are_printed_as_they_are_and_compared_relatively() -> None:
    runs = [Outcome("librdkafka-small-requests", "kafka", rate=415.0, worst=459.5 * SLIDING_S,
                    throttles=[23], quota=1, unit="requests/s"),
            Outcome("librdkafka-small-requests", "proxy", rate=124.8, worst=132.9 * SLIDING_S,
                    throttles=[74], quota=1, unit="requests/s")]
    assert medians(runs) == [
        ("librdkafka-small-requests, kafka: median of 1",
         "415.0 requests/s, fullest window 459.5, mean throttle 23 ms (rates 415.000)"),
        ("librdkafka-small-requests, proxy: median of 1",
         "124.8 requests/s, fullest window 132.9, mean throttle 74 ms (rates 124.800)"),
        ("librdkafka-small-requests: proxy - Kafka",
         "rate -69.9%, fullest window -71.1%, mean throttle +221.7%: outside 3%, 0.05x, 15%"),
    ]


def test_timelines_are_written_to_the_microsecond(tmp_path: Path) -> None:
    # A reading 0.4 ms after the step it belongs to: rounded to the millisecond, a window that
    # ends on that step would count it, and a run's fullest window moved from 0.995x to 1.276x.
    timeline = Timeline()
    timeline.marks = [(0.0004, 0), (23.7504, 22_950_000), (24.0004, 30_460_000)]
    out = Outcome("java-producer-16k", "proxy", round=0, timeline=timeline)
    write_timeline(tmp_path, out)
    text = (tmp_path / "java-producer-16k-proxy-1.csv").read_text()
    assert text == "seconds,so_far\n0.000400,0\n23.750400,22950000\n24.000400,30460000\n"
    read = [(float(t), int(n)) for t, n in (line.split(",") for line in text.splitlines()[1:])]
    assert read == timeline.marks


def test_a_burst_before_the_window_is_not_counted_with_the_next_one() -> None:
    # Bursts of 10 MB landing at 23.9 s and 35.0 s, 11.1 s apart: no 11 s window holds both. End
    # offsets read every 0.25 s, one reading 0.5 ms early. The window stepped from 24.00075 s
    # counts from the last reading before it, at 23.751 s, to the one at 35.0005 s: 11.2495 s,
    # both bursts. Between readings no more than 11 s apart it is one burst.
    def so_far(t: float) -> int:
        return 10_000_000 * ((t >= 23.9) + (t >= 35.0) + (t >= 47.0))

    times = [k * 0.25 + 0.001 for k in range(200)]
    times[140] = 35.0005
    marks = [(t, so_far(t)) for t in times]
    timeline = Timeline()
    timeline.marks = marks
    assert fullest(timeline.at, 12.00075, 46.00075)[0] == 20_000_000
    assert fullest_between_readings(marks, 12.00075, 46.00075)[0] == 10_000_000
    # judge's span starts at the first bytes (24.001 s here) and ends at a whole window
    out = judge(timeline, Outcome("java-producer-16k", "proxy"), warm_up=0.0, between_readings=True)
    assert out.span is not None and out.worst == fullest_between_readings(marks, *out.span)[0]


def test_the_fullest_between_readings_is_a_steady_flows_window() -> None:
    # 1 MB/s read every 50 ms: a window's worth between readings 11 s apart, wherever it starts.
    marks = [(i * 0.05, i * 50_000) for i in range(0, 1201)]
    worst, at = fullest_between_readings(marks, 5.0, 60.0)
    assert worst == 11_000_000 and at == pytest.approx(5.0)
