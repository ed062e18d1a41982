"""bench.shared_accuracy's options for issue 27's fleet runs: the same demand through fewer
replicas (`--clients`), another enforcement (`--set`), and `--workers`."""

from __future__ import annotations

import pytest

from bench.shared_accuracy import fleet_config, replica_of, run_name, settings


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
