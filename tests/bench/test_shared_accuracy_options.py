"""bench.shared_accuracy's options for issue 27's fleet runs: the same demand through fewer
replicas (`--clients`), another enforcement (`--set`), and `--workers`."""

from __future__ import annotations

import pytest

from bench.shared_accuracy import fleet_config, replica_of, run_name, settings, traffic


def test_the_fleet_config_enforces_one_quota_through_the_store() -> None:
    config = fleet_config("redis://127.0.0.1:7000", "p1", "produce")
    assert config == {"quota": {"scope": "cluster"},
                      "quotas": [{"client-id": "shared-tenant", "producer_byte_rate": 1024 * 1024}],
                      "store": {"url": "redis://127.0.0.1:7000", "key_prefix": "p1"}}


def test_settings_go_under_quota_and_workers_beside_it() -> None:
    config = fleet_config("redis://h:1", "p2", "consume", {"byte_rate_enforcement": "paced"}, workers=2)
    assert config["quota"] == {"scope": "cluster", "byte_rate_enforcement": "paced"}
    assert config["quotas"] == [{"client-id": "shared-tenant", "consumer_byte_rate": 1024 * 1024}]
    assert config["workers"] == 2


def test_store_settings_go_under_store_beside_its_url() -> None:
    config = fleet_config("redis://h:1", "p3", "produce", store={"sync_interval_ms": 20})
    assert config["store"] == {"url": "redis://h:1", "key_prefix": "p3", "sync_interval_ms": 20}


def test_clients_spread_over_the_replicas_in_turn() -> None:
    assert [replica_of(i, 3) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [replica_of(i, 1) for i in range(3)] == [0, 0, 0]


def test_a_run_is_named_by_its_fleet() -> None:
    assert run_name("produce", 3, 1, 3, "even") == "produce, 3 replicas, even"
    assert run_name("produce", 1, 1, 3, "even") == "produce, 1 replica, 3 clients, even"
    assert run_name("consume", 1, 2, 10, "skewed") == "consume, 1 replica of 2 workers, 10 clients, skewed"


def test_set_reads_values_as_the_config_file_would() -> None:
    assert settings(["byte_rate_enforcement=paced", "window_num=11"]) == {
        "byte_rate_enforcement": "paced", "window_num": 11}
    assert settings([]) == {}


@pytest.mark.parametrize("item", ["paced", "=paced"])
def test_a_setting_without_a_key_and_value_is_refused_clearly(item: str) -> None:
    with pytest.raises(SystemExit, match="expected KEY=VALUE"):
        settings([item])


def test_the_refusal_names_the_option_it_came_from() -> None:
    with pytest.raises(SystemExit, match="--proxy-quota 'paced': expected KEY=VALUE"):
        settings(["paced"], "--proxy-quota")


class _Scraped:
    """A replica as `traffic` reads it: its /metrics text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def metrics(self) -> str:
        return self.text


def _replica(fetches: int, latency_s: float, throttled: int, throttle_ms: int, syncs: int,
             sync_s: float) -> _Scraped:
    p = "kafka_quota_proxy_"
    return _Scraped(f"""# TYPE {p}requests counter
{p}requests_total{{api="Fetch"}} {fetches}
{p}requests_total{{api="Produce"}} 1000
# TYPE {p}upstream_latency_seconds histogram
{p}upstream_latency_seconds_bucket{{api="Fetch",le="+Inf"}} {fetches}
{p}upstream_latency_seconds_count{{api="Fetch"}} {fetches}
{p}upstream_latency_seconds_sum{{api="Fetch"}} {latency_s}
{p}upstream_latency_seconds_bucket{{api="Produce",le="+Inf"}} 1000
{p}upstream_latency_seconds_count{{api="Produce"}} 1000
{p}upstream_latency_seconds_sum{{api="Produce"}} 99.0
# TYPE {p}throttled_requests counter
{p}throttled_requests_total{{client_id="shared-tenant",quota_type="fetch",user=""}} {throttled}
{p}throttled_requests_total{{client_id="shared-tenant",quota_type="request",user=""}} 77
# TYPE {p}throttle_time_ms counter
{p}throttle_time_ms_total{{client_id="shared-tenant",quota_type="fetch",user=""}} {throttle_ms}
{p}throttle_time_ms_total{{client_id="shared-tenant",quota_type="request",user=""}} 7777
# TYPE {p}store_sync_duration_seconds histogram
{p}store_sync_duration_seconds_bucket{{le="+Inf"}} {syncs}
{p}store_sync_duration_seconds_count {syncs}
{p}store_sync_duration_seconds_sum {sync_s}
""")


def test_traffic_sums_the_replicas_and_averages_over_their_requests() -> None:
    # Two replicas: 100 + 300 fetches taking 2 s + 6 s at the broker (20 ms each), 40 + 10
    # throttled for 30,000 ms in all (600 ms each), 900 + 100 syncs of 1.5 s in all (1.5 ms).
    # Another API's requests and another quota's throttles are not counted.
    seen = traffic([_replica(100, 2.0, 40, 20_000, 900, 1.0),
                    _replica(300, 6.0, 10, 10_000, 100, 0.5)], "consume")
    assert seen == pytest.approx({"requests": 400, "broker ms": 20.0, "throttled": 50,
                                  "throttle ms": 600.0, "syncs": 1000, "sync ms": 1.5})


def test_traffic_of_a_replica_that_saw_nothing_is_zero_not_a_division_by_zero() -> None:
    seen = traffic([_Scraped("")], "produce")
    assert seen == {"requests": 0.0, "broker ms": 0.0, "throttled": 0.0, "throttle ms": 0.0,
                    "syncs": 0.0, "sync ms": 0.0}
