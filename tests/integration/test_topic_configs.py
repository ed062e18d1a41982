"""Topic quotas as topic configs against a real Tansu broker (docs/topic-quotas.md, "Through
kafka-configs.sh"): librdkafka's AdminClient sets a topic's producer_byte_rate and its retention.ms
in one IncrementalAlterConfigs through the proxy; the quota lands at the proxy (DescribeClientQuotas,
the state file), retention.ms at Tansu; DescribeConfigs through the proxy shows both; a delete
removes the quota alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin.client_quotas import DescribeClientQuotasRequest

from devkit.processes import ProxyProcess
from devkit.tansu import Broker

pytestmark = pytest.mark.integration

P = "producer_byte_rate"


@pytest.fixture(scope="module")
def own_proxy(broker: Broker, broker_node_id: int) -> Iterator[ProxyProcess]:
    """A proxy of this module's own: a topic quota, once set, has the proxy measure every topic."""
    p = ProxyProcess(broker.address, broker_node_id).start()
    try:
        yield p
    finally:
        p.stop()


def alter(admin: AdminClient, topic: str, *entries: tuple[str, str | None, AlterConfigOpType]) -> None:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=op) for name, value, op in entries])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def described(admin: AdminClient, topic: str) -> dict[str, Any]:
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    result: dict[str, Any] = future.result(timeout=30)
    return result


def topic_quotas(proxy: ProxyProcess, topic: str) -> dict[str, float]:
    """DescribeClientQuotas for the topic entity, through kafka-python (which has no method for it)."""
    client = KafkaAdminClient(bootstrap_servers=proxy.bootstrap, request_timeout_ms=10_000)
    cls: Any = DescribeClientQuotasRequest
    request = cls(components=[cls.ComponentData(entity_type="topic", match_type=0, match=topic)], strict=True)
    manager = client._manager

    async def call() -> Any:
        return await manager.send(request)
    try:
        response = manager.run(call)
    finally:
        client.close()
    assert response.error_code == 0, response.error_message
    return {v.key: v.value for entry in response.entries for v in entry.values}


def test_a_topic_quota_and_a_topic_config_in_one_call(own_proxy: ProxyProcess, broker: Broker,
                                                     topic_name: str) -> None:
    direct = AdminClient({"bootstrap.servers": broker.address})
    direct.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(timeout=30)
    admin = AdminClient({"bootstrap.servers": own_proxy.bootstrap})

    alter(admin, topic_name, (P, "1048576", AlterConfigOpType.SET),
          ("retention.ms", "3600000", AlterConfigOpType.SET))

    assert topic_quotas(own_proxy, topic_name) == {P: 1048576.0}
    assert own_proxy.config_path is not None
    state = json.loads(own_proxy.config_path.with_name("proxy.yaml.quota-state.json").read_text())
    assert {"entity": {"topic": topic_name}, "values": {P: 1048576.0}, "removed": []} in state["entities"]
    at_broker = described(direct, topic_name)
    assert at_broker["retention.ms"].value == "3600000"
    assert P not in at_broker  # the broker never saw the quota key
    through = described(admin, topic_name)
    assert (through[P].value, through[P].source) == ("1048576", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert not through[P].is_read_only and not through[P].is_sensitive
    assert through["retention.ms"].value == "3600000"

    # kafka-configs.sh --delete-config producer_byte_rate: the quota goes, retention.ms stays.
    alter(admin, topic_name, (P, None, AlterConfigOpType.DELETE))
    assert topic_quotas(own_proxy, topic_name) == {}
    assert P not in described(admin, topic_name)
    assert described(direct, topic_name)["retention.ms"].value == "3600000"
