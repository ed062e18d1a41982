"""Java, Maven and Kafka's jars, a metadata request over a plain socket, and a node's process
helpers: what devkit.kafka's nodes and Kafka's tools run on.

Like devkit/kafka.py, this module imports only the standard library at module level: the two are
copied together into the Kafka stand-in image (devkit/containers/standins.py), where
`python3 kafka.py serve --lib DIR ...` runs Kafka in the foreground."""

from __future__ import annotations

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
import tempfile
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

LOOPBACK = "127.0.0.1"


POM = Path(__file__).with_name("pom.xml")


MIN_JAVA = 17  # Kafka 4 brokers and tools need Java 17 (clients 11)


STAMP = ".resolved"  # in a lib dir: the sha256 of the pom it was resolved from


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
        raise KafkaError(f"{java} -version did not say its version:\n{tail_of(out.stderr + out.stdout)}")
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
                             f"(exit {out.returncode}):\n{tail_of(out.stdout + out.stderr, 25)}")
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
                         f"{tail_of(out.stdout + out.stderr)}")


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


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the kernel SIGKILLs the child when its parent dies (devkit.processes has the same)."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def end(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM (a server's orderly shutdown), then SIGKILL if it has not ended in `timeout`;
    reaped, waiting up to 10 s more."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def tail_of(text: str, lines: int = 15) -> str:
    """The last `lines` lines of `text`."""
    return "\n".join(text.splitlines()[-lines:])


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
