"""The project's wheel, built once a session, for the tests that install it as a user would."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def copy_project(source: Path) -> Path:
    """What a build of the project reads, copied into the empty folder `source`: setuptools writes
    build/ and *.egg-info into the tree it builds, so the tests build from a copy."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "kafka_quota_proxy", source / "kafka_quota_proxy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return source


@pytest.fixture
def project_source(tmp_path: Path) -> Path:
    """A copy of the project to build or install from, this test's own (`copy_project`)."""
    source = tmp_path / "src"
    source.mkdir()
    return copy_project(source)


@pytest.fixture(scope="session")
def project_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel .` of the checkout, without its dependencies."""
    source = copy_project(tmp_path_factory.mktemp("src"))
    wheels = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
                    str(wheels), str(source)], check=True, capture_output=True, timeout=240)
    (wheel,) = wheels.glob("kafka_quota_proxy-*.whl")
    return wheel
