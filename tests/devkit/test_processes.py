"""devkit.processes.ProxyProcess: which checkout's proxy it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devkit.processes import REPO, ProxyProcess

HERE = Path(__file__).resolve().parents[2]


def test_the_proxy_runs_this_checkouts_code_from_any_folder(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = ProxyProcess("127.0.0.1:9092", 1).env()
    assert REPO == HERE and env is not None and env["PYTHONPATH"] == str(REPO)
    where = "import kafka_quota_proxy; print(kafka_quota_proxy.__file__)"
    found = subprocess.run([sys.executable, "-c", where], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=60, check=True)
    assert Path(found.stdout.strip()) == REPO / "kafka_quota_proxy" / "__init__.py"


def test_another_interpreter_or_a_pythonpath_already_set_chooses_for_itself(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert ProxyProcess("127.0.0.1:9092", 1, python="/opt/plain/bin/python").env() is None
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")  # bench.ab's tree under comparison
    assert ProxyProcess("127.0.0.1:9092", 1).env() is None
