"""Kafka 4.4's own admin tools run for real through the proxy (devkit.kafka_jvm.run_tool).

`kafka-configs.sh` (ConfigCommand) runs each sequence twice at once, once straight at the Kafka
broker and once through the proxy, and every line each run prints must be the same: the proxy
answers DescribeClientQuotas and AlterClientQuotas itself, from its own store, so the broker
holding the same quotas through the direct runs is the reference. The differences that are the
proxy's on purpose are asserted as such: a topic's producer_byte_rate and consumer_byte_rate
(no Kafka topic configs; docs/topic-quotas.md) and the order of a listing of several entities
(docs/differences-from-kafka.md). Over SASL the proxy passes the SCRAM exchange through to
Kafka's SASL listener and lets the SCRAM user `admin` manage quotas.

`kafka-topics.sh`, `kafka-consumer-groups.sh` and `kafka-metadata-quorum.sh` run through the
proxy too, and every host:port they print is checked.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest
from confluent_kafka import Consumer, KafkaException, Producer

from devkit.kafka import KafkaBroker
from devkit.kafka_jvm import run_tool
from devkit.processes import ProxyProcess, free_port

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

ADMIN, TENANT = ("admin", "admin-Secret-1"), ("tenant", "tenant-Secret-2")
SERVICE = ("kqp-svc", "svc-Secret-3")  # the proxy's own metadata refresh
GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
ADDRESS = re.compile(r"(?<![\w.])((?:\d{1,3}\.){3}\d{1,3}|localhost):(\d{1,5})\b")


class Run(NamedTuple):
    """One tool run: its exit status, its standard output's lines, and its error's lines without
    stack frames, the bootstrap address it was given written as BOOTSTRAP."""

    rc: int
    out: list[str]
    err: list[str]


def tool(main_class: str, bootstrap: str, *args: str) -> Run:
    done = run_tool(main_class, "--bootstrap-server", bootstrap, *args)
    err = [line.replace(bootstrap, "BOOTSTRAP") for line in done.stderr.splitlines()
           if line.strip() and not line.lstrip().startswith(("at ", "... "))]
    return Run(done.returncode, done.stdout.splitlines(), err)


def side_by_side(main_class: str, direct: str, proxied: str, *args: str) -> tuple[Run, Run]:
    """The same command at the broker and through the proxy, both at once (a JVM start is
    seconds here)."""
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda bootstrap: tool(main_class, bootstrap, *args), (direct, proxied))
    return first, second


def addresses(text: str) -> set[str]:
    return {f"{host}:{port}" for host, port in ADDRESS.findall(text)}


@pytest.fixture(scope="module")
def kafka() -> Iterator[KafkaBroker]:
    """A Kafka of this module's own, with a SCRAM listener beside PLAINTEXT (no authorizer: on
    Kafka anyone may alter quotas)."""
    broker = KafkaBroker(sasl_port=free_port(), scram_users=dict([ADMIN, TENANT, SERVICE])).start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="module")
def proxy(kafka: KafkaBroker) -> Iterator[ProxyProcess]:
    """PLAINTEXT, no settings: ANONYMOUS from loopback may manage quotas (quota.anonymous_loopback)."""
    p = ProxyProcess(kafka.address, kafka.node_id).start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def sasl_proxy(kafka: KafkaBroker) -> Iterator[ProxyProcess]:
    """SASL passthrough to Kafka's SCRAM listener; the SCRAM user `admin` may manage quotas."""
    p = ProxyProcess(kafka.sasl_address, kafka.node_id, extra_config={
        "sasl": {"mode": "passthrough"},
        # the proxy's own metadata refresh at a SASL-only listener (docs/identity.md)
        "upstream_sasl": {"mechanism": "SCRAM-SHA-512", "username": SERVICE[0], "password": SERVICE[1]},
        "quota": {"alter_principals": [ADMIN[0]]}})
    try:
        p.start()
        yield p
    finally:
        p.stop()


def command_config(directory: Path, user: tuple[str, str]) -> str:
    path = directory / f"{user[0]}.properties"
    path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                    f'username="{user[0]}" password="{user[1]}";\n')
    return str(path)


# -- kafka-configs.sh: users, clients, their defaults, users+clients ------------------------------------

# entity type: (the entity's arguments, what --alter adds, what --delete-config then deletes, the
# "Completed ..." line)
ENTITIES = {
    "users": (["--entity-type", "users", "--entity-name", "alice"],
              "producer_byte_rate=1048576,consumer_byte_rate=2097152", "producer_byte_rate",
              "Completed updating config for user alice."),
    "clients": (["--entity-type", "clients", "--entity-name", "batch-loader"],
                "request_percentage=12.5,controller_mutation_rate=3", "request_percentage",
                "Completed updating config for client batch-loader."),
    "users-default": (["--entity-type", "users", "--entity-default"],
                      "producer_byte_rate=4194304,request_percentage=50", "request_percentage",
                      "Completed updating default config for users in the cluster."),
    "clients-default": (["--entity-type", "clients", "--entity-default"],
                        "consumer_byte_rate=5242880,producer_byte_rate=3145728", "consumer_byte_rate",
                        "Completed updating default config for clients in the cluster."),
    "users-clients": (["--entity-type", "users", "--entity-name", "bob", "--entity-type", "clients",
                       "--entity-name", "etl"],
                      "producer_byte_rate=2097152,consumer_byte_rate=1048576", "consumer_byte_rate",
                      "Completed updating config for user bob."),
}
# entity type: (who, after --alter, after --delete-config), as Kafka prints "Quota configs for
# {who} are {after}"; the values in Kafka's order (java.util.HashMap's: admin_api.java_hash_order)
DESCRIBED = {
    "users": ("user-principal 'alice'", "consumer_byte_rate=2097152.0, producer_byte_rate=1048576.0",
              "consumer_byte_rate=2097152.0"),
    "clients": ("client-id 'batch-loader'", "controller_mutation_rate=3.0, request_percentage=12.5",
                "controller_mutation_rate=3.0"),
    "users-default": ("the default user-principal", "request_percentage=50.0, producer_byte_rate=4194304.0",
                      "producer_byte_rate=4194304.0"),
    "clients-default": ("the default client-id", "consumer_byte_rate=5242880.0, producer_byte_rate=3145728.0",
                        "producer_byte_rate=3145728.0"),
    "users-clients": ("user-principal 'bob', client-id 'etl'",
                      "consumer_byte_rate=1048576.0, producer_byte_rate=2097152.0",
                      "producer_byte_rate=2097152.0"),
}


@pytest.mark.parametrize("entity_type", list(ENTITIES))
def test_kafka_configs_alter_describe_delete_as_on_kafka(kafka: KafkaBroker, proxy: ProxyProcess,
                                                        entity_type: str) -> None:
    entity, added, deleted, completed = ENTITIES[entity_type]
    steps: list[list[str]] = [
        ["--alter", *entity, "--add-config", added],
        ["--describe", *entity],
        ["--alter", *entity, "--delete-config", deleted],
        ["--describe", *entity],
    ]
    if entity_type == "users":
        steps += [
            ["--alter", *entity, "--delete-config", deleted],  # gone: the tool's own check refuses it
            ["--alter", *entity, "--add-config", "producer_byte_rate=1.5"],  # the broker's refusal
        ]
    runs = [side_by_side("ConfigCommand", kafka.address, proxy.bootstrap, *args) for args in steps]
    for args, (direct, proxied) in zip(steps, runs, strict=True):
        assert proxied == direct, f"{' '.join(args)}:\nKafka: {direct}\nproxy: {proxied}"
    # and what Kafka printed is what it should have
    who, after_alter, after_delete = DESCRIBED[entity_type]
    assert [direct.out for direct, _ in runs[:4]] == [
        [completed], [f"Quota configs for {who} are {after_alter}"],
        [completed], [f"Quota configs for {who} are {after_delete}"]]
    if entity_type == "users":
        assert runs[4][0].rc == 1 and runs[4][0].err == [f"Invalid config(s): {deleted}"]
        assert runs[5][0].rc == 1 and runs[5][0].err[-1] == (
            "Caused by: org.apache.kafka.common.errors.InvalidRequestException: "
            "producer_byte_rate cannot be a fractional value.")


def test_a_listing_of_several_entities_holds_the_same_lines(kafka: KafkaBroker, proxy: ProxyProcess) -> None:
    """`--describe` of every entity of a type: the same lines, in an order that may differ where
    the tool's HashMap puts two entities in one bucket (docs/differences-from-kafka.md)."""
    setup = [["--entity-type", "users", "--entity-name", "carol", "--entity-type", "clients",
              "--entity-default"],
             ["--entity-type", "users", "--entity-default", "--entity-type", "clients",
              "--entity-default"]]
    for i, entity in enumerate(setup):  # rates too high to hold back the later tests' clients
        rate = f"consumer_byte_rate={9_000_000 + i}"
        direct, proxied = side_by_side("ConfigCommand", kafka.address, proxy.bootstrap,
                                       "--alter", *entity, "--add-config", rate)
        assert proxied == direct and direct.rc == 0
    direct, proxied = side_by_side("ConfigCommand", kafka.address, proxy.bootstrap,
                                   "--describe", "--entity-type", "users", "--entity-type", "clients")
    assert sorted(proxied.out) == sorted(direct.out) and (proxied.rc, proxied.err) == (direct.rc, direct.err)
    assert {"Quota configs for user-principal 'carol', the default client-id are "
            "consumer_byte_rate=9000000.0",
            "Quota configs for the default user-principal, the default client-id are "
            "consumer_byte_rate=9000001.0"} <= set(direct.out)


# -- kafka-configs.sh --entity-type topics: the proxy's topic quotas ----------------------------------


def test_kafka_configs_topics_as_documented(kafka: KafkaBroker, proxy: ProxyProcess) -> None:
    """On Kafka, producer_byte_rate and consumer_byte_rate are no topic configs and are refused;
    through the proxy they are the topic's quota (docs/topic-quotas.md), listed as the topic's
    own configs beside the broker's. Everything else prints as on Kafka."""
    topic = "orders"
    created = tool("TopicCommand", proxy.bootstrap, "--create", "--topic", topic, "--partitions", "3",
                   "--replication-factor", "1")
    assert created == Run(0, [f"Created topic {topic}."], [])
    entity = ["--entity-type", "topics", "--entity-name", topic]
    retention = ("  retention.ms=604800000 sensitive=false "
                 "synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=604800000}")
    completed = [f"Completed updating config for topic {topic}."]

    def quota_line(key: str, value: int) -> str:
        return f"  {key}={value} sensitive=false synonyms={{DYNAMIC_TOPIC_CONFIG:{key}={value}}}"

    def both(*args: str) -> tuple[Run, Run]:
        return side_by_side("ConfigCommand", kafka.address, proxy.bootstrap, *args)

    direct, proxied = both("--alter", *entity, "--add-config", "retention.ms=604800000")
    assert direct == proxied == Run(0, completed, [])

    direct, proxied = both("--alter", *entity, "--add-config",
                           "producer_byte_rate=1048576,consumer_byte_rate=2097152")
    assert direct.rc == 1 and direct.err[-1] == (
        "Caused by: org.apache.kafka.common.errors.InvalidConfigurationException: "
        "Unknown topic config name: producer_byte_rate")
    assert proxied == Run(0, completed, [])  # the proxy's: never reaches Kafka

    described = f"Dynamic configs for topic {topic} are:"
    direct, proxied = both("--describe", *entity)
    assert direct == Run(0, [described, retention], [])
    # the tool sorts a topic's configs by name
    assert proxied == Run(0, [described, quota_line("consumer_byte_rate", 2097152),
                              quota_line("producer_byte_rate", 1048576), retention], [])

    # Kafka 4.4's tool deletes without describing first, and Kafka deletes a config it does not
    # know without a word: both complete; through the proxy the quota is gone.
    direct, proxied = both("--alter", *entity, "--delete-config", "producer_byte_rate")
    assert direct == proxied == Run(0, completed, [])
    direct, proxied = both("--describe", *entity)
    assert direct == Run(0, [described, retention], [])
    assert proxied == Run(0, [described, quota_line("consumer_byte_rate", 2097152), retention], [])

    # a quota key and a broker config in one resource: all or nothing, both gone
    direct, proxied = both("--alter", *entity, "--delete-config", "consumer_byte_rate,retention.ms")
    assert direct == proxied == Run(0, completed, [])
    direct, proxied = both("--describe", *entity)
    assert direct == proxied == Run(0, [described], [])


# -- kafka-configs.sh over SASL (SCRAM, passthrough) --------------------------------------------------


def test_kafka_configs_over_scram_as_on_kafka(kafka: KafkaBroker, sasl_proxy: ProxyProcess,
                                              tmp_path: Path) -> None:
    admin = command_config(tmp_path, ADMIN)
    entity = ["--entity-type", "users", "--entity-name", ADMIN[0]]
    scram = (f"SCRAM credential configs for user-principal '{ADMIN[0]}' are "
             "SCRAM-SHA-256=iterations=4096, SCRAM-SHA-512=iterations=4096")
    steps = [
        ["--alter", *entity, "--add-config", "consumer_byte_rate=2097152,producer_byte_rate=1048576"],
        ["--describe", *entity],  # the quotas from the proxy, the SCRAM credentials from Kafka
        ["--alter", *entity, "--delete-config", "producer_byte_rate"],
        ["--describe", *entity],
    ]
    runs = [side_by_side("ConfigCommand", kafka.sasl_address, sasl_proxy.bootstrap, "--command-config", admin,
                         *args) for args in steps]
    for args, (direct, proxied) in zip(steps, runs, strict=True):
        assert proxied == direct, f"{' '.join(args)}:\nKafka: {direct}\nproxy: {proxied}"
    completed = [f"Completed updating config for user {ADMIN[0]}."]

    def scram_sorted(lines: list[str]) -> list[str]:
        # Kafka lists a user's SCRAM mechanisms in either order from one run to the next (CI on
        # c7a4e86 saw SHA-512 first); the proxy passes that API through, so it is Kafka's order.
        head = "SCRAM credential configs for user-principal"
        return [line.split(" are ")[0] + " are " + ", ".join(sorted(line.split(" are ")[1].split(", ")))
                if line.startswith(head) else line for line in lines]

    assert [scram_sorted(direct.out) for direct, _ in runs] == [
        completed,
        [f"Quota configs for user-principal '{ADMIN[0]}' are consumer_byte_rate=2097152.0, "
         "producer_byte_rate=1048576.0", scram],
        completed,
        [f"Quota configs for user-principal '{ADMIN[0]}' are consumer_byte_rate=2097152.0", scram]]
    assert f"authenticated as {ADMIN[0]}" in sasl_proxy.log_text()

    # Another SCRAM user: Kafka without an authorizer lets anyone; the proxy only quota.alter_principals
    # (docs/quotas.md, "Who may change quotas"). The tool reads the entity's quotas before it alters
    # them, and that is refused first.
    tenant = command_config(tmp_path, TENANT)
    refused = tool("ConfigCommand", sasl_proxy.bootstrap, "--command-config", tenant, "--alter",
                   "--entity-type", "users", "--entity-name", TENANT[0], "--add-config",
                   "producer_byte_rate=1073741824")
    assert refused.rc == 1 and refused.err[-1] == (
        "Caused by: org.apache.kafka.common.errors.ClusterAuthorizationException: Principal tenant may "
        "not describe client quotas: it is not in quota.describe_principals or quota.alter_principals")


# -- kafka-topics.sh, kafka-consumer-groups.sh, kafka-metadata-quorum.sh ------------------------------


def test_topics_groups_and_quorum_tools_print_only_proxy_addresses(kafka: KafkaBroker,
                                                                   proxy: ProxyProcess) -> None:
    topic, group = "tools-topic", "tools-group"
    proxy_addresses = {proxy.bootstrap, f"127.0.0.1:{proxy.node_port}"}
    created = tool("TopicCommand", proxy.bootstrap, "--create", "--topic", topic, "--partitions", "3",
                   "--replication-factor", "1")
    assert created == Run(0, [f"Created topic {topic}."], [])
    with ThreadPoolExecutor(2) as pool:
        described, listed = pool.map(lambda args: tool("TopicCommand", proxy.bootstrap, *args),
                                     (["--describe", "--topic", topic], ["--list"]))
    assert described.rc == 0 and described.err == []
    assert re.match(rf"Topic: {topic}\tTopicId: \S+\tPartitionCount: 3\tReplicationFactor: 1\t",
                    described.out[0])
    assert [line.split("\t")[1:5] for line in described.out[1:]] == [
        [f"Topic: {topic}", f"Partition: {p}", "Leader: 1", "Replicas: 1"] for p in range(3)]
    assert listed.rc == 0 and topic in listed.out

    producer = Producer({"bootstrap.servers": proxy.bootstrap})
    for i in range(30):
        producer.produce(topic, f"{i}".encode(), partition=i % 3)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": group,
                         "group.protocol": "consumer", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        seen, deadline = 0, time.monotonic() + 60
        while seen < 30 and time.monotonic() < deadline:
            for msg in consumer.consume(30, 1.0):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                seen += 1
        assert seen == 30
        consumer.commit(asynchronous=False)
        with ThreadPoolExecutor(2) as pool:
            offsets, state = pool.map(
                lambda args: tool(GROUP_COMMAND, proxy.bootstrap, "--describe", "--group", group, *args),
                ([], ["--state"]))
    finally:
        consumer.close()
    assert offsets.rc == 0 and offsets.err == []
    rows = [line.split() for line in offsets.out if line.startswith(group)]
    # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
    assert sorted(row[2:6] for row in rows) == [[str(p), "10", "10", "0"] for p in range(3)]
    assert {row[7] for row in rows} == {"/127.0.0.1"}  # the member's host: no port
    assert state.rc == 0 and state.err == []
    # GROUP COORDINATOR (ID) ASSIGNMENT-STRATEGY STATE #MEMBERS: the coordinator is the proxy's
    row = next(line.split() for line in state.out if line.startswith(group))
    assert row[1:3] == [f"127.0.0.1:{proxy.node_port}", f"({kafka.node_id})"] and row[-2:] == ["Stable", "1"]

    with ThreadPoolExecutor(2) as pool:
        status, replication = pool.map(
            lambda args: tool("MetadataQuorumCommand", proxy.bootstrap, "describe", *args),
            (["--status"], ["--replication"]))
    assert status.rc == 0 and status.err == [] and replication.rc == 0 and replication.err == []
    # DescribeQuorum names the KRaft controllers, which the proxy does not serve: their endpoints
    # pass as Kafka sent them (protocol/rewrite.py NOT_REWRITTEN), here the combined node's
    # CONTROLLER listener, which is neither the proxy's nor the broker's client listener.
    controller = f"127.0.0.1:{kafka.controller_port}"
    voters = f'[{{"id": {kafka.node_id}, "endpoints": ["CONTROLLER://{controller}"]}}]'
    assert f"CurrentVoters:          {voters}" in status.out
    assert f"LeaderId:               {kafka.node_id}" in status.out
    assert addresses("\n".join(status.out)) == {controller}
    assert [line.split()[0] for line in replication.out[1:]] == [str(kafka.node_id)]
    assert replication.out[1].split()[-1] == "Leader"

    printed = "\n".join(created.out + described.out + listed.out + offsets.out + state.out + replication.out)
    assert addresses(printed) <= proxy_addresses  # the coordinator, and nothing of the broker's
    assert kafka.address not in printed + "\n".join(status.out)
