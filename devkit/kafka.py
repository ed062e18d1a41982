"""A real Apache Kafka 4 broker (KRaft, no ZooKeeper) from Maven Central's jars, beside the
Tansu launcher (devkit.tansu): one combined node, or a cluster of brokers with one dedicated
controller, on free loopback ports, each node a child process in its own session.

The jars come from devkit/pom.xml through Maven (`resolve_jars`), cached per Kafka version. The
child runs in its own session, so a Ctrl-C at the terminal reaches only its parent, which then
stops it in order; on Linux it also dies with its parent if that is killed outright. Its log
stays in its directory after it stops. Every failure (no java or mvn, a Java too old, a resolve
that fails, a node that exits or never answers a metadata request) is a KafkaError whose message
says what happened, with the end of the log where there is one.

This module and devkit/kafka_jvm.py (Java, Maven, the jars, a metadata request) import only the
standard library at module level: the two are copied alone, with the jars, into an image that
has Python 3 and a JRE but neither Maven nor the project, where `python3 kafka.py serve --lib DIR
...` runs Kafka in the foreground. A cluster of nodes is devkit/kafka_cluster.py.
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

try:
    from devkit.kafka_jvm import (
        JVM_FLAGS,
        LOG4J2,
        LOOPBACK,
        BrokerInfo,
        DelegationToken,
        KafkaError,
        check_java,
        die_with_parent,
        end,
        free_port,
        java_command,
        lib_dir,
        metadata,
        new_cluster_id,
        resolve_jars,
        run_tool,
        scram_client_properties,
        tail_of,
    )
except ImportError:  # run alone beside kafka_jvm.py, as in the Kafka stand-in image (even with -I)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kafka_jvm import (  # type: ignore[import-not-found,no-redef]
        JVM_FLAGS,
        LOG4J2,
        LOOPBACK,
        BrokerInfo,
        DelegationToken,
        KafkaError,
        check_java,
        die_with_parent,
        end,
        free_port,
        java_command,
        lib_dir,
        metadata,
        new_cluster_id,
        resolve_jars,
        run_tool,
        scram_client_properties,
        tail_of,
    )

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
# delegation.token.secret.key of a devkit node with delegation tokens: the same on every node of
# a cluster (controllers included, in KRaft), and no secret, as the nodes are throwaway ones.
DELEGATION_TOKEN_SECRET = "kqp-devkit-delegation-token-key"


# -- A node ------------------------------------------------------------------------------------------


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
                             f"(exit {out.returncode}):\n{tail_of(out.stdout + out.stderr)}")

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
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None)
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
            return tail_of(self.log_path.read_text(errors="replace"), lines)
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, Kafka's controlled shutdown, then SIGKILL if it has not ended in `timeout`."""
        if self.proc is not None:
            end(self.proc, timeout)

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
                             f"{tail_of(out.stdout + out.stderr)}")

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
                             f"(exit {out.returncode}):\n{tail_of(out.stderr)}")
        return DelegationToken(created[1], row[1])

    @property
    def stopped(self) -> bool:
        return self.proc is None or self.proc.poll() is not None


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
