"""Quotas from the config file and the state file, and reloads, in-process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.processes import free_port
from kafka_quota_proxy.config import load_file, merge
from kafka_quota_proxy.proxy.reload import reload_config
from kafka_quota_proxy.quota.entities import QuotaEntity
from tests.proxy.conftest import (
    Harness,
    serving,
)
from tests.proxy.quota_support import (
    PRODUCE_QUOTA,
    Script,
    alter,
    alter_results,
    connect,
    describe,
    entries,
    freeze,
    kafka_throttle,
    metric,
    produce,
    run,
)
from tests.support.fake_broker import NODE_ID, FakeBroker

# --- the config file, the state file, reload ----------------------------------------------------

def write_config(path: Path, broker: FakeBroker, listen: int, node: int, **extra: Any) -> None:
    values = {"upstream": [f"127.0.0.1:{broker.port}"], "listen": f"127.0.0.1:{listen}",
              "node_ports": {NODE_ID: node}, **extra}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(values), encoding="utf-8")
    tmp.replace(path)  # atomic, so the proxy's own watcher never sees half a file


@asynccontextmanager
async def from_file(path: Path, broker: FakeBroker) -> AsyncIterator[Harness]:
    settings = merge(load_file(path))
    assert settings.config_path == str(path)
    async with serving(settings, broker) as h:
        yield h


def effective(h: Harness) -> dict[QuotaEntity, dict[str, float]]:
    return {e: {k.value: v for k, v in values.items()} for e, values in h.proxy.quotas.entries().items()}


C, D, E = QuotaEntity(client_id="c"), QuotaEntity(client_id="d"), QuotaEntity(client_id="e")


def test_api_quotas_persist_and_layer_over_the_file(tmp_path: Path) -> None:
    script = Script()
    path = tmp_path / "proxy.yaml"
    state = tmp_path / "proxy.yaml.quota-state.json"

    async def scenario() -> None:
        broker = await FakeBroker(script).start()
        listen, node = free_port(), free_port()
        write_config(path, broker, listen, node, quotas=[
            {"client-id": "c", "producer_byte_rate": 500, "consumer_byte_rate": 4000},
            {"client-id": "d", "producer_byte_rate": 700}])
        async with from_file(path, broker) as h:
            assert effective(h) == {C: {"producer_byte_rate": 500, "consumer_byte_rate": 4000},
                                    D: {"producer_byte_rate": 700}}
            assert not state.exists()
            c = await connect(h)
            result = await c.call(alter([
                ([("client-id", "c")], [("producer_byte_rate", 800.0, False),
                                        ("consumer_byte_rate", 0.0, True)]),
                ([("client-id", "e")], [("producer_byte_rate", 900.0, False)])]))
            assert alter_results(result) == [(0, None), (0, None)]
            assert effective(h) == {C: {"producer_byte_rate": 800}, D: {"producer_byte_rate": 700},
                                    E: {"producer_byte_rate": 900}}
            saved = json.loads(state.read_text())
            assert saved == {"version": 1, "entities": [
                {"entity": {"client-id": "c"}, "values": {"producer_byte_rate": 800.0},
                 "removed": ["consumer_byte_rate"]},
                {"entity": {"client-id": "e"}, "values": {"producer_byte_rate": 900.0}, "removed": []}]}
            c.close()

        # A new proxy from the same file: the API's quotas are in force again.
        async with from_file(path, broker) as h:
            freeze(h)
            assert effective(h) == {C: {"producer_byte_rate": 800}, D: {"producer_byte_rate": 700},
                                    E: {"producer_byte_rate": 900}}
            c = await connect(h)
            size = 8080  # 808 B/s against 800
            assert (await c.call(produce(7, size))).throttle_time_ms == kafka_throttle(808, 800) == 100
            described = await c.call(describe([], strict=False))
            assert entries(described) == {(("client-id", "c"),): {"producer_byte_rate": 800.0},
                                          (("client-id", "d"),): {"producer_byte_rate": 700.0},
                                          (("client-id", "e"),): {"producer_byte_rate": 900.0}}

            # The file changes only what the API never touched.
            write_config(path, broker, listen, node, quotas=[
                {"client-id": "c", "producer_byte_rate": 100, "consumer_byte_rate": 5000},
                {"client-id": "d", "producer_byte_rate": 300}])
            assert reload_config(str(path), h.proxy)
            assert effective(h) == {C: {"producer_byte_rate": 800}, D: {"producer_byte_rate": 300},
                                    E: {"producer_byte_rate": 900}}
            c.close()
        await broker.stop()
    run(scenario())


def test_reload_applies_new_quotas_and_refuses_a_bad_file(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    script = Script()
    path = tmp_path / "proxy.yaml"

    async def scenario() -> None:
        broker = await FakeBroker(script).start()
        listen, node = free_port(), free_port()
        write_config(path, broker, listen, node, quotas=PRODUCE_QUOTA)
        async with from_file(path, broker) as h:
            now = freeze(h)
            c = await connect(h)
            assert (await c.call(produce(7, 5040))).throttle_time_ms == 80

            write_config(path, broker, listen, node, quotas=[{"client-id": "c", "producer_byte_rate": 1000}])
            assert reload_config(str(path), h.proxy)
            assert effective(h) == {C: {"producer_byte_rate": 1000}}
            now[0] += 20_000  # past the window: a fresh measurement
            assert (await c.call(produce(7, 10_080))).throttle_time_ms == kafka_throttle(1008, 1000) == 80

            for bad, problem in (("quotas: [{client-id: c, producer_byte_rate: 10.5}]\n", "quotas[0]"),
                                 ("quotas: [{client-id: c, producer_byte_rat: 10}]\n", "unknown key"),
                                 ("quotas: [\n", "not valid YAML")):
                path.write_text(f"upstream: 127.0.0.1:{broker.port}\n" + bad, encoding="utf-8")
                caplog.clear()  # the proxy's own watcher cannot run until the next await
                assert not reload_config(str(path), h.proxy)
                (refused,) = [r.getMessage() for r in caplog.records]
                assert refused.startswith("config reload refused, the last good quotas stay in force")
                assert problem in refused
                assert effective(h) == {C: {"producer_byte_rate": 1000}}

            # The quota switches apply at run time too.
            write_config(path, broker, listen, node, quota={"mode": "observe"}, quotas=PRODUCE_QUOTA)
            assert reload_config(str(path), h.proxy)
            assert h.proxy.engine.settings.mode == "observe"
            assert effective(h) == {C: {"producer_byte_rate": 500}}
            # On the connection already charged (it keeps its way to its sensor), each switch
            # holds from the next request on.
            now[0] += 20_000
            assert (await c.call(produce(7, 10_080))).throttle_time_ms == 0  # observed only
            # (Enforced last: a throttled client is not read again until its throttle is over.)
            for mode, expected in (("off", 0), ("observe", 0), ("enforce", kafka_throttle(1008, 500))):
                write_config(path, broker, listen, node, quota={"mode": mode}, quotas=PRODUCE_QUOTA)
                assert reload_config(str(path), h.proxy)
                now[0] += 20_000
                assert (await c.call(produce(7, 10_080))).throttle_time_ms == expected, mode
            c.close()
        await broker.stop()
    with caplog.at_level("ERROR", logger="kafka_quota_proxy"):
        run(scenario())


def test_reload_reports_what_needs_a_restart(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "proxy.yaml"

    async def scenario() -> None:
        broker = await FakeBroker().start()
        listen, node = free_port(), free_port()
        write_config(path, broker, listen, node, quotas=PRODUCE_QUOTA)
        async with from_file(path, broker) as h:
            write_config(path, broker, listen, node, quotas=PRODUCE_QUOTA, quota={
                "window_num": 5, "state_file": str(tmp_path / "elsewhere.json"), "mode": "observe"})
            caplog.clear()  # the proxy's own watcher cannot run until the next await
            assert reload_config(str(path), h.proxy)
            warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert warnings == ["config reload: quota.window_num, quota.state_file changed; "
                                "restart the proxy to apply"]
            settings = h.proxy.engine.settings
            assert (settings.window_num, settings.state_file, settings.mode) == (11, None, "observe")
            assert h.proxy.quota_control.state_path == tmp_path / "proxy.yaml.quota-state.json"
        await broker.stop()
    with caplog.at_level("WARNING", logger="kafka_quota_proxy"):
        run(scenario())


def test_file_edits_and_refused_reloads_are_audited_and_the_state_file_is_private(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "proxy.yaml"
    state = tmp_path / "proxy.yaml.quota-state.json"

    async def scenario() -> None:
        broker = await FakeBroker(Script()).start()
        listen, node = free_port(), free_port()
        write_config(path, broker, listen, node, quotas=[{"client-id": "c", "producer_byte_rate": 500}])
        async with from_file(path, broker) as h:
            write_config(path, broker, listen, node, quotas=[
                {"client-id": "c", "producer_byte_rate": 700}, {"user": "bob", "consumer_byte_rate": 9}])
            assert reload_config(str(path), h.proxy)
            path.write_text("quotas: [{client-id: c, producer_byte_rate: -1}]\nupstream: x:1\n")
            assert not reload_config(str(path), h.proxy)
            c = await connect(h)  # ANONYMOUS from loopback, nobody named: may
            assert alter_results(await c.call(alter([([("client-id", "e")], [("producer_byte_rate", 9.0,
                                                                               False)])]))) == [(0, None)]
            c.close()
            assert [metric(h, "kafka_quota_proxy_quota_changes_total", source=s, outcome=o)
                    for s, o in (("file", "accepted"), ("file", "refused"), ("api", "accepted"))] == [2, 1, 1]
        assert state.stat().st_mode & 0o777 == 0o600

    with caplog.at_level("INFO", logger="kafka_quota_proxy.audit"):
        run(scenario())
    lines = [r.getMessage() for r in caplog.records if r.name == "kafka_quota_proxy.audit"]
    where = f"source=file principal=config-file address={path}"
    assert lines[:3] == [
        f"quota change accepted: {where} entity=[client-id=c] key=producer_byte_rate old=500 new=700",
        f"quota change accepted: {where} entity=[user=bob] key=consumer_byte_rate old=none new=9",
        f"quota change refused: {where} entity=[(whole file)] key=- old=none new=none "
        f"reason='{path}: quotas[0]: Quota producer_byte_rate must be greater than 0'"]
    assert lines[3].startswith("quota change accepted: source=api principal=ANONYMOUS address=127.0.0.1:")
    assert lines[3].endswith(" entity=[client-id=e] key=producer_byte_rate old=none new=9")
