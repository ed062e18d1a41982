"""`make containers`: build the image from the repository's Dockerfile with podman and run it for
real, as the Kubernetes sidecar example runs it (deploy/kubernetes/sidecar.yaml), in front of a
Tansu broker on this machine.

    python -m devkit.containers.image [--no-cache] [--quota-seconds 24]

What it checks, each a line of the summary (exit status 1 if any fails):
- `--help`, and `check-config` of every config shipped in deploy/, mounted where the image reads it;
- the sidecar run: the image's own CMD with the manifest's args, its env var, a read-only root
  filesystem, no capabilities and an emptyDir-like tmpfs for the state file, the ConfigMap's
  config with only the addresses of this machine's broker and Valkey put in (and the quota lowered
  so that two cores can show it held); then:
  - the process runs as the non-root user the Dockerfile names (and the manifest's runAsUser);
  - the readiness probe's port and the Prometheus annotations' port and path answer, and every
    port the process listens on is one of the manifest's containerPorts;
  - the store password from the env var works (the replica is in the store, not degraded);
  - records produced through it are consumed back through it, each once and in order;
  - a producer over its quota is held to it over a whole window;
  - `podman stop` (the image's STOPSIGNAL) answers a request in flight and exits 0.
It measures the image's size, the build's time and the time from `podman run` to the first
listening port. The base images are local stand-ins (devkit/containers/bases.sh), said so here.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import struct
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer.fetch import FetchRequest

from devkit.containers.podman import (
    IMAGE,
    REPO,
    ContainerError,
    build_image,
    image_size,
    inspect,
    logs,
    podman,
    remove,
)
from devkit.processes import LOOPBACK, wait_for_port
from devkit.producing import Timeline, produce
from devkit.tansu import Broker
from devkit.valkey import ValkeyServer

SIDECAR = REPO / "deploy" / "kubernetes" / "sidecar.yaml"
SHIPPED_CONFIGS = [REPO / "deploy" / "compose" / "proxy.yaml", REPO / "deploy" / "compose" / "proxy-2.yaml"]
NAME = "kqp-containers-check"
QUOTA = 262_144  # bytes/s: the sidecar's example quota, lowered so two cores show it held
RECORDS = 2000


@dataclass
class Summary:
    """The lines a person reads at the end: each check with what was seen, and the figures."""

    title: str
    checks: list[tuple[bool, str]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)

    def check(self, ok: bool, line: str) -> bool:
        self.checks.append((ok, line))
        print(f"  {'ok  ' if ok else 'FAIL'} {line}", flush=True)
        return ok

    def run(self, line: str, step: Callable[[], str]) -> None:
        """A check whose step returns what it saw, or raises what went wrong."""
        try:
            self.check(True, f"{line}: {step()}")
        except (AssertionError, ContainerError, OSError, RuntimeError) as exc:
            self.check(False, f"{line}: {exc}")

    def print(self) -> None:
        print(f"\n== {self.title} ==")
        for ok, line in self.checks:
            print(f"{'ok  ' if ok else 'FAIL'} {line}")
        for line in self.figures:
            print(f"     {line}")
        failed = sum(not ok for ok, _ in self.checks)
        print(f"{len(self.checks) - failed} passed, {failed} failed")


# -- the manifest ---------------------------------------------------------------------------------


def sidecar_documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(SIDECAR.read_text(encoding="utf-8")) if d]


def of_kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in sidecar_documents() if d["kind"] == kind]
    return doc


def sidecar_container() -> dict[str, Any]:
    pod = of_kind("Deployment")["spec"]["template"]
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "kafka-quota-proxy"]
    return {**container, "annotations": pod["metadata"].get("annotations", {}),
            "volumes": pod["spec"]["volumes"]}


def dockerfile_user() -> int:
    (user,) = re.findall(r"^USER\s+(\d+)", (REPO / "Dockerfile").read_text(encoding="utf-8"), re.M)
    return int(user)


# -- the checks -----------------------------------------------------------------------------------


def check_config_runs(summary: Summary, config_dir: Path) -> None:
    target = "/etc/kafka-quota-proxy/proxy.yaml"
    configs = [(str(p.relative_to(REPO)), p.read_text(encoding="utf-8")) for p in SHIPPED_CONFIGS]
    configs.append(("deploy/kubernetes/sidecar.yaml ConfigMap", of_kind("ConfigMap")["data"]["proxy.yaml"]))
    for where, text in configs:
        path = config_dir / re.sub(r"\W+", "-", where)
        path.write_text(text, encoding="utf-8")
        done = podman("run", "--rm", "-v", f"{path}:{target}:ro", IMAGE, "check-config", target, check=False)
        summary.check(done.returncode == 0 and f"{target}: OK" in done.stdout,
                      f"check-config {where} in the image: exit {done.returncode}"
                      + ("" if done.returncode == 0 else f"\n{done.stdout}{done.stderr}"))


def sidecar_config(broker: Broker, node_id: int, valkey: ValkeyServer) -> dict[str, Any]:
    """The ConfigMap's config with this machine's addresses in the placeholders' stead."""
    config = yaml.safe_load(of_kind("ConfigMap")["data"]["proxy.yaml"])
    config["upstream"] = [broker.address]
    config["store"]["url"] = f"redis://{valkey.address}"
    # The manifest serves broker ids 0..2 on 9093..9095; Tansu's id is not among them, so it is
    # pinned to the first (as the manifest's comment says to do for other ids).
    config["node_ports"] = {node_id: config["node_port_base"]}
    config["quotas"] = [{"client-id": "my-app", "producer_byte_rate": QUOTA}]
    return config


def metric(port: int, path: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}{path}", timeout=5) as r:
        text = r.read().decode()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def round_trip(bootstrap: str, topic: str) -> str:
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "containers-check", "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(topic, f"{i:06d}".encode())
    assert producer.flush(60) == 0, "records left unacknowledged"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "client.id": "containers-check", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen: list[int] = []
    deadline = time.monotonic() + 60
    while len(seen) < RECORDS and time.monotonic() < deadline:
        for msg in consumer.consume(500, 0.5):
            assert msg.error() is None, msg.error()
            seen.append(int(msg.value() or b"-1"))
    consumer.close()
    assert seen == list(range(RECORDS)), f"read {len(seen)} of {RECORDS}, not each once in order"
    return f"{RECORDS} records produced and read back through the proxy, each once, in order"


def quota_held(bootstrap: str, topic: str, seconds: float) -> str:
    timeline = Timeline()
    produce(bootstrap, topic, "my-app", time.monotonic(), seconds, timeline)
    lo, hi = 11.0, seconds - 2.0  # after the first window's burst
    rate = (timeline.at(hi) - timeline.at(lo)) / (hi - lo)
    assert timeline.errors == 0, f"{timeline.errors} delivery errors"
    assert 0.6 * QUOTA < rate < 1.3 * QUOTA, f"{rate / QUOTA:.2f} of the quota over {lo:.0f}-{hi:.0f} s"
    return f"{rate / QUOTA:.2f} of a {QUOTA} B/s producer_byte_rate over {lo:.0f}-{hi:.0f} s, flat out"


def long_poll_fetch(topic: str, offset: int, correlation_id: int, wait_ms: int) -> bytes:
    t = FetchRequest.FetchTopic
    req = FetchRequest(replica_id=-1, max_wait_ms=wait_ms, min_bytes=1, max_bytes=1024, isolation_level=0,
                       topics=[t(topic=topic, partitions=[t.FetchPartition(
                           partition=0, fetch_offset=offset, partition_max_bytes=1024,
                           log_start_offset=-1, current_leader_epoch=-1)])])
    req.with_header(correlation_id=correlation_id, client_id="drain-check")
    return bytes(req.encode(version=4, header=True, framed=True))


def stop_answers_in_flight(node_port: int, topic: str) -> str:
    with socket.create_connection((LOOPBACK, node_port), timeout=30) as s:
        s.sendall(long_poll_fetch(topic, RECORDS * 10, 4242, wait_ms=3000))  # past the end: held
        time.sleep(0.5)
        stopped: list[int] = []
        stopper = threading.Thread(target=lambda: stopped.append(
            podman("stop", "--time", "40", NAME).returncode))
        started = time.monotonic()
        stopper.start()
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        answer = s.recv(size, socket.MSG_WAITALL)
        answered = time.monotonic() - started
    stopper.join(60)
    assert struct.unpack_from(">i", answer, 0)[0] == 4242, "the request in flight was not answered"
    state = inspect(NAME)["State"]
    assert state["ExitCode"] == 0, f"exit code {state['ExitCode']}"
    text = logs(NAME)
    assert re.search(r"shutting down: draining \d+ connection", text), "no drain in the log"
    assert "Traceback" not in text
    return f"the Fetch in flight answered {answered:.1f} s after podman stop; exit code 0"


def sidecar_run(summary: Summary, workdir: Path, quota_seconds: float) -> None:
    container = sidecar_container()
    config_mount = next(m for m in container["volumeMounts"] if m["name"] == "kafka-quota-proxy-config")
    state_mount = next(m for m in container["volumeMounts"] if m["name"] == "kafka-quota-proxy-state")
    ports = {p["containerPort"] for p in container["ports"]}
    (password_env,) = [e["name"] for e in container["env"]]
    busy = [p for p in ports if in_use(p)]
    if busy:
        summary.check(False, f"the sidecar run needs the manifest's ports, and {busy} are in use here")
        return
    password = os.urandom(12).hex()
    broker = Broker().start()
    valkey = ValkeyServer(password=password).start()
    try:
        node_id = broker.node_id()
        config = sidecar_config(broker, node_id, valkey)
        config_dir = workdir / "configmap"
        config_dir.mkdir()
        (config_dir / "proxy.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        remove(NAME)
        started = time.monotonic()
        podman("run", "-d", "--name", NAME, "--network", "host", "--read-only", "--cap-drop", "ALL",
               "--security-opt", "no-new-privileges", "--tmpfs", f"{state_mount['mountPath']}:rw,mode=1777",
               "-v", f"{config_dir}:{config_mount['mountPath']}:ro", "-e", f"{password_env}={password}",
               IMAGE, *container["args"])
        listen_port = int(config["listen"].rsplit(":", 1)[1])
        wait_for_port(listen_port, 60)
        startup = time.monotonic() - started
        summary.figures.append(f"startup, podman run to the first listening port: {startup:.2f} s")
        node_port = config["node_port_base"]
        wait_for_port(node_port, 30)
        pid = inspect(NAME)["State"]["Pid"]

        def user() -> str:
            uids = psutil.Process(pid).uids()
            want = dockerfile_user()
            assert uids.real == uids.effective == want != 0, f"uid {uids}"
            assert container["securityContext"]["runAsUser"] == want, "the manifest's runAsUser differs"
            return f"uid {want}, the Dockerfile's USER and the manifest's runAsUser"

        def probes() -> str:
            probe = container["readinessProbe"]["tcpSocket"]["port"]
            socket.create_connection((LOOPBACK, probe), timeout=2).close()
            notes = container["annotations"]
            m_port, m_path = int(notes["prometheus.io/port"]), notes["prometheus.io/path"]
            assert metric(m_port, m_path, "kafka_quota_proxy_store_replicas") >= 1
            listening = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
                         if c.status == psutil.CONN_LISTEN}
            assert listening <= ports, f"listens on {sorted(listening - ports)}, not containerPorts"
            return (f"readiness tcpSocket {probe} and {m_path} on {m_port} answer; it listens on "
                    f"{sorted(listening)}, all containerPorts")

        def store() -> str:
            notes = container["annotations"]
            m_port, m_path = int(notes["prometheus.io/port"]), notes["prometheus.io/path"]
            assert metric(m_port, m_path, "kafka_quota_proxy_store_degraded") == 0, "degraded"
            assert "quota store" not in "".join(
                line for line in logs(NAME).splitlines() if "WARNING" in line or "ERROR" in line)
            return f"the password from {password_env} opens the store; not degraded, no store error"

        summary.run("runs as non-root", user)
        summary.run("probes and ports", probes)
        summary.run("config path and env var", lambda: (
            f"{config_mount['mountPath']}/proxy.yaml, the image's CMD path, read: "
            + store()))
        bootstrap = f"{LOOPBACK}:{listen_port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics = {"roundtrip": f"rt-{os.getpid()}", "quota": f"q-{os.getpid()}"}
        for name in topics.values():
            admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
        del admin  # closed now: it would otherwise retry the stopped proxy, loudly
        summary.run("produce and consume through the image",
                    lambda: round_trip(bootstrap, topics["roundtrip"]))
        summary.run("quota held", lambda: quota_held(bootstrap, topics["quota"], quota_seconds))
        summary.run("SIGTERM drains", lambda: stop_answers_in_flight(node_port, topics["roundtrip"]))
    finally:
        if summary.checks and not all(ok for ok, _ in summary.checks):
            print("---- the container's log ----\n" + logs(NAME)[-4000:], file=sys.stderr)
        remove(NAME)
        valkey.stop()
        broker.stop()


def in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((LOOPBACK, port)) == 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devkit.containers.image",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--no-cache", action="store_true", help="build every layer anew (the timed build)")
    p.add_argument("--quota-seconds", type=float, default=24.0, help="how long the quota check produces")
    args = p.parse_args(argv)
    summary = Summary("make containers: the image built and run with podman")
    base = podman("image", "inspect", "docker.io/library/python:3.12-slim", "--format",
                  "{{index .Labels \"org.opencontainers.image.description\"}}", check=False).stdout.strip()
    if "STAND-IN" in base:
        summary.figures.append("FROM python:3.12-slim is a local STAND-IN: Debian 12's Python 3.11 "
                               "(devkit/containers/bases.sh); no image registry is reachable here")
    try:
        seconds = build_image(no_cache=args.no_cache)
    except ContainerError as exc:
        summary.check(False, f"podman build of the Dockerfile: {exc}")
        summary.print()
        return 1
    summary.check(True, f"podman build --pull=never of the Dockerfile, unchanged: {seconds:.0f} s"
                  + (" (no cache)" if args.no_cache else ""))
    size, base_size = image_size(), image_size("docker.io/library/python:3.12-slim")
    summary.figures.append(f"image {IMAGE}: {size / 1e6:.0f} MB, of which {(size - base_size) / 1e6:.0f} MB "
                           f"above its base ({base_size / 1e6:.0f} MB)")
    summary.figures.append(f"build time: {seconds:.1f} s{' with no cache' if args.no_cache else ''}")
    helped = podman("run", "--rm", IMAGE, "--help", check=False)
    summary.check(helped.returncode == 0 and "usage: kafka-quota-proxy" in helped.stdout,
                  f"--help: exit {helped.returncode}")
    with tempfile.TemporaryDirectory(prefix="kqp-containers-") as tmp:
        check_config_runs(summary, Path(tmp))
        sidecar_run(summary, Path(tmp), args.quota_seconds)
    summary.print()
    return 0 if all(ok for ok, _ in summary.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
