"""The two commands' error paths: one line on stderr, exit status 2, never a traceback (and no
Spark started for them), plus generate-usage end to end."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kafka_quota_proxy.analytics.cli import main
from kafka_quota_proxy.analytics.generate import MANIFEST


def one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.endswith("\n") and err.count("\n") == 1 and "Traceback" not in err
    return err.strip()


@pytest.fixture
def usage_dir(tmp_path: Path) -> Path:
    hour = tmp_path / "usage" / "dt=2026-01-05" / "hour=00"
    hour.mkdir(parents=True)
    (hour / "usage-a.jsonl").write_text("{}\n")
    return tmp_path / "usage"


def test_a_missing_usage_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    line = one_error_line(capsys, ["analyze", "--usage", missing, "--out", str(tmp_path / "o")])
    assert line == f"kafka-quota-proxy analyze: no such directory: {tmp_path / 'nope'}"


def test_a_directory_without_usage_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    line = one_error_line(capsys, ["analyze", "--usage", str(tmp_path), "--out", str(tmp_path / "o")])
    assert line == f"kafka-quota-proxy analyze: no usage files (*.jsonl, *.jsonl.gz) under {tmp_path}"


def test_a_quotas_file_that_is_not_yaml(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        usage_dir: Path) -> None:
    bad = tmp_path / "quotas.yaml"
    bad.write_text("quotas:\n  - {user: alice, producer_byte_rate: [1\n")
    line = one_error_line(capsys, ["analyze", "--usage", str(usage_dir), "--out", str(tmp_path / "o"),
                                   "--quotas", str(bad)])
    assert line.startswith(f"kafka-quota-proxy analyze: {bad}: file: not valid YAML at line ")


def test_a_quota_kafka_would_refuse(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                    usage_dir: Path) -> None:
    bad = tmp_path / "candidate.yaml"
    bad.write_text("quotas:\n  - {user: alice, producer_byte_rate: 10.5}\n")
    line = one_error_line(capsys, ["analyze", "--usage", str(usage_dir), "--out", str(tmp_path / "o"),
                                   "--candidate", str(bad)])
    assert line.startswith(f"kafka-quota-proxy analyze: {bad}: quotas[0]: ")
    assert "producer_byte_rate" in line


def test_a_quotas_file_without_a_quotas_list(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             usage_dir: Path) -> None:
    bad = tmp_path / "proxy.yaml"
    bad.write_text("upstream: [kafka:9092]\n")
    line = one_error_line(capsys, ["analyze", "--usage", str(usage_dir), "--out", str(tmp_path / "o"),
                                   "--quotas", str(bad)])
    assert line == (f"kafka-quota-proxy analyze: {bad}: quotas: missing: expected a `quotas:` list as in "
                    "the proxy's config file")


def test_an_unreadable_quotas_file(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   usage_dir: Path) -> None:
    missing = tmp_path / "missing.yaml"
    line = one_error_line(capsys, ["analyze", "--usage", str(usage_dir), "--out", str(tmp_path / "o"),
                                   "--quotas", str(missing)])
    assert line == f"kafka-quota-proxy analyze: {missing}: file: cannot read: No such file or directory"


@pytest.mark.parametrize("argv, message", [
    (["analyze", "--out", "o"], "the following arguments are required: --usage"),
    (["analyze", "--usage", "u", "--out", "o", "--percentile", "0"],
     "argument --percentile: expected a positive number, got '0'"),
    (["analyze", "--usage", "u", "--out", "o", "--percentile", "101"],
     "argument --percentile: expected a percentile in (0, 100], got '101'"),
    (["analyze", "--usage", "u", "--out", "o", "--headroom", "x"],
     "argument --headroom: expected a number, got 'x'"),
    (["analyze", "--usage", "u", "--out", "o", "--conf", "spark.x"],
     "argument --conf: expected KEY=VALUE, got 'spark.x'"),
    (["generate-usage", "--out", "o", "--interval-seconds", "7"],
     "--interval-seconds: must divide an hour (1, 2, 5, 10, 15, 30, 60, ...), got 7"),
    (["generate-usage", "--out", "o", "--tenants", "2", "--outliers", "5"],
     "--outliers: expected 0 to 2, got 5"),
])
def test_bad_arguments(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert one_error_line(capsys, argv) == f"kafka-quota-proxy {argv[0]}: {message}"


def test_no_command_or_an_unknown_one(capsys: pytest.CaptureFixture[str]) -> None:
    expected = "kafka-quota-proxy: expected a command: analyze or generate-usage"
    assert one_error_line(capsys, []) == expected
    assert one_error_line(capsys, ["analyse"]) == expected


def test_without_the_spark_extra(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("pyspark", "matplotlib") else real(name, *a))
    assert one_error_line(capsys, ["analyze", "--usage", "u", "--out", "o"]) == (
        "kafka-quota-proxy analyze: needs the spark extra (missing: pyspark, matplotlib): "
        "pip install 'kafka-quota-proxy[spark]'")


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "--help"]) == 0
    assert "--candidate FILE" in capsys.readouterr().out


def test_generate_usage(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["generate-usage", "--out", str(tmp_path), "--tenants", "5", "--days", "1",
                 "--interval-seconds", "60", "--outliers", "1", "--seed", "3", "--instance", "proxy-z"]) == 0
    out = capsys.readouterr().out.splitlines()
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert out[0].startswith(f"wrote 7,200 records (5 tenants, 1 day, 60 s intervals) to {tmp_path} in ")
    outlier = manifest["outliers"][0]
    assert out[1].startswith(f"injected outliers: {outlier['user']}/{outlier['client_id']} (")
    assert manifest["instance"] == "proxy-z" and manifest["records"] == 7200
    assert len(list(tmp_path.rglob("usage-proxy-z.jsonl*"))) == 24
