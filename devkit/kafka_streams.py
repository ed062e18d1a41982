"""A Kafka Streams application as a real JVM: devkit/streams/CountApp.java, compiled with the JDK's
javac against devkit.kafka's jars (kafka-streams among them) and run to its end with a small heap,
the TCP peers it talked to recorded along the way.

The classes are cached beside the jars, by the digest of the source and of the jars' names, so a
changed source or a new Kafka compiles again and nothing else does. Every failure to compile or
start (no javac, a compile error) is a KafkaError that says what happened.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from devkit.kafka_jvm import JVM_FLAGS, MIN_JAVA, QUIET_LOG4J2, KafkaError, check_java, lib_dir
from devkit.processes import die_with_parent

SOURCE = Path(__file__).with_name("streams") / "CountApp.java"
MAIN_CLASS = SOURCE.stem
PEER_POLL_S = 0.2  # a client's connection to a broker lives far longer than this


def javac_binary() -> str:
    """The javac beside the java that runs Kafka ($JAVA_HOME/bin, else the PATH); KafkaError if
    there is only a runtime."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home, "bin", "javac"), os.X_OK):
        return str(Path(home, "bin", "javac"))
    found = shutil.which("javac")
    if not found:
        raise KafkaError(f"no javac: the Kafka Streams application is compiled at test time and needs "
                         f"a Java {MIN_JAVA} JDK, not only a runtime (e.g. apt-get install "
                         f"openjdk-17-jdk-headless)")
    return found


def _digest(source: Path, lib: Path) -> str:
    h = hashlib.sha256(source.read_bytes())
    for jar in sorted(p.name for p in lib.glob("*.jar")):
        h.update(b"\n" + jar.encode())
    return h.hexdigest()[:16]


def compile_app(lib: Path | None = None, source: Path = SOURCE) -> Path:
    """The folder holding the compiled application, compiled now unless the cache has it:
    `streams-app-DIGEST` beside the jars' folder."""
    lib = lib_dir(lib)
    if not any(lib.glob("kafka-streams-*.jar")):
        raise KafkaError(f"no kafka-streams jar in {lib}: resolve the jars again from devkit/pom.xml")
    dest = lib.parent / f"streams-app-{_digest(source, lib)}"
    if (dest / f"{MAIN_CLASS}.class").is_file():
        return dest
    check_java()
    javac = javac_binary()
    # Into a fresh folder beside dest, then renamed: a compile cut short never looks complete.
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=lib.parent))
    try:
        out = subprocess.run([javac, "--release", str(MIN_JAVA),
                              "-cp", f"{lib}{os.sep}*", "-d", str(work), str(source)],
                             capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        if out.returncode != 0:
            raise KafkaError(f"javac could not compile {source.name} (exit {out.returncode}):\n"
                             f"{(out.stdout + out.stderr)[-3000:]}")
        try:
            work.rename(dest)
        except OSError:  # another process compiled it first
            if not (dest / f"{MAIN_CLASS}.class").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def _ipv4(address: str) -> str:
    """127.0.0.1 for Java's dual-stack ::ffff:127.0.0.1; any other address as it is."""
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)


@dataclass(slots=True)
class StreamsRun:
    """What one run of the application did."""

    returncode: int
    output: str  # its standard output and error
    peers: set[tuple[str, int]]  # (address, port) of every TCP connection it was seen holding
    seconds: float

    def said(self, word: str) -> list[str]:
        """The rest of each output line that starts with `word` and a space, in order."""
        return [line[len(word) + 1:] for line in self.output.splitlines() if line.startswith(word + " ")]


@dataclass
class CountApp:
    """devkit/streams/CountApp.java on `bootstrap`: reads `input`, writes `output`, exits once it
    has written `expected` counts (see its header for the topology and what it prints)."""

    bootstrap: str
    application_id: str
    input: str
    output: str
    expected: int
    group_protocol: str = "streams"  # StreamsConfig's group.protocol: streams (KIP-1071) or classic
    application_server: str | None = None  # host:port, the instance's endpoint for interactive queries
    timeout: float = 60.0  # the application's own limit; it is killed 45 s after
    heap: str = "256m"
    lib: Path | None = None
    properties_extra: Mapping[str, str] = field(default_factory=dict)  # any other Streams property

    def properties(self, state_dir: Path) -> dict[str, str]:
        props = {"bootstrap.servers": self.bootstrap, "application.id": self.application_id,
                 "group.protocol": self.group_protocol, "state.dir": str(state_dir)}
        if self.application_server is not None:
            props["application.server"] = self.application_server
        props.update(self.properties_extra)
        return props

    def command(self, classes: Path, scratch: Path) -> list[str]:
        lib = lib_dir(self.lib)
        log4j = scratch / "log4j2.properties"
        log4j.write_text(QUIET_LOG4J2)
        return [check_java(), f"-Xmx{self.heap}", *JVM_FLAGS, f"-Dlog4j2.configurationFile={log4j}",
                "-cp", f"{classes}{os.pathsep}{lib}{os.sep}*", MAIN_CLASS,
                self.input, self.output, str(self.expected), str(int(self.timeout * 1000)),
                *(f"{k}={v}" for k, v in self.properties(scratch / "state").items())]

    def run(self) -> StreamsRun:
        """Compile if needed, run to the end and say what happened; the JVM's TCP peers are read
        every PEER_POLL_S while it runs."""
        import psutil

        classes = compile_app(self.lib)
        with tempfile.TemporaryDirectory(prefix="kqp-streams-") as tmp:
            scratch = Path(tmp)
            log = scratch / "app.log"
            started = time.monotonic()
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    self.command(classes, scratch), stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=die_with_parent if sys.platform.startswith("linux") else None)
            peers: set[tuple[str, int]] = set()
            deadline = started + self.timeout + 45
            try:
                while proc.poll() is None and time.monotonic() < deadline:
                    try:
                        connections = psutil.Process(proc.pid).net_connections(kind="tcp")
                    except psutil.NoSuchProcess:
                        break
                    peers |= {(_ipv4(c.raddr.ip), c.raddr.port) for c in connections if c.raddr}
                    time.sleep(PEER_POLL_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
                code = proc.wait(10)
            return StreamsRun(code, log.read_text(errors="replace"), peers, time.monotonic() - started)
