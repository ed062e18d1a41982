"""The quota state file and the credentials file, killed in the middle of being written.

Each writer writes numbered versions of a file, one after another, and says which it has
finished; it is killed with SIGKILL at a random moment, and the file is then read with the
proxy's own loader. It must be a whole version: the last one finished, or the one being written
(renamed in before the writer could say so); never empty, torn or unparseable. Temp files left
by killed writers must not pile up.

Writers: a forked child calling the proxy's own save functions in a loop (cheap, so hundreds of
kills); real `kafka-quota-proxy users add` processes; a real proxy answering a stream of
AlterClientQuotas requests. `naive` writes in place (truncate, then write) and exists to show
that the check catches a torn file when there is one.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest, AlterClientQuotasResponse

from devkit.processes import LOOPBACK, ProxyProcess
from devkit.proxy_faults.in_flight import recv_exactly
from devkit.tansu import Broker
from kafka_quota_proxy.config.credentials_file import read_users, write_users
from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.quota_state import ApiQuotaLayer, load_state, save_state
from kafka_quota_proxy.identity.credentials import CredentialStore, UserCredentials
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey

KINDS = ("quota-state", "credentials", "naive")
ENTITIES = 300  # a quota state of about 40 kB
USERS = 12  # a credentials file of about 6 kB


@dataclass
class KillReport:
    """What the kills found."""

    writer: str
    kills: int = 0
    whole: int = 0  # reads that found a whole version allowed at that moment
    torn: list[str] = field(default_factory=list)  # what was wrong, for each bad read
    versions_finished: int = 0  # versions the writers said they had finished, over all kills
    leftovers_max: int = 0  # temp files beside the file after a kill, at most
    leftovers_end: int = 0  # after one more complete write at the end

    @property
    def clean(self) -> bool:
        return not self.torn and self.whole == self.kills and self.leftovers_end == 0


# -- versions of each file ----------------------------------------------------------------------


def _layer(version: int) -> ApiQuotaLayer:
    rate = QuotaKey.PRODUCER_BYTE_RATE
    return ApiQuotaLayer({QuotaEntity(client_id=f"c{j}"): {rate: float(version * 1000 + j + 1)}
                          for j in range(ENTITIES)}, {})


def _layer_version(layer: ApiQuotaLayer) -> int:
    first = layer.values[QuotaEntity(client_id="c0")][QuotaKey.PRODUCER_BYTE_RATE]
    version = int(first) // 1000
    if layer != _layer(version):
        raise ValueError(f"not version {version} whole")
    return version


_user: UserCredentials | None = None


def _credentials() -> UserCredentials:
    global _user
    if _user is None:
        store = CredentialStore()
        store.add("u", "a-Password-1", ["SCRAM-SHA-256", "SCRAM-SHA-512"], scram_iterations=4096)
        _user = store.entries()["u"]
    return _user


def _users(version: int) -> dict[str, UserCredentials]:
    return {f"v{version}-u{j}": _credentials() for j in range(USERS)}


def _users_version(users: dict[str, UserCredentials]) -> int:
    if not users:
        raise ValueError("no users")
    version = int(next(iter(users)).split("-")[0][1:])
    if users != _users(version):
        raise ValueError(f"not version {version} whole")
    return version


def _write_naive(path: Path, text: str) -> None:
    # A millisecond between chunks, so that the file spends most of each write torn, whatever
    # the disk: with its fsync taking the most of each write, a loaded machine's 40 kills once
    # found no torn file, and the test that the check can fail failed.
    with open(path, "w", encoding="utf-8") as f:
        for at in range(0, len(text), 4096):
            f.write(text[at:at + 4096])
            f.flush()
            time.sleep(0.001)
        os.fsync(f.fileno())


def _writer(kind: str, path: Path) -> Callable[[int], None]:
    if kind == "quota-state":
        return lambda v: save_state(path, _layer(v))
    if kind == "credentials":
        return lambda v: write_users(path, _users(v))
    if kind == "naive":
        import json
        return lambda v: _write_naive(path, json.dumps({"version": 1, "entities": [
            {"entity": {"client-id": f"c{j}"}, "values": {"producer_byte_rate": float(v * 1000 + j + 1)},
             "removed": []} for j in range(ENTITIES)]}, indent=2) + "\n")
    raise ValueError(f"kind must be one of {KINDS}")


def _reader(kind: str, path: Path) -> Callable[[], int | None]:
    """The version in the file, None if there is no file; raises if it is not a whole one."""
    def read() -> int | None:
        if not path.exists():
            return None
        if kind == "credentials":
            return _users_version(read_users(path))
        return _layer_version(load_state(path))
    return read


def temp_files(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(path.parent) if n.startswith(f".{path.name}.") and n.endswith(".tmp"))


def _check(report: KillReport, read: Callable[[], int | None], allowed: set[int | None]) -> int | None:
    try:
        found = read()
    except (ConfigError, ValueError, KeyError, TypeError) as e:
        report.torn.append(f"{type(e).__name__}: {str(e)[:120]}")
        return None
    if found in allowed:
        report.whole += 1
    else:
        report.torn.append(f"version {found}, expected one of {sorted(allowed, key=str)}")
    return found


# -- a forked writer -----------------------------------------------------------------------------


def fork_kills(kind: str, directory: Path, kills: int, seed: int = 1) -> KillReport:
    """`kills` times: fork a child writing versions of the file in a loop, SIGKILL it after a
    random delay of up to three writes' time, read the file."""
    path = directory / ("users.yaml" if kind == "credentials" else "proxy.yaml.quota-state.json")
    write, read = _writer(kind, path), _reader(kind, path)
    if kind == "credentials":
        _credentials()  # hashed once, before forking
    rng = random.Random(seed)
    report = KillReport(f"forked writer ({kind})")
    began = time.monotonic()
    write(0)
    max_delay = 3 * (time.monotonic() - began)
    current: int | None = 0
    for _ in range(kills):
        start = 0 if current is None else current + 1
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.close(r)
            try:
                version = start
                while True:
                    write(version)
                    os.write(w, struct.pack(">q", version))
                    version += 1
            finally:
                os._exit(0)
        os.close(w)
        time.sleep(rng.uniform(0.0, max_delay))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with os.fdopen(r, "rb") as progress:
            done = progress.read()
        finished = [v for (v,) in struct.iter_unpack(">q", done[: len(done) // 8 * 8])]
        report.kills += 1
        report.versions_finished += len(finished)
        allowed = {finished[-1], finished[-1] + 1} if finished else {current, start}
        found = _check(report, read, allowed)
        current = found if found is not None else current
        report.leftovers_max = max(report.leftovers_max, len(temp_files(path)))
    if kind != "naive":
        write((current or 0) + 1)
        report.leftovers_end = len(temp_files(path))
    return report


# -- real `users add` processes ---------------------------------------------------------------------


def _users_add(path: Path, name: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "kafka_quota_proxy", "users", "add", name,
                             "--file", str(path), "--password-stdin", "--mechanisms", "SCRAM-SHA-256"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc


def cli_kills(directory: Path, kills: int, seed: int = 1) -> KillReport:
    """`kills` runs of `users add`, each SIGKILLed at a random moment of the second half of its
    run (the length of a run measured first; the file is written at its end); the users in the
    file must be those added before, plus perhaps it."""
    path = directory / "users.yaml"
    rng = random.Random(seed)
    report = KillReport("kafka-quota-proxy users add")
    started = time.monotonic()
    proc = _users_add(path, "u0")
    proc.communicate(b"a-Password-1\n", timeout=120)
    run_seconds = time.monotonic() - started
    added = ["u0"]

    def read() -> int | None:
        names = set(read_users(path, missing_ok=True))
        for count in (len(added), len(added) + 1):
            if names == {f"u{i}" for i in range(count)}:
                return count
        raise ValueError(f"users {sorted(names)}, expected u0..u{len(added) - 1} and perhaps u{len(added)}")

    for _ in range(kills):
        name = f"u{len(added)}"
        proc = _users_add(path, name)
        assert proc.stdin is not None
        proc.stdin.write(b"a-Password-1\n")
        proc.stdin.close()
        time.sleep(rng.uniform(0.5, 1.3) * run_seconds)  # the write is at the end of a run
        proc.kill()
        proc.wait(30)
        report.kills += 1
        found = _check(report, read, {len(added), len(added) + 1})
        if found == len(added) + 1:
            added.append(name)
            report.versions_finished += 1
        report.leftovers_max = max(report.leftovers_max, len(temp_files(path)))
    proc = _users_add(path, f"u{len(added)}")
    proc.communicate(b"a-Password-1\n", timeout=120)
    report.leftovers_end = len(temp_files(path))
    return report


def concurrent_adds(directory: Path, n: int = 20) -> list[str]:
    """`n` `users add` processes of different users, let go at the same instant (each waits for
    its password on standard input until all have started); the users in the file after."""
    path = directory / "users.yaml"
    procs = [_users_add(path, f"user{i}") for i in range(n)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(_reading_stdin(p.pid) for p in procs):
        time.sleep(0.05)
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(b"a-Password-1\n")
    for p in procs:
        assert p.stdin is not None
        p.stdin.close()
    for p in procs:
        assert p.stderr is not None
        if p.wait(120) != 0:
            raise RuntimeError(f"users add exited {p.returncode}: {p.stderr.read().decode(errors='replace')}")
        p.stderr.close()
    return sorted(read_users(path))


def _reading_stdin(pid: int) -> bool:
    """Linux: blocked in read(0, ...), i.e. waiting for the password."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().startswith("0 0x0 ")
    except OSError:
        return True  # cannot tell (not Linux): go on


# -- a real proxy, changing quotas through AlterClientQuotas -----------------------------------------


def _alter(sock: socket.socket, correlation_id: int, client_id: str, value: float) -> int:
    cls: Any = AlterClientQuotasRequest
    req = cls(entries=[cls.EntryData(entity=[cls.EntryData.EntityData(entity_type="client-id",
                                                                      entity_name=client_id)],
                                     ops=[cls.EntryData.OpData(key="producer_byte_rate", value=value,
                                                               remove=False)])],
              validate_only=False)
    req.with_header(correlation_id=correlation_id, client_id="kafka-configs")
    sock.sendall(req.encode(version=1, header=True, framed=True))
    head = recv_exactly(sock, 4)
    if len(head) < 4:
        raise ConnectionError("closed")
    body = recv_exactly(sock, struct.unpack(">i", head)[0])
    return int(AlterClientQuotasResponse.decode(body[5:], version=1).entries[0].error_code)


def _alter_until(port: int, progress: dict[str, int], stop: threading.Event, entities: int) -> None:
    """Change quotas one after another, counting those acknowledged, until stopped or cut off."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=10) as sock:
            while not stop.is_set():
                i = progress["acked"]
                if _alter(sock, i, f"c{i % entities}", float(1000 + i)) != 0:
                    return
                progress["acked"] = i + 1
    except OSError:
        return


def proxy_kills(broker: Broker, node_id: int, directory: Path, kills: int, seed: int = 1,
                entities: int = 100) -> KillReport:
    """`kills` times: start the proxy with the state file in `directory`, change quotas through
    AlterClientQuotas one after another (client-id c<j % entities> set to the change's number),
    SIGKILL the proxy at a random moment, and read the state file. Every change the proxy
    acknowledged must be in it, and at most the one change after."""
    path = directory / "quota-state.json"
    rng = random.Random(seed)
    report = KillReport("proxy answering AlterClientQuotas")
    acked = 0  # changes acknowledged so far, over every proxy

    def expected(changes: int) -> dict[QuotaEntity, dict[QuotaKey, float]]:
        values: dict[QuotaEntity, dict[QuotaKey, float]] = {}
        for i in range(changes):
            values[QuotaEntity(client_id=f"c{i % entities}")] = {QuotaKey.PRODUCER_BYTE_RATE: float(1000 + i)}
        return values

    def read() -> int | None:
        if not path.exists():
            return 0
        values = load_state(path).values
        for n in (acked, acked + 1):
            if values == expected(n):
                return n
        raise ValueError(f"{sum(map(len, values.values()))} values, not the {acked} acknowledged changes")

    for _ in range(kills):
        proxy = ProxyProcess(broker.address, node_id,
                             extra_config={"quota": {"state_file": str(path)}}).start()
        stop = threading.Event()
        progress = {"acked": acked}
        worker = threading.Thread(target=_alter_until, args=(proxy.port, progress, stop, entities),
                                  daemon=True)
        worker.start()
        time.sleep(rng.uniform(0.2, 1.0))
        assert proxy.proc is not None
        proxy.proc.kill()
        proxy.proc.wait(10)
        stop.set()
        worker.join(15)
        report.versions_finished += progress["acked"] - acked
        acked = progress["acked"]
        report.kills += 1
        found = _check(report, read, {acked, acked + 1})
        if found == acked + 1:
            acked += 1  # written before the proxy could answer: the next change follows it
        report.leftovers_max = max(report.leftovers_max, len(temp_files(path)))
    save_state(path, ApiQuotaLayer(expected(acked), {}))
    report.leftovers_end = len(temp_files(path))
    return report

