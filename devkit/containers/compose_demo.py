"""`make compose-demo`: the shipped docker-compose.yml up for real, with podman behind Debian's
docker-compose, and what the demo promises shown, then `down`.

    python -m devkit.containers.compose_demo [--seconds 35]

The images that cannot be pulled here are swapped for local stand-ins by
deploy/compose/standins.yml (devkit/containers/standins.py); the proxy's image is built from the
Dockerfile. Podman runs no health checks by itself (no systemd here), so a thread calls `podman
healthcheck run` for every container of the stack while it is up, which lets compose's
`service_healthy` conditions pass as Docker's would.

Then: a flat-out producer of the `demo-limited` tenant through each replica (1 MiB/s together,
deploy/compose/proxy.yaml), the rate they get together over two whole quota windows and the
fullest 11 s window, each replica's log free of store errors, Prometheus scraping both replicas,
the tenant's quota metrics from both, and after `down` nothing of the stack left. Exit 1 if any
of it fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from devkit.containers.image import Summary, in_use
from devkit.containers.podman import REPO, ContainerError, build_image, podman
from devkit.containers.standins import STANDS_IN_FOR, ensure
from devkit.producing import Timeline, produce

PROJECT = "kqpdemo"
FILES = ["-f", str(REPO / "docker-compose.yml"), "-f", str(REPO / "deploy" / "compose" / "standins.yml")]
REPLICAS = {"proxy": ("localhost:9092", 9404), "proxy-2": ("localhost:9192", 9504)}
PORTS = [9092, 9094, 9192, 9194, 9404, 9504, 9090]  # what docker-compose.yml publishes
QUOTA = 1_048_576  # demo-limited's producer_byte_rate in deploy/compose/proxy*.yaml
WINDOW = 11.0  # Kafka's quota window: 11 one-second samples
# Two producers of one client-id, one through each replica, the replicas sharing a store: each
# connection is throttled on its own, as on Kafka, so together they run a little over the quota
# (several connections of one client-id reached up to 1.20x: docs/quotas.md, "Many connections,
# one quota"); two replicas apart would give 2x. Measured 1.09, 1.12, 1.09 and 1.13 together,
# fullest windows 1.12x, 1.17x, 1.13x and 1.20x (2026-11-28, four runs; the old bounds were
# 0.85-1.2 and 1.3x).
# Bytes charged 1.5 times (Rate.record) read 0.91 together, which the old bounds let pass; 1.2
# times read 1.03.
MEAN_BOUNDS = (0.95, 1.2)
WORST_WINDOW = 1.25


class PodmanService:
    """`podman system service` on a private socket: the Docker API that docker-compose talks to."""

    def __init__(self, directory: Path) -> None:
        self.socket = directory / "podman.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> PodmanService:
        self.proc = subprocess.Popen(["podman", "system", "service", "--time", "0", self.docker_host],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise ContainerError("podman system service did not open its socket")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def compose(service: PodmanService, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker-compose", "-p", PROJECT, *FILES, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "DOCKER_HOST": service.docker_host})
    if done.returncode != 0:
        raise ContainerError(f"docker-compose {' '.join(args)} exited with {done.returncode}:\n"
                             f"{(done.stderr or done.stdout)[-3000:]}")
    return done


def project_containers() -> list[str]:
    out = podman("ps", "-a", "--filter", f"label=com.docker.compose.project={PROJECT}",
                 "--format", "{{.Names}}").stdout
    return out.split()


def container_of(service: str) -> str:
    (name,) = [n for n in project_containers() if n == f"{PROJECT}_{service}_1"]
    return name


class HealthChecks(threading.Thread):
    """Runs each stack container's health check every `interval` seconds, as Docker would."""

    def __init__(self, interval: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.interval):
            for name in project_containers():
                podman("healthcheck", "run", name, check=False, timeout=60)


def health(name: str) -> str:
    state = json.loads(podman("inspect", name).stdout)[0]["State"]
    return str((state.get("Health") or state.get("Healthcheck") or {}).get("Status", "none"))


def wait_until(what: str, condition: Any, timeout: float) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise ContainerError(f"{what}: not after {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - started


def metric_lines(port: int, name: str) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return [line for line in r.read().decode().splitlines() if line.startswith(name)]


def metric(port: int, name: str) -> float:
    for line in metric_lines(port, name):
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def prometheus(path: str, **params: str) -> Any:
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"http://127.0.0.1:9090/api/v1/{path}?{query}", timeout=5) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


def worst_window(timelines: list[Timeline], start: float, end: float) -> float:
    """The most bytes/s together in any 11 s window inside [start, end], stepped by 0.25 s."""
    worst, t = 0.0, start
    while t + WINDOW <= end:
        worst = max(worst, sum(tl.at(t + WINDOW) - tl.at(t) for tl in timelines) / WINDOW)
        t += 0.25
    return worst


def replicas_ready() -> str:
    took = wait_until("both replicas healthy",
                      lambda: all(health(container_of(s)) == "healthy" for s in REPLICAS), 120)
    wait_until("both replicas in the store", lambda: all(
        metric(port, "kafka_quota_proxy_store_replicas") == 2 for _, port in REPLICAS.values()), 60)
    return f"healthy {took:.0f} s after up; kafka_quota_proxy_store_replicas is 2 at each"


def shared_quota(seconds: float) -> str:
    topic = f"demo-{os.getpid()}"
    admin = AdminClient({"bootstrap.servers": REPLICAS["proxy"][0]})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
    start = time.monotonic() + 1.0
    timelines = [Timeline() for _ in REPLICAS]
    threads = [threading.Thread(target=produce, args=(bootstrap, topic, "demo-limited", start, seconds, tl))
               for (bootstrap, _), tl in zip(REPLICAS.values(), timelines, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(tl.errors for tl in timelines) == 0, "delivery errors"
    lo, hi = WINDOW, WINDOW * 3  # two whole windows after the first one's burst
    assert seconds >= hi, f"--seconds must be at least {hi:.0f}"
    mean = sum(tl.at(hi) - tl.at(lo) for tl in timelines) / (hi - lo) / QUOTA
    worst = worst_window(timelines, lo, seconds) / QUOTA
    each = ", ".join(f"{(tl.at(hi) - tl.at(lo)) / (hi - lo) / QUOTA:.2f}" for tl in timelines)
    line = (f"{mean:.2f} of the 1 MiB/s quota together over {lo:.0f}-{hi:.0f} s (each replica's "
            f"producer: {each}), fullest 11 s window {worst:.2f}x")
    assert MEAN_BOUNDS[0] <= mean <= MEAN_BOUNDS[1] and worst <= WORST_WINDOW, (
        f"{line}; bounds {MEAN_BOUNDS[0]}-{MEAN_BOUNDS[1]} and {WORST_WINDOW}x")
    return line


def store_clean() -> str:
    for service in REPLICAS:
        text = podman("logs", container_of(service), check=False)
        log = text.stdout + text.stderr
        trouble = [line for line in log.splitlines()
                   if ("quota store" in line and ("failed" in line or "degraded" in line))
                   or "ERROR" in line or "Traceback" in line]
        assert not trouble, f"{service}: {trouble[:3]}"
        assert "syncing every" in log, f"{service} never synced with the store"
    degraded = {s: metric(port, "kafka_quota_proxy_store_degraded") for s, (_, port) in REPLICAS.items()}
    assert not any(degraded.values()), degraded
    return "no store error in either replica's log; neither degraded"


def scraped() -> str:
    def both_up() -> bool:
        targets = prometheus("targets")["activeTargets"]
        return sorted(t["labels"]["instance"] for t in targets if t["health"] == "up") == [
            "proxy-2:9504", "proxy:9404"]

    wait_until("Prometheus scraping both replicas", both_up, 60)
    query = 'kafka_quota_proxy_byte_rate{client_id="demo-limited",quota_type="producer_byte_rate"}'
    wait_until("the tenant's rate in Prometheus from both replicas",
               lambda: len(prometheus("query", query=query)["result"]) >= 2, 60)
    instances = sorted({r["metric"]["instance"] for r in prometheus("query", query=query)["result"]})
    configured = prometheus("query", query='kafka_quota_proxy_configured_quota{client_id="demo-limited"}')
    assert len({r["metric"]["instance"] for r in configured["result"]}) == 2, configured
    return (f"targets proxy:9404 and proxy-2:9504 up; the tenant's kafka_quota_proxy_byte_rate from "
            f"{', '.join(instances)}, and its configured_quota from both")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devkit.containers.compose_demo",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=35.0, help="how long the producers run")
    args = p.parse_args(argv)
    summary = Summary("make compose-demo: docker-compose.yml up with podman")
    busy = [port for port in PORTS if in_use(port)]
    if busy:
        print(f"compose-demo: ports docker-compose.yml publishes are in use here: {busy}", file=sys.stderr)
        return 1
    try:
        # Without the cache: podman's cache keeps the final stage's install of the builder's wheel
        # (RUN --mount from the builder stage) when only the code changed, so the demo ran the
        # image of an earlier checkout (a changed quota/rate.py left the image's id as it was).
        build_image(no_cache=True)
        ensure()
    except ContainerError as exc:
        print(f"compose-demo: {exc}", file=sys.stderr)
        return 1
    for image, what in STANDS_IN_FOR.items():
        summary.figures.append(f"STAND-IN {image} for {what}")
    summary.figures.append("grafana left out: no Grafana build can be had here (its provisioning is "
                           "checked by tests/deploy/test_deploy_files.py)")
    with tempfile.TemporaryDirectory(prefix="kqp-compose-") as tmp:
        service = PodmanService(Path(tmp)).start()
        checks = HealthChecks()
        checks.start()
        try:
            started = time.monotonic()
            summary.run("docker-compose up", lambda: (
                compose(service, "up", "-d", "--no-build"),
                f"{len(project_containers())} containers in {time.monotonic() - started:.0f} s")[1])
            summary.run("both replicas healthy and in the store", replicas_ready)
            summary.run("two replicas hold one quota", lambda: shared_quota(args.seconds))
            summary.run("the shared store", store_clean)
            summary.run("Prometheus", scraped)
        finally:
            failed = not all(ok for ok, _ in summary.checks)
            if failed:
                for name in project_containers():
                    text = podman("logs", "--tail", "30", name, check=False)
                    print(f"---- {name} ----\n{text.stdout}{text.stderr}", file=sys.stderr)
            checks.halt.set()
            checks.join(10)
            try:
                compose(service, "down", "--volumes", "--timeout", "45")
            except ContainerError as exc:
                summary.check(False, f"docker-compose down: {exc}")
            left = project_containers()
            networks = [n for n in podman("network", "ls", "--format", "{{.Name}}").stdout.split()
                        if n.startswith(PROJECT)]
            service.stop()
            summary.check(not left and not networks,
                          "docker-compose down leaves nothing: " + (
                              f"left {left + networks}" if left or networks else "no container, no network"))
    summary.print()
    return 0 if all(ok for ok, _ in summary.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
