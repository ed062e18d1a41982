"""`--workers N` without processes: the setting, the merge of the workers' metrics, and the
errors that stop the supervisor before any worker starts (tests/integration/test_workers.py runs
the real thing)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from devkit.processes import free_port
from kafka_quota_proxy.cli.main import main
from kafka_quota_proxy.config import merge
from kafka_quota_proxy.config.settings import parse_values
from kafka_quota_proxy.config.worker_settings import WorkerRole, parse_worker_role
from kafka_quota_proxy.proxy.server import Proxy
from kafka_quota_proxy.proxy.workers.merge import (
    MAX,
    RULES,
    SUM,
    Retired,
    _by_source,
    _max_if_shared,
    rule_for,
)
from kafka_quota_proxy.proxy.workers.merge import merge as merge_metrics

P = "kafka_quota_proxy_"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def families(text: str) -> list:
    return list(text_string_to_metric_families(text))


def render(metrics: list) -> str:
    class Registry:
        def collect(self):  # noqa: ANN202 - what generate_latest asks of a registry
            return iter(metrics)
    return generate_latest(Registry()).decode()  # type: ignore[arg-type]


# -- the setting ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "x", "2.5", "1025"])
def test_a_bad_workers_flag_is_one_config_error_line_and_exit_2(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--upstream", "b:9092", "--workers", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("kafka-quota-proxy: config error: --workers: expected ")


@pytest.mark.parametrize("value", ["0", "-1", "x", "true"])
def test_a_bad_workers_key_is_one_config_error_line_and_exit_2(
        value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"upstream: b:9092\nworkers: {value}\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{path}: workers: expected a whole number >= 1" in err


def test_workers_defaults_to_one_and_check_config_says_how_many(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert merge(parse_values({"upstream": "b:9092"})).workers == 1
    path = tmp_path / "p.yaml"
    path.write_text("upstream: b:9092\nworkers: 4\n")
    assert main(["check-config", str(path)]) == 0
    assert "  4 worker processes sharing these ports, one /metrics merging them\n" in capsys.readouterr().out


def test_check_config_says_the_workers_share_the_store_their_supervisor_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("upstream: b:9092\nworkers: 2\n")
    assert main(["check-config", str(path)]) == 0
    assert ("  quota state: shared by the workers through a Valkey the supervisor starts (no store:)\n"
            in capsys.readouterr().out)


@pytest.fixture
def no_store_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """An install without redis (a None in sys.modules makes its import fail)."""
    for name in ("redis", "redis.asyncio"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("config", ["workers: 2\n", "store:\n  url: redis://127.0.0.1:1\n"])
def test_without_the_store_client_a_proxy_that_needs_a_store_does_not_start(
        config: str, no_store_client: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"upstream: 127.0.0.1:1\nlisten: 127.0.0.1:{free_port()}\n{config}")
    assert main(["check-config", str(path)]) == 1
    assert ("  error: the quota store's client (store:, workers) needs the Python package 'redis', "
            "which this install lacks" in capsys.readouterr().out)
    assert main(["--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kafka-quota-proxy: cannot start: the quota store's client (store:, workers) "
                          "needs the Python package 'redis'")
    assert err.count("\n") == 1


def test_without_the_store_client_a_proxy_without_a_store_still_checks(
        no_store_client: None, tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("upstream: b:9092\n")
    assert main(["check-config", str(path)]) == 0


def test_a_worker_role_survives_the_command_line() -> None:
    role = WorkerRole(1, 2, 4242, "/tmp/x/w1.metrics", "unix:///tmp/x/valkey.sock")
    assert parse_worker_role(role.encode()) == role
    assert role.name == "w1"


def test_a_port_in_use_stops_the_supervisor_with_one_line_and_exit_1(
        capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        status = main(["--upstream", "127.0.0.1:1", "--listen", f"127.0.0.1:{port}", "--workers", "2"])
    assert status == 1
    err = capsys.readouterr().err
    assert err == f"kafka-quota-proxy: cannot start: listen 127.0.0.1:{port}: Address already in use\n"


# -- the merged /metrics -------------------------------------------------------------------------


def full_proxy(tmp_path: Path) -> Proxy:
    """A proxy with every metric family on: quotas, usage log, a store (none of them started)."""
    settings = merge(parse_values({
        "upstream": "127.0.0.1:1", "listen": "127.0.0.1:1", "store": {"url": "redis://127.0.0.1:1"},
        "usage_log": {"dir": str(tmp_path / "usage")},
        "quotas": [{"user": "alice", "producer_byte_rate": 1000, "producer_ids_rate": 10}],
        "quota": {"state_file": str(tmp_path / "state.json")},
    }))
    return Proxy(settings)


def test_every_metric_a_proxy_exports_has_a_merge_rule(tmp_path: Path) -> None:
    names = {f.name for f in families(generate_latest(full_proxy(tmp_path).metrics.registry).decode())}
    assert names, "no metrics"
    missing = sorted(n for n in names if n not in RULES and not n.endswith("_created"))
    assert missing == []
    assert sorted(set(RULES) - names) == []  # and no rule for a metric that is gone


def test_every_merge_rule_is_documented() -> None:
    """docs/metrics.md, "With --workers": a row names each metric (in full, or `..._rest` after
    one in full) and its rule."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()
    section = text.split("## With `--workers`", 1)[1]
    documented: dict[str, str] = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        for name in cells[0].replace("`", "").split(", "):
            full = P + name.removeprefix("...").removeprefix("_") if name.startswith("...") else name
            documented[full.removesuffix("_total")] = cells[1]
    words = {_by_source: "sum for `source=\"api\"`, max for `file` and `store`",
             _max_if_shared: "sum; max with a `store:`"}
    for name, rule in RULES.items():
        assert name in documented, name
        assert documented[name] == words.get(rule, rule), name  # type: ignore[call-overload]


def test_one_worker_merged_alone_is_itself(tmp_path: Path) -> None:
    proxy = full_proxy(tmp_path)
    proxy.metrics.connections_accepted.inc(3)
    proxy.metrics.api(0).observe_latency(0.003)
    text = generate_latest(proxy.metrics.registry).decode()
    assert samples(render(merge_metrics([families(text)]))) == samples(text)


WORKER_0 = f"""# HELP {P}requests_total r
# TYPE {P}requests_total counter
{P}requests_total{{api="Produce"}} 10.0
# HELP {P}upstream_latency_seconds l
# TYPE {P}upstream_latency_seconds histogram
{P}upstream_latency_seconds_bucket{{api="Produce",le="0.001"}} 4.0
{P}upstream_latency_seconds_bucket{{api="Produce",le="+Inf"}} 10.0
{P}upstream_latency_seconds_count{{api="Produce"}} 10.0
{P}upstream_latency_seconds_sum{{api="Produce"}} 0.5
# HELP {P}connections_open c
# TYPE {P}connections_open gauge
{P}connections_open 3.0
# HELP {P}quota_limit q
# TYPE {P}quota_limit gauge
{P}quota_limit{{client_id="",quota_type="producer_byte_rate",scope="broker-1",user="alice"}} 1000.0
# HELP {P}quota_changes_total q
# TYPE {P}quota_changes_total counter
{P}quota_changes_total{{outcome="accepted",source="file"}} 2.0
{P}quota_changes_total{{outcome="accepted",source="api"}} 1.0
# HELP {P}producer_id_false_positive_rate f
# TYPE {P}producer_id_false_positive_rate gauge
{P}producer_id_false_positive_rate{{scope="broker-1",user="alice"}} 0.001
# HELP {P}connections_accepted_created c
# TYPE {P}connections_accepted_created gauge
{P}connections_accepted_created 200.0
"""
WORKER_1 = (WORKER_0.replace("} 10.0", "} 5.0").replace("open 3.0", "open 4.0")
            .replace('le="0.001"} 4.0', 'le="0.001"} 1.0').replace("0.5", "0.25")
            .replace("} 0.001", "} 0.004").replace("created 200.0", "created 100.0"))


def test_counts_add_up_configuration_does_not_and_estimates_take_the_worst() -> None:
    merged = samples(render(merge_metrics([families(WORKER_0), families(WORKER_1)])))
    assert merged[(P + "requests_total", (("api", "Produce"),))] == 15.0
    assert merged[(P + "upstream_latency_seconds_count", (("api", "Produce"),))] == 15.0
    assert merged[(P + "upstream_latency_seconds_sum", (("api", "Produce"),))] == 0.75
    assert merged[(P + "connections_open", ())] == 7.0
    assert merged[(P + "quota_limit", (("client_id", ""), ("quota_type", "producer_byte_rate"),
                                       ("scope", "broker-1"), ("user", "alice")))] == 1000.0
    assert merged[(P + "quota_changes_total", (("outcome", "accepted"), ("source", "file")))] == 2.0
    assert merged[(P + "quota_changes_total", (("outcome", "accepted"), ("source", "api")))] == 2.0
    fp_rate = (P + "producer_id_false_positive_rate", (("scope", "broker-1"), ("user", "alice")))
    assert merged[fp_rate] == 0.004
    assert merged[(P + "connections_accepted_created", ())] == 100.0
    assert rule_for(P + "quota_changes", {"source": "file"}) == MAX
    assert rule_for(P + "quota_changes", {"source": "store"}) == MAX
    assert rule_for(P + "quota_changes", {"source": "api"}) == SUM


def test_with_a_store_a_shared_rate_is_every_workers_and_its_local_parts_add_up() -> None:
    def worker(rate: float, local: float) -> list:
        labels = 'client_id="",quota_type="producer_byte_rate",scope="broker-1",user="alice"'
        return families(f"""# HELP {P}byte_rate b
# TYPE {P}byte_rate gauge
{P}byte_rate{{{labels}}} {rate}
# HELP {P}byte_rate_local b
# TYPE {P}byte_rate_local gauge
{P}byte_rate_local{{{labels}}} {local}
""")
    key = (("client_id", ""), ("quota_type", "producer_byte_rate"), ("scope", "broker-1"), ("user", "alice"))
    alone = samples(render(merge_metrics([worker(300.0, 100.0), worker(310.0, 200.0)])))
    assert alone[(P + "byte_rate", key)] == 610.0
    shared = samples(render(merge_metrics([worker(300.0, 100.0), worker(310.0, 200.0)], shared=True)))
    assert shared[(P + "byte_rate", key)] == 310.0  # the largest view of one global rate
    assert shared[(P + "byte_rate_local", key)] == 300.0


def test_a_dead_workers_counts_carry_on_and_its_gauges_do_not() -> None:
    retired = Retired()
    retired.add(families(WORKER_1))
    merged = samples(render(merge_metrics([families(WORKER_0)], retired)))
    assert merged[(P + "requests_total", (("api", "Produce"),))] == 15.0
    assert merged[(P + "upstream_latency_seconds_bucket", (("api", "Produce"), ("le", "0.001")))] == 5.0
    assert merged[(P + "connections_open", ())] == 3.0  # a gauge of a dead worker is gone
    assert merged[(P + "quota_changes_total", (("outcome", "accepted"), ("source", "file")))] == 2.0
    assert merged[(P + "quota_changes_total", (("outcome", "accepted"), ("source", "api")))] == 2.0
    # With no worker serving at all, the retired counts are still shown.
    alone = samples(render(merge_metrics([], retired)))
    assert alone[(P + "requests_total", (("api", "Produce"),))] == 5.0
