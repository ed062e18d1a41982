"""What `pip install .` puts into site-packages: one import name, kafka_quota_proxy, and nothing of
the demo, the benchmarks or the tests (a generic top-level `proxy` package collided with proxy.py)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_package(project_wheel: Path) -> None:
    wheel = project_wheel
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    version = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert tops == {"kafka_quota_proxy", f"kafka_quota_proxy-{version}.dist-info"}
    packages = {str(Path(name).parent).removeprefix("kafka_quota_proxy/") for name in names
                if name.endswith("/__init__.py")}
    assert packages >= {"proxy", "quota", "protocol", "config", "identity", "analytics", "cli",
                        "proxy/datapath", "proxy/stages", "proxy/quota_runtime", "proxy/observability"}
    # Kafka's message specs the codec is built from (protocol/apis.py) are package data.
    assert "kafka_quota_proxy/protocol/kafka_specs/ShareFetchResponse.json" in names
    entry_points = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "kafka-quota-proxy = kafka_quota_proxy.cli.main:main" in entry_points


@pytest.mark.slow
def test_an_editable_install_prints_nothing(project_source: Path, tmp_path: Path) -> None:
    """`make`'s install (`pip install --quiet -e .`) says nothing: setuptools once printed a boxed
    notice about its editable-install finder, then a deprecation of the license table, into the
    first lines of a newcomer's `make demo`."""
    # This venv's pip (as new as `make` makes it: a fresh venv's older pip hides the notice),
    # installing into a prefix of its own.
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                           "--disable-pip-version-check", "--no-deps", "--prefix",
                           str(tmp_path / "prefix"), "-e", str(project_source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout + done.stderr == ""
