"""The credentials file: reading, validating and writing the file a CredentialStore is kept in.

File format, version 1 (YAML; a file whose name ends in .json is read and written as JSON):

    version: 1
    users:
    - name: alice
      credentials:
        SCRAM-SHA-256: {salt: <base64>, iterations: 8192, stored_key: <base64>, server_key: <base64>}
        SCRAM-SHA-512: {salt: <base64>, iterations: 8192, stored_key: <base64>, server_key: <base64>}
        PLAIN: {algorithm: PBKDF2-HMAC-SHA512, salt: <base64>, iterations: 210000, hash: <base64>}

Users are a list rather than a mapping because YAML silently keeps the last of two equal keys,
and a duplicated user should be an error, not a coin toss. Reading validates everything, so a
reload either gets a whole valid store or a ConfigError naming the file and the bad entry; the
error never quotes a salt, key or hash.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kafka_quota_proxy.config.atomic_file import write_atomically
from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.loading import MISSING, load_document
from kafka_quota_proxy.identity.credentials import (
    MECHANISMS,
    PLAIN,
    PLAIN_ALGORITHM,
    PLAIN_HASH_LENGTH,
    PLAIN_MAX_ITERATIONS,
    PLAIN_MIN_ITERATIONS,
    PLAIN_SALT_LENGTH,
    SCRAM_KEY_LENGTHS,
    SCRAM_MAX_ITERATIONS,
    SCRAM_MECHANISMS,
    SCRAM_MIN_ITERATIONS,
    SCRAM_MIN_SALT,
    CredentialError,
    CredentialStore,
    PlainVerifier,
    ScramCredential,
    UserCredentials,
    check_user_name,
)

CREDENTIALS_KEY = "credentials"
FILE_VERSION = 1


def read_users(target: Path, *, missing_ok: bool = False) -> dict[str, UserCredentials]:
    """Read and validate a credentials file; raise ConfigError naming the file and entry.

    With `missing_ok`, a file that does not exist holds no users.
    """
    document = load_document(target, CREDENTIALS_KEY, what="credentials file", as_json=_is_json(target),
                             missing_ok=True)
    if document is MISSING:
        if missing_ok:
            return {}
        raise ConfigError(CREDENTIALS_KEY, "the credentials file does not exist", str(target))
    try:
        return _decode(document)
    except _Invalid as e:
        raise ConfigError(CREDENTIALS_KEY, str(e), str(target)) from None


def write_users(target: Path, users: Mapping[str, UserCredentials]) -> None:
    """Write `users` to `target` atomically, mode 0600; ConfigError if it cannot be written."""
    document = _encode(users)
    if _is_json(target):
        text = json.dumps(document, indent=2) + "\n"
    else:
        text = ("# kafka-quota-proxy users: salted credentials only. "
                "Manage with `kafka-quota-proxy users`.\n"
                + yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=1000))
    try:
        write_atomically(target, text, mode=0o600)
    except OSError as e:
        raise ConfigError(CREDENTIALS_KEY, f"cannot write the credentials file: {e.strerror or e}",
                          str(target)) from None


def _encode(users: Mapping[str, UserCredentials]) -> dict[str, Any]:
    out = []
    for name in sorted(users):
        entry = users[name]
        credentials: dict[str, Any] = {}
        for mechanism in SCRAM_MECHANISMS:
            scram = entry.scram.get(mechanism)
            if scram is not None:
                credentials[mechanism] = {
                    "salt": _b64(scram.salt), "iterations": scram.iterations,
                    "stored_key": _b64(scram.stored_key), "server_key": _b64(scram.server_key)}
        if entry.plain is not None:
            credentials[PLAIN] = {"algorithm": PLAIN_ALGORITHM, "salt": _b64(entry.plain.salt),
                                  "iterations": entry.plain.iterations, "hash": _b64(entry.plain.hash)}
        out.append({"name": name, "credentials": credentials})
    return {"version": FILE_VERSION, "users": out}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _is_json(path: Path) -> bool:
    return path.suffix.lower() == ".json"


# ---- decoding ----


class _Invalid(Exception):
    pass


def _decode(document: Any) -> dict[str, UserCredentials]:
    if not isinstance(document, dict):
        raise _Invalid("expected a mapping with 'version' and 'users' at the top")
    unknown = set(document) - {"version", "users"}
    if unknown:
        raise _Invalid(f"unknown top-level keys {sorted(map(str, unknown))}")
    if document.get("version") != FILE_VERSION:
        raise _Invalid(f"unsupported version {document.get('version')!r}, expected {FILE_VERSION}")
    entries = document.get("users")
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise _Invalid("'users' must be a list")
    users: dict[str, UserCredentials] = {}
    for index, item in enumerate(entries):
        where = f"users[{index}]"
        if not isinstance(item, dict):
            raise _Invalid(f"{where} must be a mapping with 'name' and 'credentials'")
        name = item.get("name")
        if isinstance(name, str) and name:
            where = f"{where} ({name!r})"
        unknown = set(item) - {"name", "credentials"}
        if unknown:
            raise _Invalid(f"{where}: unknown keys {sorted(map(str, unknown))}")
        credentials = item.get("credentials")
        if not isinstance(credentials, dict) or not credentials:
            raise _Invalid(f"{where}: 'credentials' must map at least one SASL mechanism to its entry")
        entry = _decode_user(credentials, where)
        if not isinstance(name, str):
            # YAML reads `name: 123` or `name: yes` as a number or a boolean.
            raise _Invalid(f"{where}: 'name' must be a string (quote it)")
        try:
            check_user_name(name, uses_scram=bool(entry.scram))
        except CredentialError as e:
            raise _Invalid(f"{where}: {e.message}") from None
        if name in users:
            raise _Invalid(f"{where}: user {name!r} appears twice")
        users[name] = entry
    return users


def _decode_user(credentials: dict[Any, Any], where: str) -> UserCredentials:
    scram: dict[str, ScramCredential] = {}
    plain = None
    for mechanism, raw in credentials.items():
        at = f"{where}: {mechanism}"
        if mechanism in SCRAM_MECHANISMS:
            fields = _fields(raw, at, ("salt", "iterations", "stored_key", "server_key"))
            key_length = SCRAM_KEY_LENGTHS[mechanism]
            scram[mechanism] = ScramCredential(
                salt=_binary(fields["salt"], f"{at}.salt", minimum=SCRAM_MIN_SALT),
                stored_key=_binary(fields["stored_key"], f"{at}.stored_key", exact=key_length),
                server_key=_binary(fields["server_key"], f"{at}.server_key", exact=key_length),
                iterations=_count(fields["iterations"], f"{at}.iterations",
                                  SCRAM_MIN_ITERATIONS, SCRAM_MAX_ITERATIONS))
        elif mechanism == PLAIN:
            fields = _fields(raw, at, ("algorithm", "salt", "iterations", "hash"))
            if fields["algorithm"] != PLAIN_ALGORITHM:
                raise _Invalid(f"{at}.algorithm must be {PLAIN_ALGORITHM}")
            plain = PlainVerifier(
                salt=_binary(fields["salt"], f"{at}.salt", minimum=PLAIN_SALT_LENGTH),
                iterations=_count(fields["iterations"], f"{at}.iterations",
                                  PLAIN_MIN_ITERATIONS, PLAIN_MAX_ITERATIONS),
                hash=_binary(fields["hash"], f"{at}.hash", exact=PLAIN_HASH_LENGTH))
        else:
            raise _Invalid(f"{where}: unknown SASL mechanism {str(mechanism)[:40]!r}; "
                           f"supported: {', '.join(MECHANISMS)}")
    return UserCredentials(scram, plain)


def _fields(raw: Any, at: str, names: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _Invalid(f"{at} must be a mapping with {', '.join(names)}")
    missing = [n for n in names if n not in raw]
    if missing:
        raise _Invalid(f"{at} is missing {', '.join(missing)}")
    unknown = set(raw) - set(names)
    if unknown:
        raise _Invalid(f"{at} has unknown keys {sorted(map(str, unknown))}")
    return raw


def _binary(value: Any, at: str, *, minimum: int = 1, exact: int | None = None) -> bytes:
    # The messages describe the expected shape and never repeat the value: it is secret material.
    if not isinstance(value, str):
        raise _Invalid(f"{at} must be a base64 string")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _Invalid(f"{at} is not valid base64") from None
    if exact is not None and len(data) != exact:
        raise _Invalid(f"{at} must be {exact} bytes, got {len(data)}")
    if len(data) < minimum:
        raise _Invalid(f"{at} must be at least {minimum} bytes, got {len(data)}")
    return data


def _count(value: Any, at: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _Invalid(f"{at} must be an integer from {low} to {high}")
    return value


def load_credentials(path: str | os.PathLike[str], *, missing_ok: bool = False) -> CredentialStore:
    """Read and validate a credentials file; raise ConfigError naming the file and entry.

    With `missing_ok`, a file that does not exist is an empty store (for `users add`).
    """
    return CredentialStore(read_users(Path(path), missing_ok=missing_ok))


def save_credentials(store: CredentialStore, path: str | os.PathLike[str]) -> None:
    """Write the store to `path` atomically, readable by its owner only (mode 0600).

    Temp file in the same directory, fsync, rename over the old file, fsync the directory:
    a proxy reloading the file sees the old store or the new one, never half of one.
    """
    write_users(Path(path), store.entries())
