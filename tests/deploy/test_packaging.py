"""What `pip install .` puts into site-packages: one import name, kafka_quota_proxy, and nothing of
the demo, the benchmarks or the tests (a generic top-level `proxy` package collided with proxy.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_package(tmp_path: Path) -> None:
    # Built from a copy: setuptools writes build/ and *.egg-info into the tree it builds.
    source = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "kafka_quota_proxy", source / "kafka_quota_proxy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
                    str(wheels), str(source)], check=True, capture_output=True, timeout=240)
    (wheel,) = wheels.glob("kafka_quota_proxy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    version = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert tops == {"kafka_quota_proxy", f"kafka_quota_proxy-{version}.dist-info"}
    packages = {str(Path(name).parent).removeprefix("kafka_quota_proxy/") for name in names
                if name.endswith("/__init__.py")}
    assert packages >= {"proxy", "quota", "protocol", "config", "identity", "analytics", "cli",
                        "proxy/datapath", "proxy/stages", "proxy/quotas", "proxy/observability"}
    entry_points = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "kafka-quota-proxy = kafka_quota_proxy.cli.main:main" in entry_points
