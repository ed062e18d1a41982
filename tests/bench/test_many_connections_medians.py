"""bench.many_connections --runs: each case's medians per path, and the proxy's gap from Kafka's
broker against the fidelity bounds (rate within 3%, worst window within 0.05x)."""

from __future__ import annotations

from bench.many_connections import QUOTA, Result, medians
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
