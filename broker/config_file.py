"""Reading a node's YAML config file into a `NodeConfig` (`broker/config.py`).

`load_config` / `parse_config` return a frozen `NodeConfig`, or raise `ConfigError` listing
every problem (file, dotted key path, value, expectation) so an operator can fix the file in
one pass.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from broker.config import NodeConfig


class ConfigError(Exception):
    """A config file that cannot be used; `str()` is the user-facing report, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def load_config(path: str | Path, *overlays: str | Path) -> NodeConfig:
    """Read and validate a YAML config file, with `overlays` on top: each later file's keys
    override the earlier ones' (mappings are merged key by key, any other value replaced), so
    a deployment writes only what differs (a backup's id and ha section, say)."""
    paths = [path, *overlays]
    data: dict[str, Any] = {}
    for each in paths:
        data = _merged(data, _mapping(_read(each), str(each)))
    return _validated(data, " + ".join(map(str, paths)))


def parse_config(text: str, source: str) -> NodeConfig:
    """Validate YAML text; `source` names it (usually the file path) in error messages."""
    return _validated(_mapping(text, source), source)


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: config file not found"]) from None
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise ConfigError([f"{path}: cannot read config file: {reason}"]) from None


def _mapping(text: str, source: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError([_yaml_problem(err, source)]) from None
    if not isinstance(data, dict):
        got = "an empty document" if data is None else _show(data)
        raise ConfigError([f"{source}: got {got}, expected a mapping at the top level"])
    return data


def _merged(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        both = isinstance(below, dict) and isinstance(value, dict)
        merged[key] = _merged(below, value) if both else value  # type: ignore[arg-type]
    return merged


def _validated(data: dict[str, Any], source: str) -> NodeConfig:
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError([_problem(source, e) for e in err.errors()]) from None


def _yaml_problem(err: yaml.YAMLError, source: str) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    what = getattr(err, "problem", None) or str(err)
    return f"{where}: invalid YAML: {what}"


_PHRASES = re.compile(r"^(Input should be|Value error,( must be)?|must be)\s+")


def _problem(source: str, error: ErrorDetails) -> str:
    """One line per pydantic error: file, dotted key path (YAML spelling), value, expectation."""
    loc = [str(part) for part in error["loc"]]
    kind = error["type"]
    if kind == "extra_forbidden":
        return _join(source, loc[:-1], f"unknown key {loc[-1]!r}")
    if kind == "missing":
        return _join(source, loc, "missing required key")
    if kind == "pinmq":
        return _join(source, loc, error["msg"])
    if kind == "literal_error":
        expected = "one of " + error.get("ctx", {})["expected"].replace(" or ", ", ")
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        expected = "a mapping"
    else:
        # "Input should be a valid integer, unable to parse ..." -> "a valid integer"
        expected = _PHRASES.sub("", error["msg"]).split(", unable to")[0]
    return _join(source, loc, f"got {_show(error['input'])}, expected {expected}")


def _join(source: str, loc: list[str], text: str) -> str:
    return ": ".join([source, *([".".join(loc)] if loc else []), text])


def _show(value: Any) -> str:
    """A value as the user wrote it in YAML, short enough for one line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
