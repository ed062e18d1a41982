"""devkit.kafka: the clear errors and the generated properties (no JVM), then a real Kafka 4
(marked integration): produce and consume, a restart, SCRAM, three brokers and the serve CLI."""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient

from devkit import kafka, kafka_jvm
from devkit.kafka import KafkaBroker
from devkit.kafka_cluster import KafkaCluster
from devkit.kafka_jvm import KafkaError

# -- No JVM ----------------------------------------------------------------------------------------


def _bin(tmp_path: Path, **scripts: str) -> Path:
    """A folder of shell scripts, name: body, to be the whole PATH."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = folder / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return folder


JAVA_17 = "echo 'openjdk version \"17.0.15\" 2025-04-15' >&2"


@pytest.fixture
def bare_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., None]:
    """PATH set to a folder holding only the given scripts; no JAVA_HOME."""
    monkeypatch.delenv("JAVA_HOME", raising=False)

    def use(**scripts: str) -> None:
        monkeypatch.setenv("PATH", str(_bin(tmp_path, **scripts)))

    return use


def test_no_java_says_so(bare_path: Callable[..., None]) -> None:
    bare_path()
    with pytest.raises(KafkaError, match="no java: Kafka needs a Java 17"):
        kafka_jvm.check_java()


def test_an_old_java_says_which_and_what_kafka_needs(bare_path: Callable[..., None]) -> None:
    bare_path(java="echo 'openjdk version \"11.0.2\" 2019-01-15' >&2")
    with pytest.raises(KafkaError, match=r"is Java 11; Kafka 4 needs Java 17 or newer"):
        kafka_jvm.check_java()


@pytest.mark.parametrize(("says", "version"), [('"1.8.0_292"', 8), ('"21" 2023-09-19', 21),
                                               ('"17.0.15" 2025-04-15', 17)])
def test_java_version_reads_old_and_new_forms(bare_path: Callable[..., None], says: str,
                                              version: int) -> None:
    bare_path(java=f"echo 'openjdk version {says}' >&2")
    assert kafka_jvm.java_version() == version


def test_no_mvn_says_so(bare_path: Callable[..., None], tmp_path: Path) -> None:
    bare_path(java=JAVA_17)
    with pytest.raises(KafkaError, match="no mvn: resolving Kafka's jars needs Maven"):
        kafka_jvm.resolve_jars(tmp_path / "lib")


def test_a_failed_resolve_shows_mavens_output_and_leaves_nothing(bare_path: Callable[..., None],
                                                                tmp_path: Path) -> None:
    bare_path(java=JAVA_17, mvn="echo '[ERROR] Could not resolve dependencies for kafka_2.13'; exit 1")
    with pytest.raises(KafkaError, match=r"(?s)mvn could not resolve Kafka 4\.\d+\.\d+'s jars.*"
                                         r"exit 1.*Could not resolve dependencies"):
        kafka_jvm.resolve_jars(tmp_path / "lib")
    assert [p.name for p in tmp_path.iterdir()] == ["bin"]


def test_a_resolved_folder_is_not_resolved_again(bare_path: Callable[..., None], tmp_path: Path) -> None:
    bare_path()  # neither java nor mvn: they must not be needed
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / kafka_jvm.STAMP).write_text(kafka_jvm._pom_digest(kafka_jvm.POM))
    assert kafka_jvm.resolve_jars(lib) == lib


def test_a_folder_resolved_from_another_pom_is_resolved_again(bare_path: Callable[..., None],
                                                            tmp_path: Path) -> None:
    """A cache (a CI's too) from before the pom named kafka-streams gets its jar: the stamp is the
    pom's digest, not Kafka's version."""
    bare_path(java=JAVA_17, mvn='for a; do case $a in -DoutputDirectory=*) d=${a#*=};; esac; done\n'
                                ': > "$d/kafka_2.13-4.4.0.jar"; : > "$d/kafka-streams-4.4.0.jar"')
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "kafka_2.13-4.4.0.jar").touch()
    (lib / kafka_jvm.STAMP).write_text("the digest of an older pom\n")
    assert kafka_jvm.resolve_jars(lib) == lib
    assert sorted(p.name for p in lib.iterdir()) == [kafka_jvm.STAMP, "kafka-streams-4.4.0.jar",
                                                     "kafka_2.13-4.4.0.jar"]
    assert (lib / kafka_jvm.STAMP).read_text() == kafka_jvm._pom_digest(kafka_jvm.POM) + "\n"


def test_resolve_never_replaces_a_folder_of_other_things(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(KafkaError, match="holds files other than jars"):
        kafka_jvm.resolve_jars(tmp_path)


def test_the_default_cache_is_per_pom(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    digest = hashlib.sha256(kafka_jvm.POM.read_bytes()).hexdigest()[:12]
    folder = f"kafka-{kafka_jvm.kafka_version()}-{digest}"
    assert kafka_jvm.default_lib() == tmp_path / "kafka-quota-proxy" / folder / "lib"


def test_a_folder_without_the_broker_jar_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KafkaError, match=r"no Kafka broker jar \(kafka_2\.13-\*\.jar\)"):
        KafkaBroker(lib=tmp_path, directory=tmp_path / "node").command()


def test_end_asks_a_process_to_stop_then_kills_one_that_does_not() -> None:
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    deaf = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                             "print('ready', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE)
    assert deaf.stdout is not None and deaf.stdout.readline() == b"ready\n"
    kafka_jvm.end(polite, timeout=10)
    assert polite.returncode == -signal.SIGTERM
    kafka_jvm.end(deaf, timeout=0.2)  # SIGTERM ignored: killed after 0.2 s
    assert deaf.returncode == -signal.SIGKILL
    kafka_jvm.end(deaf, timeout=0.2)  # ended already: nothing sent, nothing raised
    assert deaf.returncode == -signal.SIGKILL


def test_a_combined_node_is_its_own_quorum(tmp_path: Path) -> None:
    node = KafkaBroker(node_id=1, port=9092, controller_port=9093, directory=tmp_path)
    props = node.properties()
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert props["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    assert props["log.dirs"] == str(tmp_path / "data")
    for topic in ("offsets.topic", "transaction.state.log", "share.coordinator.state.topic"):
        assert props[f"{topic}.replication.factor"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert "sasl.enabled.mechanisms" not in props


def test_a_sasl_listener_takes_both_scram_mechanisms(tmp_path: Path) -> None:
    props = KafkaBroker(port=9092, sasl_port=9094, directory=tmp_path).properties()
    assert "SASL_PLAINTEXT://127.0.0.1:9094" in props["listeners"]
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092,SASL_PLAINTEXT://127.0.0.1:9094"
    assert "SASL_PLAINTEXT:SASL_PLAINTEXT" in props["listener.security.protocol.map"]
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-256,SCRAM-SHA-512"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    for mechanism in ("scram-sha-256", "scram-sha-512"):
        jaas = props[f"listener.name.sasl_plaintext.{mechanism}.sasl.jaas.config"]
        assert jaas == "org.apache.kafka.common.security.scram.ScramLoginModule required;"


def test_delegation_tokens_are_off_unless_asked_for(tmp_path: Path) -> None:
    assert "delegation.token.secret.key" not in KafkaBroker(sasl_port=9094, directory=tmp_path).properties()
    props = KafkaBroker(sasl_port=9094, delegation_tokens=True, directory=tmp_path).properties()
    assert props["delegation.token.secret.key"] == kafka.DELEGATION_TOKEN_SECRET
    (tmp_path / "kafka_2.13-4.4.0.jar").touch()
    cluster = KafkaCluster(brokers=2, sasl=True, delegation_tokens=True, lib=tmp_path,
                           directory=tmp_path / "c")
    # KRaft: the same key on every broker and on the controller.
    assert {n.properties()["delegation.token.secret.key"] for n in [cluster.controller, *cluster.nodes]} == {
        kafka.DELEGATION_TOKEN_SECRET}
    with pytest.raises(KafkaError, match="no delegation tokens"):
        KafkaBroker(sasl_port=9094, directory=tmp_path).create_delegation_token("alice", "secret")


def test_a_token_logs_in_with_tokenauth_and_never_shows_its_hmac() -> None:
    token = kafka_jvm.DelegationToken("Xid", "hmac-secret")
    assert "hmac-secret" not in repr(token) and "Xid" in repr(token)
    assert token.client_properties("SCRAM-SHA-256") == (
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="Xid" password="hmac-secret" tokenauth="true";\n')


def test_serve_listens_everywhere_but_advertises_what_it_is_told(tmp_path: Path) -> None:
    props = KafkaBroker(port=19092, controller_port=19093, sasl_port=19094, listen_host="0.0.0.0",
                        advertised="kafka.example:9092", directory=tmp_path).properties()
    assert props["listeners"] == ("PLAINTEXT://0.0.0.0:19092,SASL_PLAINTEXT://0.0.0.0:19094,"
                                  "CONTROLLER://127.0.0.1:19093")
    assert props["advertised.listeners"] == "PLAINTEXT://kafka.example:9092,SASL_PLAINTEXT://kafka.example:19094"
    own = KafkaBroker(port=19092, listen_host="0.0.0.0", directory=tmp_path).properties()
    assert own["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"


def test_a_data_directory_made_by_the_node_goes_with_close_and_a_given_one_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka.tempfile, "tempdir", str(tmp_path))
    own = KafkaBroker()
    made = own.log_path.parent
    assert made.parent == tmp_path and made.name.startswith("kafka-1-")
    (made / "data").mkdir()
    own.stop()  # no process: nothing to stop, and the data stays for a restart()
    assert made.is_dir()
    own.close()
    assert not made.exists() and own.directory is None
    given = KafkaBroker(directory=tmp_path / "given")
    given.log_path.parent.mkdir()
    given.close()
    assert (tmp_path / "given").is_dir()
    (tmp_path / "kafka_2.13-4.4.0.jar").touch()
    cluster = KafkaCluster(brokers=1, lib=tmp_path)
    assert cluster.directory is not None and cluster.directory.parent == tmp_path
    cluster.close()
    assert not cluster.directory.exists()
    kept = KafkaCluster(brokers=1, lib=tmp_path, directory=tmp_path / "c")
    kept.directory.mkdir()  # type: ignore[union-attr]
    kept.close()
    assert (tmp_path / "c").is_dir()


def test_data_directories_the_nodes_made_go_when_the_process_exits(tmp_path: Path) -> None:
    """A test run leaves no Kafka data behind though its fixtures only stop() their brokers:
    118 left over once filled a CI machine's disk (68 GB)."""
    (tmp_path / "kafka_2.13-4.4.0.jar").touch()
    script = ("import sys\n"
              "from pathlib import Path\n"
              "from devkit.kafka import KafkaBroker\nfrom devkit.kafka_cluster import KafkaCluster\n"
              "node = KafkaBroker()\n"
              "(node.log_path.parent / 'data').mkdir()\n"
              "node.stop()\n"
              "cluster = KafkaCluster(brokers=1, lib=Path(sys.argv[1]))\n"
              "print(node.directory, cluster.directory)\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                         env={**os.environ, "TMPDIR": str(scratch)}, check=True)
    made = [Path(d) for d in out.stdout.split()]
    assert [d.parent for d in made] == [scratch, scratch]
    assert list(scratch.iterdir()) == []


def test_a_cluster_has_one_controller_and_distinct_brokers(tmp_path: Path) -> None:
    (tmp_path / "kafka_2.13-4.4.0.jar").touch()
    cluster = KafkaCluster(brokers=3, lib=tmp_path, directory=tmp_path / "c")
    controller = cluster.controller.properties()
    assert controller["process.roles"] == "controller"
    assert controller["listeners"] == f"CONTROLLER://127.0.0.1:{cluster.controller.controller_port}"
    assert "advertised.listeners" not in controller
    brokers = [n.properties() for n in cluster.nodes]
    assert [p["node.id"] for p in brokers] == ["1", "2", "3"]
    assert {p["process.roles"] for p in brokers} == {"broker"}
    assert {p["controller.quorum.voters"] for p in brokers} == {controller["controller.quorum.voters"]}
    assert len({p["listeners"] for p in brokers}) == 3
    assert all("CONTROLLER://" not in p["listeners"] for p in brokers)
    assert len({n.cluster_id for n in [cluster.controller, *cluster.nodes]}) == 1
    assert len({n.directory for n in [cluster.controller, *cluster.nodes]}) == 4


def test_a_cluster_id_is_kafkas_form() -> None:
    ids = {kafka_jvm.new_cluster_id() for _ in range(200)}
    assert all(len(i) == 22 and not i.startswith("-") for i in ids) and len(ids) == 200


def test_the_module_imports_only_the_standard_library() -> None:
    """It is copied alone into an image with no project and no packages (see `serve`)."""
    tree = ast.parse(Path(kafka.__file__).read_text())
    names = {alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module.split(".")[0] for node in tree.body
              if isinstance(node, ast.ImportFrom) and node.module}
    assert names - sys.stdlib_module_names == set()


# -- A real Kafka ------------------------------------------------------------------------------------

def _produce(bootstrap: str, topic: str, count: int, **config: str) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", **config})
    for i in range(count):
        producer.produce(topic, value=f"m{i}".encode())
    assert producer.flush(30) == 0


def _consume(bootstrap: str, topic: str, count: int, timeout: float = 60.0) -> list[bytes]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                                         "group.id": f"g-{uuid.uuid4().hex[:8]}"})
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values


def _brokers(bootstrap: str, **config: str) -> set[int]:
    return set(AdminClient({"bootstrap.servers": bootstrap, **config}).list_topics(timeout=15).brokers)


@pytest.fixture(scope="module")
def scram_broker() -> Iterator[KafkaBroker]:
    """A node of this module's own with a SCRAM listener; the restart test kills and restarts it."""
    node = KafkaBroker(sasl_port=kafka_jvm.free_port(), scram_users={"alice": "alice-secret"}).start()
    try:
        yield node
    finally:
        node.close()


@pytest.mark.integration
@pytest.mark.kafka
def test_produce_and_consume(kafka_broker: KafkaBroker, topic_name: str) -> None:
    _produce(kafka_broker.bootstrap, topic_name, 10)
    assert _consume(kafka_broker.bootstrap, topic_name, 10) == [f"m{i}".encode() for i in range(10)]


@pytest.mark.integration
@pytest.mark.kafka
def test_run_tool_runs_kafkas_own_tools(kafka_broker: KafkaBroker, topic_name: str) -> None:
    created = kafka_jvm.run_tool("TopicCommand", "--bootstrap-server", kafka_broker.bootstrap, "--create",
                             "--topic", topic_name, "--partitions", "3")
    assert created.returncode == 0, created.stderr
    topics = AdminClient({"bootstrap.servers": kafka_broker.bootstrap}).list_topics(timeout=15).topics
    assert len(topics[topic_name].partitions) == 3


@pytest.mark.integration
@pytest.mark.kafka
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_the_sasl_listener_takes_a_scram_user(scram_broker: KafkaBroker, mechanism: str) -> None:
    assert _brokers(scram_broker.sasl_address, **{
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
        "sasl.username": "alice", "sasl.password": "alice-secret"}) == {1}


@pytest.mark.integration
@pytest.mark.kafka
def test_the_sasl_listener_refuses_a_wrong_password(scram_broker: KafkaBroker) -> None:
    errors: list[Exception] = []
    admin = AdminClient({"bootstrap.servers": scram_broker.sasl_address,
                         "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                         "sasl.username": "alice",
                         "sasl.password": "wrong", "error_cb": errors.append, "logger": _Quiet()})
    with pytest.raises(confluent_kafka.KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)  # serves error_cb
    assert any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors), errors


class _Quiet:
    """librdkafka's log, swallowed: the refusals it logs are this test's point."""

    def log(self, *args: object) -> None:
        pass


@pytest.mark.integration
@pytest.mark.kafka
def test_a_restart_after_kill_keeps_the_data(scram_broker: KafkaBroker, topic_name: str) -> None:
    _produce(scram_broker.bootstrap, topic_name, 5)
    scram_broker.kill()
    scram_broker.restart()
    assert _consume(scram_broker.bootstrap, topic_name, 5) == [f"m{i}".encode() for i in range(5)]
    assert scram_broker.metadata() == [kafka_jvm.BrokerInfo(1, "127.0.0.1", scram_broker.port)]


@pytest.mark.integration
@pytest.mark.kafka
def test_three_brokers_and_one_controller(tmp_path: Path) -> None:
    cluster = KafkaCluster(brokers=3, directory=tmp_path).start()
    try:
        assert _brokers(cluster.bootstrap) == {1, 2, 3}
        cluster.broker(2).kill()
        deadline = time.monotonic() + 30  # fenced once its session (4 s) ends
        while {b.node_id for b in cluster.broker(1).metadata()} != {1, 3}:
            assert time.monotonic() < deadline, cluster.broker(1).metadata()
            time.sleep(0.5)
        cluster.broker(2).restart()
        assert _brokers(cluster.bootstrap) == {1, 2, 3}
    finally:
        cluster.stop()


@pytest.mark.integration
@pytest.mark.kafka
def test_serve_runs_kafka_in_the_foreground_from_the_files_alone(tmp_path: Path) -> None:
    """As an image runs it: kafka.py and kafka_jvm.py copied alone, no project on the path (-I),
    the jars given."""
    lib = kafka_jvm.resolve_jars()
    shutil.copy(kafka.__file__, tmp_path / "kafka.py")
    shutil.copy(kafka_jvm.__file__, tmp_path / "kafka_jvm.py")
    port, controller_port = kafka_jvm.free_port(), kafka_jvm.free_port()
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-I", str(tmp_path / "kafka.py"), "serve", "--listen-host", "127.0.0.1",
             "--port", str(port), "--controller-port", str(controller_port),
             "--advertised", "kafka.example:9092", "--lib", str(lib), "--data", str(tmp_path / "data")],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                brokers = kafka_jvm.metadata("127.0.0.1", port)
                break
            except (OSError, ValueError):
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
                time.sleep(0.3)
        assert brokers == [kafka_jvm.BrokerInfo(1, "kafka.example", 9092)]
        assert Path(f"/proc/{proc.pid}/exe").resolve().name == "java"  # exec'd: the same pid
        proc.send_signal(signal.SIGTERM)  # reaches the JVM itself, which shuts down
        assert proc.wait(60) == 128 + signal.SIGTERM
        assert b"shut down completed" in (tmp_path / "serve.log").read_bytes()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
