"""Typed configs from plain dicts (YAML), with one-line errors that name the file and key.

Every component keeps its own small dataclass `Config` next to the code that uses it (the
torchtitan habit); this module only turns untrusted dicts into those dataclasses. pydantic does
the type checking and range checks (declared with `Annotated[..., Field(...)]` on the fields);
we only shape its error into `file: key.path: what was expected`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

__all__ = [
    "PLAIN_NAME",
    "STRICT",
    "ConfigError",
    "InputWarning",
    "Positive",
    "PositiveInt",
    "is_plain_name",
    "load_yaml",
    "parse",
    "to_dict",
]

T = TypeVar("T")

#: Attach to every config dataclass: unknown keys are errors, not silently ignored, and a
#: number must be finite (an infinite horizon or LR passed every bound, then failed mid-run).
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)
#: The constrained numbers every config section uses.
Positive = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]


class ConfigError(ValueError):
    """A bad input. `str(err)` is the one line shown to the user (CLI exit code 2)."""


class InputWarning(UserWarning):
    """An input that works but is likely not what the user meant; the CLI shows `str()` as one
    line (`warning: ...`)."""


def parse(cls: type[T], data: Any, source: str, prefix: str = "") -> T:
    """Validate `data` into dataclass `cls`. `source` (a file name) and `prefix` (the section's
    key path, e.g. "task") locate every error: `source: prefix.key: message`."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        where = f"{source}: {prefix}" if prefix else source
        raise ConfigError(f"{where}: expected a mapping of keys, got {type(data).__name__}")
    try:
        text = json.dumps(dict(data), default=str)
    except (TypeError, ValueError) as err:  # a key YAML allows and JSON does not: a list
        where = f"{source}: {prefix}" if prefix else source
        raise ConfigError(f"{where}: expected plain keys and values ({err})") from None
    try:
        # As JSON, strictly: a YAML file's types are JSON's, and pydantic's lax Python mode
        # reads `lr: true` as 1.0 and `microbatches: "2"` as 2. Strict JSON still takes an
        # integer for a float and a list for a tuple, as a YAML file writes them.
        return TypeAdapter(cls).validate_json(text, strict=True)
    except ValidationError as err:
        raise ConfigError(_one_line(err, source, prefix)) from None


_UNKNOWN = ("extra_forbidden", "unexpected_keyword_argument")
_MISSING = ("missing", "missing_argument")
_PYDANTIC_TAG = re.compile(r"^(function-|constrained-|literal\[)")


def _one_line(err: ValidationError, source: str, prefix: str) -> str:
    first = err.errors()[0]
    parts = [prefix] if prefix else []
    # Drop pydantic's tags for validators and union members ("constrained-float", "literal[...]").
    parts += [str(p) for p in first["loc"] if not _PYDANTIC_TAG.match(str(p))]
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] in _UNKNOWN:
        message = "unknown key"
    elif first["type"] in _MISSING:
        message = "required key is missing"
    elif first["type"] == "value_error" and re.match(r"^[\w.]+: ", message):
        # A cross-field check from __post_init__ names its own key: "horizon: required ...".
        key, message = message.split(": ", 1)
        parts.append(key)
    elif "input" in first and first["type"] not in ("value_error", "assertion_error"):
        message = f"{message} (got {first['input']!r})"
    key = ".".join(parts)
    where = f"{source}: {key}" if key else source
    extra = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{where}: {message}{extra}"


def is_plain_name(text: str) -> bool:
    """A name that is one folder under its parent: letters, digits, '-', '_' and '.', not
    starting with '.' (so never '..', a hidden folder or a path that leaves --storage)."""
    return bool(text) and not text.startswith(".") and all(c.isalnum() or c in "-_." for c in text)


PLAIN_NAME = "letters, digits, '-', '_' or '.' (not starting with '.')"


def load_yaml(path: str | Path) -> Any:
    """Read a YAML file; a missing or unparsable file is a ConfigError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise ConfigError(f"{where}: {problem}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None


def to_dict(config: Any) -> dict[str, Any]:
    """A config dataclass as plain dicts/lists (for YAML and checkpoints)."""
    return dataclasses.asdict(config)
