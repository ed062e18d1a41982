"""`kafka-quota-proxy users` (cli/users.py), run as the command it is: add, list and remove
users in a credentials file, one-line errors with exit status 2, and no password ever printed."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kafka_quota_proxy.config.credentials_file import load_credentials, save_credentials
from kafka_quota_proxy.identity.credentials import MECHANISMS, PLAIN_MIN_ITERATIONS, CredentialStore

REPO = Path(__file__).resolve().parents[2]
CLI_PASSWORD = "Cli-Pa55word-that-must-not-leak"


def users_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "kafka_quota_proxy", "users", *args], input=stdin,
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=60)


def assert_no_leak(result: subprocess.CompletedProcess[str]) -> None:
    assert CLI_PASSWORD not in result.stdout and CLI_PASSWORD not in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # seconds of CPU: make test, not make check
def test_cli_add_list_remove(tmp_path: Path) -> None:
    path = str(tmp_path / "users.yaml")
    added = users_cli("add", "alice", "--file", path, "--password-stdin", stdin=CLI_PASSWORD + "\n")
    assert added.returncode == 0, added.stderr
    assert added.stdout == f"Added user alice (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN) in {path}\n"
    assert_no_leak(added)

    plain = users_cli("add", "bob", "--file", path, "--password-stdin", "--mechanisms", "plain",
                      stdin=CLI_PASSWORD)  # no trailing newline is fine too
    assert plain.returncode == 0 and plain.stdout == f"Added user bob (PLAIN) in {path}\n"

    listed = users_cli("list", "--file", path)
    assert listed.returncode == 0
    assert listed.stdout == "alice\tSCRAM-SHA-256,SCRAM-SHA-512,PLAIN\nbob\tPLAIN\n"
    assert_no_leak(listed)

    store = load_credentials(path)
    assert store.verify_plain("alice", CLI_PASSWORD) and store.verify_plain("bob", CLI_PASSWORD)
    assert stat.S_IMODE(Path(path).stat().st_mode) == 0o600
    assert CLI_PASSWORD not in Path(path).read_text()

    removed = users_cli("remove", "alice", "--file", path)
    assert removed.returncode == 0 and removed.stdout == f"Removed user alice from {path}\n"
    assert users_cli("list", "--file", path).stdout == "bob\tPLAIN\n"


@pytest.mark.slow  # starts the CLI as a process: about a second each
def test_cli_add_again_changes_the_password(tmp_path: Path) -> None:
    path = str(tmp_path / "users.yaml")
    users_cli("add", "alice", "--file", path, "--password-stdin", "--mechanisms", "PLAIN", stdin="old\n")
    changed = users_cli("add", "alice", "--file", path, "--password-stdin",
                        "--mechanisms", "SCRAM-SHA-512,PLAIN", stdin=CLI_PASSWORD + "\r\n")
    assert changed.returncode == 0
    assert changed.stdout == f"Updated user alice (SCRAM-SHA-512, PLAIN) in {path}\n"
    store = load_credentials(path)
    assert store.verify_plain("alice", CLI_PASSWORD) and not store.verify_plain("alice", "old")


@pytest.mark.slow  # starts the CLI as a process: about a second each
def test_cli_list_quotes_odd_names(tmp_path: Path) -> None:
    path = str(tmp_path / "users.json")
    users_cli("add", "bob smith", "--file", path, "--password-stdin", "--mechanisms", "PLAIN", stdin="pw\n")
    assert users_cli("list", "--file", path).stdout == "'bob smith'\tPLAIN\n"
    assert json.loads(Path(path).read_text())["users"][0]["name"] == "bob smith"


@pytest.mark.slow  # starts the CLI as a process: about a second each
@pytest.mark.parametrize("args, stdin, expected", [
    (("add", "alice", "--password-stdin"), "", "no password on the first line of standard input"),
    (("add", "alice", "--password-stdin"), "\n", "no password on the first line of standard input"),
    (("add", "alice"), CLI_PASSWORD + "\n", "standard input is not a terminal; use --password-stdin"),
    (("add", "alice", "--password-stdin", "--mechanisms", "SCRAM-SHA-256,MD5"), CLI_PASSWORD,
     "--mechanisms: unknown SASL mechanism 'MD5'"),
    (("add", "alice", "--password-stdin", "--mechanisms", "SCRAM-SHA-256"), "non\u00a0breaking\n",
     "password: the password changes under SASLprep"),
    (("add", "", "--password-stdin"), CLI_PASSWORD, "user: the user name must be a non-empty string"),
    (("remove", "carol"), "", "user: no user carol"),
])
def test_cli_errors_are_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], stdin: str,
                                            expected: str) -> None:
    path = tmp_path / "users.yaml"
    existing = CredentialStore()
    existing.add("existing", "an existing user's password", MECHANISMS, plain_iterations=PLAIN_MIN_ITERATIONS)
    save_credentials(existing, path)
    before = path.read_bytes()
    result = users_cli(*args, "--file", str(path), stdin=stdin)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("kafka-quota-proxy: config error: ")
    assert expected in result.stderr
    assert_no_leak(result)
    assert path.read_bytes() == before  # a refused change leaves the file alone


@pytest.mark.slow  # starts the CLI as a process: about a second each
def test_cli_refuses_to_overwrite_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    path.write_text("version: 7\nusers: []\n")
    result = users_cli("add", "alice", "--file", str(path), "--password-stdin", stdin=CLI_PASSWORD)
    assert result.returncode == 2
    assert result.stderr == (f"kafka-quota-proxy: config error: {path}: credentials: "
                             "unsupported version 7, expected 1\n")
    assert path.read_text() == "version: 7\nusers: []\n"


@pytest.mark.slow  # starts the CLI as a process: about a second each
def test_cli_missing_file(tmp_path: Path) -> None:
    for command in ("list", "remove"):
        args = (command, "--file", str(tmp_path / "nope.yaml")) if command == "list" else \
            (command, "alice", "--file", str(tmp_path / "nope.yaml"))
        result = users_cli(*args)
        assert result.returncode == 2 and "the credentials file does not exist" in result.stderr


@pytest.mark.slow  # starts the CLI as a process: about a second each
def test_cli_usage_errors_exit_2(tmp_path: Path) -> None:
    for args in ((), ("add", "alice"), ("frobnicate",), ("list",)):
        result = users_cli(*args)
        assert result.returncode == 2 and "usage: kafka-quota-proxy users" in result.stderr
