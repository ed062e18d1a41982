"""Reading a YAML or JSON file into a document: the one place a config, quota, state or
credentials file is opened and parsed, so every one fails the same way, naming the file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from kafka_quota_proxy.config.errors import ConfigError

MISSING: Any = object()  # load_document's answer for a file that does not exist, when asked


def load_document(path: str | os.PathLike[str], key: str, *, what: str = "", as_json: bool = False,
                  missing_ok: bool = False) -> Any:
    """The parsed document in `path`; MISSING for a file that does not exist, when `missing_ok`.

    Failures raise ConfigError(key, message, path): "cannot read[ the <what>]: <reason>", or "not
    valid YAML|JSON at line L, column C: <problem>". The message never quotes the file's text,
    which can hold secrets (a credentials file's keys).
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as e:
        if missing_ok:
            return MISSING
        raise ConfigError(key, _cannot_read(what, e.strerror or str(e)), source) from None
    except (OSError, UnicodeDecodeError) as e:
        reason = (e.strerror or str(e)) if isinstance(e, OSError) else "not UTF-8 text"
        raise ConfigError(key, _cannot_read(what, reason), source) from None
    if as_json:
        try:
            return json.loads(text, parse_constant=_reject_constant)
        except json.JSONDecodeError as e:
            raise ConfigError(key, f"not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}",
                              source) from None
        except ValueError as e:  # NaN or Infinity, which JSON does not have
            raise ConfigError(key, f"not valid JSON: {e}", source) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or "cannot be parsed"
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(key, f"not valid YAML{where}: {problem}", source) from None


def _cannot_read(what: str, reason: str) -> str:
    return f"cannot read the {what}: {reason}" if what else f"cannot read: {reason}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")
