"""The project's wheel, built once a session, for the tests that install it as a user would."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def project_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel .` of the checkout, without its dependencies."""
    # Built from a copy: setuptools writes build/ and *.egg-info into the tree it builds.
    source = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "kafka_quota_proxy", source / "kafka_quota_proxy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
                    str(wheels), str(source)], check=True, capture_output=True, timeout=240)
    (wheel,) = wheels.glob("kafka_quota_proxy-*.whl")
    return wheel
