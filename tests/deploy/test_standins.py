"""Static checks of `make compose-demo`'s override (deploy/compose/standins.yml) and the stand-in
images it names: it swaps images and nothing else of the demo, and what it swaps in runs the
demo's own settings and health checks. `make compose-demo` runs them for real."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import yaml

from devkit.containers.compose_demo import worst_window
from devkit.containers.standins import HERE, KAFKA, STANDS_IN_FOR, VALKEY
from devkit.producing import Timeline
from tests.deploy.test_deploy_files import REPO, compose

STANDINS = REPO / "deploy" / "compose" / "standins.yml"
# What the override may set beside `image`, and why: the kafka stand-in takes docker-compose.yml's
# KAFKA_* listener settings as its launcher's arguments; grafana has no build here.
ALSO = {"kafka": {"command"}, "grafana": {"profiles"}}


def standins() -> dict[str, Any]:
    return yaml.safe_load(STANDINS.read_text(encoding="utf-8"))["services"]


def test_the_override_only_swaps_images() -> None:
    shipped = compose()["services"]
    for name, svc in standins().items():
        assert name in shipped, name
        assert set(svc) <= {"image"} | ALSO.get(name, set()), (name, sorted(svc))
        if "image" in svc:
            assert svc["image"] in STANDS_IN_FOR, svc["image"]
    # The proxy is never swapped: its image is the one built from the Dockerfile.
    assert not {"proxy", "proxy-2"} & standins().keys()
    assert standins()["grafana"] == {"profiles": ["grafana"]}


def test_every_stand_in_has_a_containerfile_that_says_it_is_one() -> None:
    for image in STANDS_IN_FOR:
        name = image.split("/")[-1].split(":")[0]
        text = (HERE / f"{name}.Containerfile").read_text(encoding="utf-8")
        assert "STAND-IN for" in text, name


def test_the_kafka_stand_in_serves_what_docker_compose_yml_configures() -> None:
    env = compose()["services"]["kafka"]["environment"]
    (plaintext,) = [lst for lst in env["KAFKA_LISTENERS"].split(",") if lst.startswith("PLAINTEXT://")]
    args = standins()["kafka"]["command"]
    given = dict(zip(args[::2], args[1::2], strict=True))
    assert given["--port"] == plaintext.rsplit(":", 1)[1]
    assert given["--advertised"] == env["KAFKA_ADVERTISED_LISTENERS"].removeprefix("PLAINTEXT://")
    assert given["--node-id"] == env["KAFKA_NODE_ID"]
    assert given["--listen-host"] == "0.0.0.0"
    # ... and the launcher takes each of them.
    usage = subprocess.run([sys.executable, "-m", "devkit.kafka", "serve", "--help"], capture_output=True,
                           text=True, check=True, cwd=REPO).stdout
    assert all(flag in usage for flag in given), usage


def test_the_stand_ins_have_the_tools_the_shipped_health_checks_call() -> None:
    checks = {name: " ".join(svc["healthcheck"]["test"][1:]) for name, svc in compose()["services"].items()
              if "healthcheck" in svc}
    kafka_file = (HERE / "kafka.Containerfile").read_text(encoding="utf-8")
    tool = re.match(r"(\S+)", checks["kafka"]).group(1)  # type: ignore[union-attr]
    assert re.search(rf"^COPY \S+ {re.escape(tool)}$", kafka_file, re.M), tool
    assert checks["valkey"].startswith("valkey-cli ping")
    assert re.search(r"^COPY valkey-cli /usr/local/bin/valkey-cli$",
                     (HERE / "valkey.Containerfile").read_text(encoding="utf-8"), re.M)
    assert KAFKA in STANDS_IN_FOR and VALKEY in STANDS_IN_FOR


def test_worst_window_is_the_fullest_eleven_seconds() -> None:
    one, two = Timeline(), Timeline()
    for t in range(41):
        one.marks.append((t, 1000 * t))  # 1000 B/s throughout
        two.marks.append((t, 0 if t < 20 else 5000 * (t - 20)))  # 5000 B/s from 20 s
    assert worst_window([one, two], 0.0, 40.0) == 6000.0
    assert worst_window([one], 0.0, 40.0) == 1000.0
