"""`kafka-quota-proxy users`: manage the terminating proxy's credentials file.

    kafka-quota-proxy users add NAME --file FILE [--password-stdin]
                                [--mechanisms SCRAM-SHA-256,SCRAM-SHA-512,PLAIN]
    kafka-quota-proxy users remove NAME --file FILE
    kafka-quota-proxy users list --file FILE

`add` creates the file if needed and replaces the credentials of an existing user (that is how
a password is changed). The password is read from one line of standard input with
--password-stdin, otherwise asked for twice at the terminal without echo; it is never printed
or logged. Each change rewrites the file atomically, so a running proxy can reload it at any
time. `add` and `remove` hold a lock on `<file>.lock` while they read, change and write the
file, so that two run at once both land (config/file_lock.py). Errors are one line and exit
status 2, raised as ConfigError for proxy.cli to print.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from kafka_quota_proxy.config.credentials_file import load_credentials, save_credentials
from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.file_lock import lock_path, locked
from kafka_quota_proxy.identity.credentials import (
    MECHANISMS,
    CredentialError,
    CredentialStore,
    normalise_mechanisms,
)

PROG = "kafka-quota-proxy users"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Manage the users of the proxy's SASL listener.")
    commands = p.add_subparsers(dest="command", required=True, metavar="{add,remove,list}")

    add = commands.add_parser("add", help="add a user, or change an existing user's password",
                              description="Add a user, or replace an existing user's credentials.")
    add.add_argument("name")
    add.add_argument("--file", required=True, help="the credentials file (YAML; .json for JSON)")
    add.add_argument("--password-stdin", action="store_true",
                     help="read the password from the first line of standard input")
    add.add_argument("--mechanisms", default=",".join(MECHANISMS),
                     help=f"comma-separated SASL mechanisms to enable (default {','.join(MECHANISMS)})")

    remove = commands.add_parser("remove", help="remove a user")
    remove.add_argument("name")
    remove.add_argument("--file", required=True, help="the credentials file")

    listing = commands.add_parser("list", help="list users and their mechanisms (never credentials)")
    listing.add_argument("--file", required=True, help="the credentials file")
    return p


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if args.command == "add":
        return _add(args.name, args.file, args.password_stdin, args.mechanisms)
    if args.command == "remove":
        return _remove(args.name, args.file)
    return _list(args.file)


def _add(name: str, path: str, password_stdin: bool, mechanisms_text: str) -> int:
    try:
        mechanisms = normalise_mechanisms(m for m in mechanisms_text.split(",") if m.strip())
    except CredentialError as e:
        raise ConfigError("--mechanisms", e.message) from None
    load_credentials(path, missing_ok=True)  # a bad file is refused before asking anything
    password = _read_password_stdin() if password_stdin else _prompt_password(name)
    new = CredentialStore()
    try:
        new.add(name, password, mechanisms)  # hashed before taking the lock: it takes a while
    except CredentialError as e:
        raise ConfigError(e.key, e.message) from None
    with _locked(path):
        store = load_credentials(path, missing_ok=True)  # as it is now, other changes included
        is_new = name not in store
        store = CredentialStore({**store.entries(), name: new.entries()[name]})
        save_credentials(store, path)
    verb = "Added" if is_new else "Updated"
    print(f"{verb} user {_show(name)} ({', '.join(mechanisms)}) in {path}")
    return 0


def _remove(name: str, path: str) -> int:
    with _locked(path):
        store = load_credentials(path)
        try:
            store.remove(name)
        except KeyError:
            raise ConfigError("user", f"no user {_show(name)}", path) from None
        save_credentials(store, path)
    print(f"Removed user {_show(name)} from {path}")
    return 0


@contextmanager
def _locked(path: str) -> Iterator[None]:
    with ExitStack() as stack:
        try:
            stack.enter_context(locked(Path(path)))
        except OSError as e:
            raise ConfigError("credentials", f"cannot lock {lock_path(Path(path))}: "
                                             f"{e.strerror or e}", path) from None
        yield


def _list(path: str) -> int:
    store = load_credentials(path)
    for name in store.users():
        print(f"{_show(name)}\t{','.join(store.mechanisms(name))}")
    return 0


def _read_password_stdin() -> str:
    # Bytes, decoded here, so that the locale's encoding cannot garble the password.
    line = sys.stdin.buffer.readline()
    try:
        password = line.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("password", "the password on standard input is not UTF-8") from None
    password = password.removesuffix("\n").removesuffix("\r")
    if not password:
        raise ConfigError("password", "no password on the first line of standard input")
    return password


def _prompt_password(name: str) -> str:
    if not sys.stdin.isatty():
        # getpass would fall back to reading stdin with echo and a warning; refuse instead.
        raise ConfigError("password", "standard input is not a terminal; use --password-stdin")
    first = getpass.getpass(f"Password for {_show(name)}: ")
    second = getpass.getpass("Same password again: ")
    if first != second:
        raise ConfigError("password", "the two passwords differ")
    return first


def _show(name: str) -> str:
    """A user name on one line: quoted if it has spaces, tabs, newlines or other invisibles."""
    if name.isprintable() and " " not in name:
        return name
    return repr(name)
