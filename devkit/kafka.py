"""A real Apache Kafka 4 broker (KRaft, no ZooKeeper) from Maven Central's jars, beside the
Tansu launcher (devkit.tansu): one combined node, or a cluster of brokers with one dedicated
controller, on free loopback ports, each node a child process in its own session.

The jars come from devkit/pom.xml through Maven (`resolve_jars`), cached per Kafka version. The
child runs in its own session, so a Ctrl-C at the terminal reaches only its parent, which then
stops it in order; on Linux it also dies with its parent if that is killed outright. Its log
stays in its directory after it stops. Every failure (no java or mvn, a Java too old, a resolve
that fails, a node that exits or never answers a metadata request) is a KafkaError whose message
says what happened, with the end of the log where there is one.

This module imports only the standard library at module level: it is also copied alone, with
the jars, into an image that has Python 3 and a JRE but neither Maven nor the project, where
`python3 kafka.py serve --lib DIR ...` runs Kafka in the foreground.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

LOOPBACK = "127.0.0.1"
POM = Path(__file__).with_name("pom.xml")
MIN_JAVA = 17  # Kafka 4 brokers and tools need Java 17 (clients 11)
STAMP = ".resolved"  # in a lib dir: the sha256 of the pom it was resolved from
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
# delegation.token.secret.key of a devkit node with delegation tokens: the same on every node of
# a cluster (controllers included, in KRaft), and no secret, as the nodes are throwaway ones.
DELEGATION_TOKEN_SECRET = "kqp-devkit-delegation-token-key"

# For a 2-core machine shared with the tests: a serial collector (no parallel GC threads), and
# only the C1 compiler, which starts the broker sooner and spends less CPU compiling; a broker
# that runs short of heap exits rather than limping on.
JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:+ExitOnOutOfMemoryError",
             "-XX:-UsePerfData", "-Djava.awt.headless=true")

# Kafka's own default log4j2 levels (config/log4j2.yaml), all to standard output: the launcher
# sends that to kafka.log in the node's directory, `serve` to the container's log.
LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.controller.name = kafka.controller
logger.controller.level = INFO
"""
# Tools and clients log warnings only, to standard error, leaving standard output to them.
QUIET_LOG4J2 = (LOG4J2.replace("rootLogger.level = INFO", "rootLogger.level = WARN")
                .replace("type = Console", "type = Console\nappender.out.target = SYSTEM_ERR"))


class KafkaError(RuntimeError):
    """Kafka could not be resolved, formatted, started or asked for its metadata; the message
    says why."""


# -- Java, Maven and the jars ----------------------------------------------------------------------

def java_binary() -> str:
    """$JAVA_HOME/bin/java if there is one, else `java` on the PATH; KafkaError if neither."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home, "bin", "java"), os.X_OK):
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if not found:
        raise KafkaError(f"no java: Kafka needs a Java {MIN_JAVA} or newer runtime on the PATH "
                         "(or JAVA_HOME); e.g. apt-get install openjdk-17-jre-headless")
    return found


def java_version(java: str | None = None) -> int:
    """The feature version of `java` (8, 11, 17, 21 ...); KafkaError if it does not say."""
    java = java or java_binary()
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise KafkaError(f"{java} -version failed: {exc}") from None
    # `openjdk version "17.0.15" 2025-04-15`, `java version "1.8.0_292"`, `openjdk version "21"`
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not found:
        raise KafkaError(f"{java} -version did not say its version:\n{_tail(out.stderr + out.stdout)}")
    major = int(found[1])
    return int(found[2] or 0) if major == 1 else major


def check_java(java: str | None = None) -> str:
    """The java binary, once it is known to be new enough for Kafka 4."""
    java = java or java_binary()
    version = java_version(java)
    if version < MIN_JAVA:
        raise KafkaError(f"{java} is Java {version}; Kafka 4 needs Java {MIN_JAVA} or newer "
                         "(set JAVA_HOME or put a newer java first on the PATH)")
    return java


def kafka_version(pom: Path = POM) -> str:
    """The Kafka version devkit/pom.xml resolves (its kafka.version property)."""
    try:
        root = ET.parse(pom).getroot()
    except (OSError, ET.ParseError) as exc:
        raise KafkaError(f"cannot read {pom}: {exc}") from None
    version = root.findtext("{http://maven.apache.org/POM/4.0.0}properties/"
                            "{http://maven.apache.org/POM/4.0.0}kafka.version")
    if not version:
        raise KafkaError(f"{pom} names no kafka.version property")
    return version.strip()


def default_lib(pom: Path = POM) -> Path:
    """Where resolve_jars() keeps the jars of a pom: ~/.cache/kafka-quota-proxy/kafka-V-D/lib
    ($XDG_CACHE_HOME if set), V the Kafka version, D the start of the pom's digest. A folder per
    pom, not per version: checkouts on two poms (a branch adding a jar) would otherwise resolve
    the one folder again in turn, swapping it under each other's running brokers."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kafka-quota-proxy" / f"kafka-{kafka_version(pom)}-{_pom_digest(pom)[:12]}" / "lib"


def _pom_digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def resolve_jars(dest: Path | None = None, pom: Path = POM) -> Path:
    """The directory holding Kafka's jars (broker, tools, log4j2), resolved with Maven from
    `pom` into `dest` (default_lib() if None). Nothing runs if `dest` was already resolved from
    this same pom; Maven's ~/.m2 makes a second resolve download nothing anyway."""
    dest = Path(dest) if dest is not None else default_lib(pom)
    if not pom.is_file():
        raise KafkaError(f"no {pom}: resolve the jars from a checkout, or pass --lib DIR")
    digest = _pom_digest(pom)
    stamp = dest / STAMP
    if stamp.is_file() and stamp.read_text().strip() == digest:
        return dest
    if dest.exists() and any(p.name != STAMP and p.suffix != ".jar" for p in dest.iterdir()):
        # The folder is replaced whole: never one that holds anything but jars.
        raise KafkaError(f"{dest} holds files other than jars; resolve into a new or empty folder")
    check_java()
    mvn = shutil.which("mvn")
    if not mvn:
        raise KafkaError("no mvn: resolving Kafka's jars needs Maven 3 on the PATH "
                         "(e.g. apt-get install maven), or pass already resolved jars as --lib DIR")
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Into a fresh folder beside dest, then swapped in: a resolve cut short never looks complete.
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        out = subprocess.run(
            [mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
             f"-DoutputDirectory={work}", "-DincludeScope=runtime"],
            capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
        if out.returncode != 0 or not any(work.glob("kafka_2.13-*.jar")):
            raise KafkaError(f"mvn could not resolve Kafka {kafka_version(pom)}'s jars from {pom} "
                             f"(exit {out.returncode}):\n{_tail(out.stdout + out.stderr, 25)}")
        (work / STAMP).write_text(digest + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        work.rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def lib_dir(lib: Path | None = None) -> Path:
    """The folder of Kafka's jars: `lib`, or resolve_jars()'s if None; KafkaError if it holds
    no broker jar."""
    lib = Path(lib) if lib is not None else resolve_jars()
    if not any(lib.glob("kafka_2.13-*.jar")):
        raise KafkaError(f"no Kafka broker jar (kafka_2.13-*.jar) in {lib}")
    return lib


def java_command(main_class: str, *args: str, lib: Path, heap: str = "256m",
                 jvm_flags: Sequence[str] = JVM_FLAGS, log4j: Path | None = None,
                 java: str | None = None) -> list[str]:
    """The command line running `main_class` on the jars of `lib`."""
    cmd = [java or java_binary(), f"-Xmx{heap}", *jvm_flags]
    if log4j is not None:
        cmd.append(f"-Dlog4j2.configurationFile={log4j}")
    return [*cmd, "-cp", f"{lib}{os.sep}*", main_class, *args]


def run_tool(main_class: str, *args: str, lib: Path | None = None, heap: str = "256m",
             timeout: float = 120.0, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's tools to its end on the broker's classpath, with a small heap; its
    output captured as text. A bare name is one of org.apache.kafka.tools (in 4.4: ConfigCommand,
    TopicCommand, ProducerPerformance, ConsumerPerformance, ShareConsumerPerformance,
    MetadataQuorumCommand, FeatureCommand, ClusterTool ...); others need their package
    (kafka.tools.StorageTool, org.apache.kafka.tools.consumer.ConsoleConsumer)."""
    if "." not in main_class:
        main_class = f"org.apache.kafka.tools.{main_class}"
    lib = lib_dir(lib)
    # The config lives outside lib, which may be read-only (an image's) and is only ever jars.
    with tempfile.TemporaryDirectory(prefix="kafka-tool-") as scratch:
        log4j = Path(scratch, "log4j2.properties")
        log4j.write_text(QUIET_LOG4J2)
        return subprocess.run(java_command(main_class, *args, lib=lib, heap=heap, log4j=log4j),
                              capture_output=True, text=True, timeout=timeout, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)


def share_from_earliest(bootstrap: str, group: str, lib: Path | None = None) -> None:
    """Share group `group` reads from the partitions' start (by default it starts at their end):
    its share.auto.offset.reset=earliest, set with kafka-configs.sh (ConfigCommand) at `bootstrap`."""
    out = run_tool("ConfigCommand", "--bootstrap-server", bootstrap, "--entity-type", "groups",
                   "--entity-name", group, "--alter", "--add-config", "share.auto.offset.reset=earliest",
                   lib=lib)
    if out.returncode != 0:
        raise KafkaError(f"kafka-configs could not set {group}'s share.auto.offset.reset:\n"
                         f"{_tail(out.stdout + out.stderr)}")


# -- A metadata request over a plain socket ----------------------------------------------------------

class BrokerInfo(NamedTuple):
    node_id: int
    host: str
    port: int


def _recv(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


def _call(sock: socket.socket, api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    """One request with header v1 and its response body (after a v0 header)."""
    client = b"kqp-devkit"
    message = struct.pack(">hhih", api_key, version, correlation, len(client)) + client + body
    sock.sendall(struct.pack(">i", len(message)) + message)
    (size,) = struct.unpack(">i", _recv(sock, 4))
    data = _recv(sock, size)
    if struct.unpack_from(">i", data)[0] != correlation:
        raise ValueError("a response out of order")
    return data[4:]


def _string(data: bytes, at: int) -> tuple[str | None, int]:
    (length,) = struct.unpack_from(">h", data, at)
    at += 2
    if length < 0:
        return None, at
    return data[at:at + length].decode(), at + length


METADATA_VERSION = 4  # the last version whose brokers come before anything optional


def metadata(host: str, port: int, timeout: float = 5.0) -> list[BrokerInfo]:
    """The brokers a Kafka listener advertises, asked as a client would: ApiVersions (v0, which
    every broker answers) for the Metadata versions it takes, then Metadata v4 for no topics.
    OSError or ValueError if it does not answer."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        body = _call(sock, 18, 0, 1, b"")
        (count,) = struct.unpack_from(">i", body, 2)
        ranges = {key: (low, high) for key, low, high in
                  (struct.unpack_from(">hhh", body, 6 + 6 * i) for i in range(count))}
        low, high = ranges.get(3, (-1, -1))
        if not low <= METADATA_VERSION <= high:
            raise ValueError(f"the broker takes Metadata v{low}-v{high}, not v{METADATA_VERSION}")
        body = _call(sock, 3, METADATA_VERSION, 2, struct.pack(">ib", 0, 0))
    (count,) = struct.unpack_from(">i", body, 4)  # after throttle_time_ms
    at, brokers = 8, []
    for _ in range(count):
        (node_id,) = struct.unpack_from(">i", body, at)
        broker_host, at = _string(body, at + 4)
        (broker_port,) = struct.unpack_from(">i", body, at)
        _, at = _string(body, at + 4)  # rack
        brokers.append(BrokerInfo(node_id, broker_host or "", broker_port))
    return brokers


# -- A node ------------------------------------------------------------------------------------------

def free_port() -> int:
    """devkit.processes' free loopback port (which never hands one out twice, and keeps to its
    worker's slice under pytest-xdist); the kernel's choice where this file runs alone."""
    try:
        from devkit.processes import free_port as devkit_free_port
    except ImportError:
        with socket.socket() as s:
            s.bind((LOOPBACK, 0))
            return int(s.getsockname()[1])
    return devkit_free_port()


def new_cluster_id() -> str:
    """A cluster id as Kafka's Uuid.randomUuid() writes it: 22 url-safe base64 characters, never
    starting with "-" (which the tools would read as an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the kernel SIGKILLs the child when its parent dies (devkit.processes has the same)."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class KafkaBroker:
    """One Kafka node as a child process: by default a combined broker and KRaft controller, the
    single-node cluster of Kafka's quickstart, on free loopback ports.

    `roles` "broker" or "controller" make the dedicated nodes of a KafkaCluster. `restart()`
    starts it again on the same ports and data after `kill()` (SIGKILL) or `stop()` (SIGTERM, a
    controlled shutdown). Its directory keeps server.properties, kafka.log and the data; one it
    made itself (no `directory` given) goes with `close()`, or when this Python process exits."""

    node_id: int = 1
    port: int = field(default_factory=free_port)  # PLAINTEXT, for clients and between brokers
    controller_port: int = field(default_factory=free_port)  # CONTROLLER (KRaft)
    # A SASL_PLAINTEXT listener taking SCRAM-SHA-256 and -512 for `scram_users` (name: password),
    # which the format creates with both mechanisms; no authorizer, so any user may do anything.
    sasl_port: int | None = None
    scram_users: Mapping[str, str] = field(default_factory=dict)
    # Delegation tokens (KIP-48) on: delegation.token.secret.key set. Off by default, as in Kafka;
    # tokens are created and used on a SASL listener only (KafkaApis.allowTokenRequests).
    delegation_tokens: bool = False
    roles: str = "broker,controller"
    # controller.quorum.voters ("id@host:port,..."); None: this node is the only voter.
    voters: str | None = None
    cluster_id: str = field(default_factory=new_cluster_id)
    heap: str = "512m"
    jvm_flags: Sequence[str] = JVM_FLAGS
    lib: Path | None = None  # the jars; None: resolve_jars()'s
    directory: Path | None = None  # properties, log and data; None: a temporary one of its own
    listen_host: str = LOOPBACK
    advertised: str | None = None  # "host:port" told to clients for PLAINTEXT; None: its own
    properties_extra: Mapping[str, str] = field(default_factory=dict)  # override or add any
    proc: subprocess.Popen[bytes] | None = None
    own_directory: bool = field(default=False, init=False)  # made by _dir(): removed at the end

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def bootstrap(self) -> str:
        """bootstrap.servers for a client of the PLAINTEXT listener."""
        return self.address

    @property
    def sasl_address(self) -> str:
        if self.sasl_port is None:
            raise KafkaError("this broker has no SASL listener: give it a sasl_port")
        return f"{LOOPBACK}:{self.sasl_port}"

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles.split(",")

    @property
    def is_controller(self) -> bool:
        return "controller" in self.roles.split(",")

    @property
    def log_path(self) -> Path:
        return self._dir() / "kafka.log"

    def _dir(self) -> Path:
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix=f"kafka-{self.node_id}-"))
            self.own_directory = True
            # A test run starts many brokers, each with gigabytes of data; restart() needs them
            # after stop(), so they are kept until close() or until this process exits.
            atexit.register(self.close)
        return self.directory

    def properties(self) -> dict[str, str]:
        """server.properties for this node."""
        host = self.listen_host
        listeners, advertised = [], []
        protocols = {"CONTROLLER": "PLAINTEXT", "PLAINTEXT": "PLAINTEXT"}
        if self.is_broker:
            listeners.append(f"PLAINTEXT://{host}:{self.port}")
            advertised.append(f"PLAINTEXT://{self.advertised or self._own(self.port)}")
            if self.sasl_port is not None:
                protocols["SASL_PLAINTEXT"] = "SASL_PLAINTEXT"
                listeners.append(f"SASL_PLAINTEXT://{host}:{self.sasl_port}")
                # Advertised on the PLAINTEXT listener's advertised host, at its own port.
                advertised_host = self.advertised.rsplit(":", 1)[0] if self.advertised else None
                advertised.append(f"SASL_PLAINTEXT://{advertised_host}:{self.sasl_port}"
                                  if advertised_host else f"SASL_PLAINTEXT://{self._own(self.sasl_port)}")
        if self.is_controller:
            # The quorum stays on loopback, even where `serve` listens on every interface.
            listeners.append(f"CONTROLLER://{LOOPBACK}:{self.controller_port}")
        props = {
            "process.roles": self.roles,
            "node.id": str(self.node_id),
            # Static voters (kraft.version 0, which format picks when this is set): a fixed quorum
            # needs no --standalone / controller.quorum.bootstrap.servers, and restarts the same.
            "controller.quorum.voters": self.voters or f"{self.node_id}@{LOOPBACK}:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "listeners": ",".join(listeners),
            "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
            "log.dirs": str(self._dir() / "data"),
            # One broker may hold every internal topic: replication factor and min ISR 1.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Fewer than the default 50 partitions each: the first group, transaction or share
            # group creates them all, which takes seconds on 2 shared cores.
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.num.partitions": "10",
            "group.initial.rebalance.delay.ms": "0",
            # The same for streams groups (KIP-1071), whose first assignment waits 3 s by default.
            "group.streams.initial.rebalance.delay.ms": "0",
            # A broker is unfenced, and so in Metadata, at its first heartbeat after catching up:
            # every 0.5 s rather than 2 s starts it sooner.
            "broker.heartbeat.interval.ms": "500",
            # A killed broker cannot register again until the controller ends its old session
            # (DUPLICATE_BROKER_REGISTRATION): 4 s rather than 9 s, still 8 missed heartbeats.
            "broker.session.timeout.ms": "4000",
            "num.network.threads": "2",
            "num.io.threads": "2",
            # Share groups (KIP-932) and streams groups (KIP-1071) need no flag in 4.4: its format
            # sets share.version=2 and streams.version=1 (the defaults at 4.4-IV2, the latest
            # production metadata version), and group.coordinator.rebalance.protocols defaults to
            # classic, consumer and streams (as read from 4.4.0's Feature and GroupCoordinatorConfig).
        }
        if self.is_broker:
            props["inter.broker.listener.name"] = "PLAINTEXT"
            props["advertised.listeners"] = ",".join(advertised)
        if self.is_broker and self.sasl_port is not None:
            props["sasl.enabled.mechanisms"] = ",".join(SCRAM_MECHANISMS)
            for mechanism in SCRAM_MECHANISMS:
                props[f"listener.name.sasl_plaintext.{mechanism.lower()}.sasl.jaas.config"] = (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;")
        if self.delegation_tokens:
            props["delegation.token.secret.key"] = DELEGATION_TOKEN_SECRET
        props.update(self.properties_extra)
        return props

    def _own(self, port: int) -> str:
        # 0.0.0.0 is no address to tell a client.
        host = LOOPBACK if self.listen_host in ("0.0.0.0", "::", "") else self.listen_host
        return f"{host}:{port}"

    def write_config(self) -> Path:
        """server.properties and log4j2.properties into the node's directory; the former's path."""
        directory = self._dir()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        (directory / "log4j2.properties").write_text(LOG4J2)
        return path

    @property
    def formatted(self) -> bool:
        return (self._dir() / "data" / "meta.properties").exists()

    def format(self) -> None:
        """kafka-storage format, once: the cluster id, node id and the SCRAM users (as bootstrap
        metadata records, so they exist from the first start)."""
        config = self.write_config()
        if self.formatted:
            return
        args = ["format", "-t", self.cluster_id, "-c", str(config)]
        for name, password in self.scram_users.items():
            for mechanism in SCRAM_MECHANISMS:
                args += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
        java = check_java()
        out = subprocess.run(
            java_command("kafka.tools.StorageTool", *args, lib=lib_dir(self.lib), heap="256m",
                         jvm_flags=self.jvm_flags, log4j=self._dir() / "log4j2.properties", java=java),
            capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
        if out.returncode != 0:
            raise KafkaError(f"kafka-storage format of node {self.node_id} failed "
                             f"(exit {out.returncode}):\n{_tail(out.stdout + out.stderr)}")

    def command(self) -> list[str]:
        directory = self._dir()
        return java_command("kafka.Kafka", str(directory / "server.properties"), lib=lib_dir(self.lib),
                            heap=self.heap, jvm_flags=self.jvm_flags,
                            log4j=directory / "log4j2.properties")

    def launch(self) -> KafkaBroker:
        """Format if needed and start the JVM, without waiting for it (see wait())."""
        if not self.stopped:
            raise KafkaError(f"Kafka node {self.node_id} is already running")
        self.format()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self._dir(), start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        return self

    def wait(self, timeout: float = 90.0) -> KafkaBroker:
        """Until a broker lists itself in the Metadata it answers (a controller: until it
        listens); KafkaError with the log's tail, and the node killed, if it never does."""
        deadline = time.monotonic() + timeout
        port = self.port if self.is_broker else self.controller_port
        problem = "nothing listening"
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = self.proc.returncode if self.proc is not None else None
                raise KafkaError(f"Kafka node {self.node_id} exited with status {code} at start "
                                 f"(log: {self.log_path}):\n{self.log_tail()}")
            try:
                if not self.is_broker:
                    socket.create_connection((LOOPBACK, port), timeout=1.0).close()
                    return self
                brokers = metadata(LOOPBACK, port)
                if any(b.node_id == self.node_id for b in brokers):
                    return self
                problem = f"its metadata lists brokers {sorted(b.node_id for b in brokers)}"
            except (OSError, ValueError, struct.error) as exc:
                problem = str(exc) or type(exc).__name__
            if time.monotonic() > deadline:
                self.kill()
                raise KafkaError(f"Kafka node {self.node_id} did not answer a metadata request on "
                                 f"{LOOPBACK}:{port} within {timeout:.0f} s ({problem}); log "
                                 f"{self.log_path}:\n{self.log_tail()}")
            time.sleep(0.2)

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        """Format (the first time) and start the node, and wait until it answers Metadata."""
        return self.launch().wait(timeout)

    def metadata(self) -> list[BrokerInfo]:
        """The brokers this broker lists in Metadata, asked over its PLAINTEXT listener."""
        return metadata(LOOPBACK, self.port)

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the node's log ("" if there is none)."""
        try:
            return _tail(self.log_path.read_text(errors="replace"), lines)
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, Kafka's controlled shutdown, then SIGKILL if it has not ended in `timeout`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def close(self) -> None:
        """stop(), then remove the directory if the node made it itself: no restart() after this.
        A directory that was given is kept."""
        self.stop()
        if self.own_directory and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory, self.own_directory = None, False
            atexit.unregister(self.close)

    def kill(self) -> None:
        """kill -9: no controlled shutdown, no flush; waits until it is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, timeout: float = 90.0) -> KafkaBroker:
        """Start again on the same ports, data and log, once the last run has ended."""
        if not self.stopped:
            raise KafkaError(f"Kafka node {self.node_id} is still running: kill() or stop() it first")
        return self.start(timeout)

    def add_scram_user(self, name: str, password: str, mechanism: str = "SCRAM-SHA-256") -> None:
        """Create or change a SCRAM credential on the running cluster (kafka-configs --alter)."""
        out = run_tool("ConfigCommand", "--bootstrap-server", self.bootstrap, "--alter",
                       "--entity-type", "users", "--entity-name", name,
                       "--add-config", f"{mechanism}=[password={password}]", lib=self.lib)
        if out.returncode != 0:
            raise KafkaError(f"kafka-configs could not add {mechanism} user {name}:\n"
                             f"{_tail(out.stdout + out.stderr)}")

    def create_delegation_token(self, user: str, password: str,
                                mechanism: str = "SCRAM-SHA-256") -> DelegationToken:
        """A delegation token owned by SCRAM user `user`, created by Kafka's own
        kafka-delegation-tokens (DelegationTokenCommand) at this node's SASL listener, logged in
        as that user. The broker may take a moment more to accept it than to answer."""
        if not self.delegation_tokens:
            raise KafkaError("this broker has no delegation tokens: give it delegation_tokens=True")
        with tempfile.TemporaryDirectory(prefix="kafka-token-") as scratch:
            config = Path(scratch, "owner.properties")
            config.write_text(scram_client_properties(mechanism, user, password))
            out = run_tool("DelegationTokenCommand", "--bootstrap-server", self.sasl_address, "--create",
                           "--max-life-time-period", "-1", "--command-config", str(config), lib=self.lib)
        # "Created delegation token with tokenId : ID", then a table row: ID HMAC OWNER ...
        created = re.search(r"tokenId : (\S+)", out.stdout)
        row = re.search(rf"^{re.escape(created[1])}\s+(\S+)\s", out.stdout, re.M) if created else None
        if out.returncode != 0 or created is None or row is None:
            raise KafkaError(f"kafka-delegation-tokens could not create a token for {user} "
                             f"(exit {out.returncode}):\n{_tail(out.stderr)}")
        return DelegationToken(created[1], row[1])

    @property
    def stopped(self) -> bool:
        return self.proc is None or self.proc.poll() is not None


class DelegationToken(NamedTuple):
    """A delegation token as its holder uses it: SCRAM user name `token_id`, password `hmac`
    (a secret), with the SCRAM extension tokenauth=true."""

    token_id: str
    hmac: str

    def __repr__(self) -> str:  # the HMAC is the token's password
        return f"DelegationToken(token_id={self.token_id!r})"

    def client_properties(self, mechanism: str = "SCRAM-SHA-512") -> str:
        """A Java client's properties that log in with this token."""
        return scram_client_properties(mechanism, self.token_id, self.hmac, tokenauth=True)


def scram_client_properties(mechanism: str, username: str, password: str, tokenauth: bool = False) -> str:
    """A Java client's properties (a --command-config or --producer.config file) for SCRAM at a
    SASL_PLAINTEXT listener; `tokenauth`: the name and password are a delegation token's."""
    extension = ' tokenauth="true"' if tokenauth else ""
    return ("security.protocol=SASL_PLAINTEXT\n"
            f"sasl.mechanism={mechanism}\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{username}" password="{password}"{extension};\n')


@dataclass
class KafkaCluster:
    """`brokers` broker-only nodes (ids 1..N) and one dedicated KRaft controller (id 0), each
    its own process on its own free loopback ports. A single broker stops, is killed and
    restarts through its node: `cluster.broker(2).kill()`."""

    brokers: int = 3
    scram_users: Mapping[str, str] = field(default_factory=dict)
    sasl: bool = False  # a SASL_PLAINTEXT listener on every broker
    delegation_tokens: bool = False  # on every node, with one secret key (KafkaBroker's)
    heap: str = "512m"
    lib: Path | None = None
    # One folder per node below it; None: a temporary one, removed by close() or at exit.
    directory: Path | None = None
    controller: KafkaBroker = field(init=False)
    nodes: list[KafkaBroker] = field(init=False)
    own_directory: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.lib = lib_dir(self.lib)
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="kafka-cluster-"))
            self.own_directory = True
            atexit.register(self.close)
        root = self.directory
        cluster_id = new_cluster_id()
        self.controller = KafkaBroker(node_id=0, roles="controller", cluster_id=cluster_id,
                                      heap=self.heap, lib=self.lib, directory=root / "controller-0",
                                      scram_users=self.scram_users, delegation_tokens=self.delegation_tokens)
        voters = f"0@{LOOPBACK}:{self.controller.controller_port}"
        self.nodes = [KafkaBroker(node_id=i, roles="broker", voters=voters, cluster_id=cluster_id,
                                  heap=self.heap, lib=self.lib, directory=root / f"broker-{i}",
                                  sasl_port=free_port() if self.sasl else None,
                                  delegation_tokens=self.delegation_tokens)
                      for i in range(1, self.brokers + 1)]

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes)

    def broker(self, node_id: int) -> KafkaBroker:
        return next(n for n in self.nodes if n.node_id == node_id)

    def start(self, timeout: float = 120.0) -> KafkaCluster:
        """Format every node side by side, start the controller and then all brokers, and wait
        until each lists itself in Metadata; every node stopped if one fails."""
        everyone = [self.controller, *self.nodes]
        try:
            with ThreadPoolExecutor(len(everyone)) as pool:
                list(pool.map(KafkaBroker.format, everyone))
            self.controller.launch()
            for node in self.nodes:
                node.launch()
            for node in everyone:
                node.wait(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Brokers first: their controlled shutdown asks the controller."""
        running = [n for n in self.nodes if not n.stopped]
        try:
            with ThreadPoolExecutor(max(len(running), 1)) as pool:
                list(pool.map(KafkaBroker.stop, running))
        except RuntimeError:  # at exit no new thread starts: one after the other
            for node in running:
                node.stop()
        self.controller.stop()

    def close(self) -> None:
        """stop(), then remove the directory if the cluster made it itself."""
        self.stop()
        if self.own_directory and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.own_directory = False
            atexit.unregister(self.close)


# -- The command line ------------------------------------------------------------------------------

def _serve(args: argparse.Namespace) -> int:
    scram = dict(u.split(":", 1) for u in args.scram_user)
    node = KafkaBroker(node_id=args.node_id, port=args.port, controller_port=args.controller_port,
                       sasl_port=args.sasl_port, scram_users=scram, heap=args.heap,
                       delegation_tokens=args.delegation_tokens,
                       lib=Path(args.lib) if args.lib else None, directory=Path(args.data).absolute(),
                       listen_host=args.listen_host, advertised=args.advertised)
    if args.cluster_id:
        node.cluster_id = args.cluster_id
    node.format()
    cmd = node.command()
    print(f"kafka: node {node.node_id} serving {node.properties()['advertised.listeners']} "
          f"from {node.directory}", file=sys.stderr, flush=True)
    os.chdir(node._dir())
    os.execv(cmd[0], cmd)  # Kafka in this process: signals reach the JVM itself


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.kafka", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="format if needed, then run one combined Kafka node in "
                                         "the foreground")
    serve.add_argument("--listen-host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=19092, help="the PLAINTEXT listener")
    serve.add_argument("--advertised", help="HOST:PORT told to clients (default: the listener)")
    serve.add_argument("--controller-port", type=int, default=19093,
                       help="the KRaft CONTROLLER listener, on loopback only")
    serve.add_argument("--sasl-port", type=int, help="a SASL_PLAINTEXT (SCRAM) listener too")
    serve.add_argument("--scram-user", action="append", default=[], metavar="NAME:PASSWORD",
                       help="a SCRAM-SHA-256/512 user created at format (repeatable)")
    serve.add_argument("--delegation-tokens", action="store_true",
                       help="delegation tokens on (a devkit delegation.token.secret.key)")
    serve.add_argument("--lib", help="the resolved jars (default: resolve them with Maven)")
    serve.add_argument("--data", default="kafka-data", help="properties, metadata and logs")
    serve.add_argument("--node-id", type=int, default=1)
    serve.add_argument("--cluster-id", help="at the first format (default: a random one)")
    serve.add_argument("--heap", default="512m", help="the JVM's -Xmx")
    resolve = sub.add_parser("resolve", help="resolve Kafka's jars with Maven; print their folder")
    resolve.add_argument("--to", help="copy them here (default: the cache)")
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        print(resolve_jars(Path(args.to) if args.to else None))
        return 0
    except KafkaError as exc:
        print(f"kafka: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
