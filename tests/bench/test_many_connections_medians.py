"""bench.many_connections --runs: each case's medians per path, and the proxy's gap from Kafka's
broker against the fidelity bounds (rate within 3%, worst window within 0.05x), as the clients
saw them and, for producers, as the broker appended them; and the clients' own counts."""

from __future__ import annotations

import json

from bench.many_connections import QUOTA, Result, client_counts, medians
from bench.shared_accuracy import SLIDING_S

WORTH = QUOTA * SLIDING_S  # a window's worth of quota


def result(path: str, rate: float, worst: float, kind: str = "produce", clients: int = 3) -> Result:
    return Result(path, kind, clients, rate * QUOTA, worst * WORTH, 0, 11.0)


def test_the_medians_of_each_path_and_a_gap_within_the_bounds() -> None:
    rows = medians([result("kafka", 1.10, 1.30), result("proxy", 1.12, 1.31),
                    result("kafka", 1.20, 1.40), result("proxy", 1.13, 1.36),
                    result("kafka", 1.12, 1.35), result("proxy", 1.50, 1.50)])
    assert rows == [
        ("produce, 3 producers, kafka: median of 3", "1.120, worst 1.350x (rates 1.100, 1.200, 1.120)"),
        ("produce, 3 producers, proxy: median of 3", "1.130, worst 1.360x (rates 1.120, 1.130, 1.500)"),
        # 1.130 / 1.120 - 1 = +0.9%; 1.360 - 1.350 = +0.010x
        ("produce, 3 producers: proxy - Kafka", "rate +0.9%, worst +0.010x: within 3% and 0.05x"),
    ]


def test_a_gap_outside_either_bound_says_so() -> None:
    rate_off = medians([result("kafka", 1.00, 1.00), result("proxy", 0.96, 1.00)])
    assert rate_off[-1] == ("produce, 3 producers: proxy - Kafka",
                            "rate -4.0%, worst +0.000x: outside 3% and 0.05x")
    window_off = medians([result("kafka", 1.00, 0.99, "consume"), result("proxy", 1.00, 1.08, "consume")])
    assert window_off[-1] == ("consume, 3 consumers: proxy - Kafka",
                              "rate +0.0%, worst +0.090x: outside 3% and 0.05x")


def test_one_path_alone_has_medians_and_no_gap() -> None:
    rows = medians([result("proxy", 0.99, 1.05, clients=10), result("proxy", 0.98, 1.07, clients=10)])
    assert rows == [("produce, 10 producers, proxy: median of 2",
                     "0.985, worst 1.060x (rates 0.990, 0.980)")]


def test_producers_have_the_brokers_view_beside_the_clients() -> None:
    def appended(path: str, rate: float, worst: float, at_broker: float, worst_at_broker: float) -> Result:
        r = result(path, rate, worst)
        r.appended, r.appended_worst = at_broker * QUOTA, worst_at_broker * WORTH
        return r

    rows = medians([appended("kafka", 1.10, 1.30, 1.20, 1.40), appended("proxy", 1.10, 1.30, 1.26, 1.50)])
    assert rows[-3:] == [
        ("produce, 3 producers, kafka at the broker: median of 1", "1.200, worst 1.400x (rates 1.200)"),
        ("produce, 3 producers, proxy at the broker: median of 1", "1.260, worst 1.500x (rates 1.260)"),
        # 1.26 / 1.20 - 1 = +5.0%; 1.50 - 1.40 = +0.100x
        ("produce, 3 producers at the broker: proxy - Kafka",
         "rate +5.0%, worst +0.100x: outside 3% and 0.05x"),
    ]
    assert rows[2] == ("produce, 3 producers: proxy - Kafka",
                       "rate +0.0%, worst +0.000x: within 3% and 0.05x")


def test_a_clients_counts_are_its_last_statistics_over_every_broker_it_knew() -> None:
    first = {"brokers": {"b:9092/bootstrap": {"req_timeouts": 0, "connects": 1, "req": {"Produce": 0}}}}
    last = {"brokers": {"b:9092/bootstrap": {"req_timeouts": 0, "connects": 1, "req": {"Produce": 0}},
                        "b:9092/1": {"nodeid": 1, "req_timeouts": 7, "connects": 3, "req": {"Produce": 40}}}}
    assert client_counts([json.dumps(first), json.dumps(last)]) == (7, 4, 40)
    assert client_counts([]) == (0, 0, 0)
