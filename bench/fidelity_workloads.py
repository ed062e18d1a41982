"""bench.kafka_fidelity's workloads beyond one client: three SCRAM users under KIP-55's precedence,
topics created in a loop under controller_mutation_rate, and a producer to three brokers."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from bench.end_offsets import EndOffsets
from bench.fidelity_clients import java_tool, rdkafka_produce
from bench.fidelity_reading import FAILED, ONE_BUDGET, REFUSED, Outcome, creations, judge, judge_end_offsets
from bench.many_connections import CLIENT_ID, QUOTA, entity_quota
from devkit.kafka import KafkaBroker
from devkit.kafka_cluster import KafkaCluster
from devkit.producing import RECORD

# The mutations case: partitions/s, and the partitions of each topic it creates. Each accepted
# CreateTopics takes the bucket PARTITIONS below what it had, a throttle of PARTITIONS / MUTATIONS s
# (200 ms), so the topics come at five a second and a window holds 55 of them.
MUTATIONS, PARTITIONS = 10, 2


CREATE_TOPICS = Path(__file__).with_name("java") / "CreateTopicsLoop.java"


# The SCRAM case's users, created on Kafka's SASL listener; `admin` manages quotas at the proxy and
# `service` is the proxy's own login for its metadata.
SCRAM_USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret",
               "service": "service-secret"}


SCRAM_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class Tenant:
    """One producer of the SCRAM case: logged in as `user`, with `client_id`; the quota entity
    KIP-55's precedence picks for it gives it `share` of QUOTA."""

    case: str
    user: str
    client_id: str
    share: float


SCRAM_TENANTS = (
    Tenant("scram-user-client", "alice", CLIENT_ID, 0.5),  # /users/alice/clients/bulk
    Tenant("scram-user", "alice", "other", 1.0),  # /users/alice
    Tenant("scram-default-user", "bob", CLIENT_ID, 0.75),  # /users/<default>
)


# kafka-configs' entity arguments and each one's share of QUOTA. /clients/bulk ranks below
# /users/<default>: were the precedence wrong, bob's producer would get a quarter.
SCRAM_QUOTAS = (
    (("--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
      "--entity-name", CLIENT_ID), 0.5),
    (("--entity-type", "users", "--entity-name", "alice"), 1.0),
    (("--entity-type", "users", "--entity-default"), 0.75),
    (("--entity-type", "clients", "--entity-name", CLIENT_ID), 0.25),
)


def measure_scram(path: str, broker: KafkaBroker, quotas_at: str, login: str | None, clients_at: str,
                  topics: Sequence[str], seconds: float, warm_up: float) -> list[Outcome]:
    """The SCRAM case on `path`: SCRAM_QUOTAS set with kafka-configs at `quotas_at` (logged in with
    the properties file `login`, if any), then SCRAM_TENANTS' producers flat out together at
    `clients_at`, each to its own one-partition topic of `topics`, each judged against its own
    share of QUOTA from the broker's end offsets; the quotas deleted after."""
    outs = [Outcome(t.case, path, quota=QUOTA * t.share) for t in SCRAM_TENANTS]
    for entity, share in SCRAM_QUOTAS:
        entity_quota(quotas_at, entity, "producer_byte_rate", int(QUOTA * share), login, settle=0)
    time.sleep(2)  # a broker applies a quota from its metadata a moment later
    try:
        start = time.monotonic() + 0.5
        meters = [EndOffsets(broker.bootstrap, topic, 1, RECORD, start) for topic in topics]
        with ExitStack() as stack:
            for meter in meters:
                stack.enter_context(meter)
            producers = [threading.Thread(target=rdkafka_produce, args=(
                clients_at, topic, seconds, start, out, t.client_id,
                {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": SCRAM_MECHANISM,
                 "sasl.username": t.user, "sasl.password": SCRAM_USERS[t.user]}))
                for topic, t, out in zip(topics, SCRAM_TENANTS, outs, strict=True)]
            for thread in producers:
                thread.start()
            for thread in producers:
                thread.join(seconds + 60)
            time.sleep(0.5)  # the last acknowledged bytes' offsets
    finally:
        for entity, _ in SCRAM_QUOTAS:
            entity_quota(quotas_at, entity, "producer_byte_rate", None, login, settle=0)
    return [judge_end_offsets(meter, out, warm_up) for meter, out in zip(meters, outs, strict=True)]


def measure_mutations(path: str, broker: KafkaBroker, bootstrap: str, prefix: str, seconds: float,
                      warm_up: float) -> Outcome:
    """The mutations case on `path`: Kafka's Admin client creating topics of PARTITIONS
    partitions at `bootstrap` one request at a time for `seconds`, its retry on error 89 off
    (bench/java/CreateTopicsLoop.java), judged against MUTATIONS partitions/s; every throttle its
    NetworkClient was told, and the refusals (error 89) with theirs. The topics are deleted after,
    straight at the broker by a client-id without a quota."""
    out = Outcome("java-create-topics", path, quota=MUTATIONS)
    text = java_tool(str(CREATE_TOPICS), [bootstrap, CLIENT_ID, prefix, str(PARTITIONS), str(int(seconds))],
                     seconds * 2 + 60, out, "CREATE_TOPICS", print_metrics=False)
    refused = [int(m.group(2)) for m in REFUSED.finditer(text)]
    out.metrics = {"refused": len(refused)}
    if refused:
        out.metrics["refused-throttle-avg"] = statistics.fmean(refused)
    out.errors.extend(m.group(1) for m in FAILED.finditer(text))
    created = creations(text, PARTITIONS)
    judge(created, out, warm_up)
    topics = [f"{prefix}-{i}" for i in range(len(created.marks) - 1)]
    if topics:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "client.id": "fidelity-admin"})
        for future in admin.delete_topics(topics, operation_timeout=60).values():
            future.result(120)
    return out


def led_by_each(cluster: KafkaCluster, topic: str) -> None:
    """Create `topic` with one partition on each of the cluster's brokers, which leads it."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    replicas = [[n.node_id] for n in cluster.nodes]
    admin.create_topics([NewTopic(topic, len(replicas), replica_assignment=replicas)])[topic].result(60)


def measure_brokers(path: str, cluster: KafkaCluster, bootstrap: str, topic: str, seconds: float,
                    warm_up: float) -> Outcome:
    """The three-broker case on `path`: the librdkafka producer flat out at `bootstrap` for
    `seconds` to `topic`, a partition led by each broker, its rate from the end offsets summed over
    them. Kafka's brokers each enforce the quota for their own partition, as does the proxy with
    scope broker: three times the quota, the measure for those paths; with scope cluster, one."""
    brokers = len(cluster.nodes)
    out = Outcome("three-brokers", path, quota=QUOTA * (1 if path == ONE_BUDGET else brokers))
    start = time.monotonic() + 0.5
    with EndOffsets(cluster.bootstrap, topic, brokers, RECORD, start) as meter:
        rdkafka_produce(bootstrap, topic, seconds, start, out, per_broker=True)
        time.sleep(0.5)  # the last acknowledged bytes' offsets
    # Partition i is led by the i-th node (`led_by_each`): what each broker appended.
    for node, appended in zip(cluster.nodes, meter.last, strict=False):
        out.metrics[f"appended-mb-{node.node_id}"] = appended * RECORD / 1e6
    return judge_end_offsets(meter, out, warm_up)
