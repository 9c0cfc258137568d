"""The client contracts in pyproject.toml name every server-side broker module.

import-linter's `forbidden` contracts list modules by name, so a new server module in
`broker/` is allowed to the Python client until someone adds it. This test makes the omission
fail: each module of `broker/` is either one of the leaves the client shares with the node,
or forbidden to the client and to those leaves.
"""

from __future__ import annotations

import tomllib

from conftest import REPO

ROOT = REPO


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {c["name"]: c for c in config["tool"]["importlinter"]["contracts"]}


def _broker_modules() -> set[str]:
    return {
        f"broker.{path.stem}" for path in (ROOT / "broker").glob("*.py") if path.stem != "__init__"
    }


def test_every_server_side_broker_module_is_forbidden_to_the_client() -> None:
    contracts = _contracts()
    client = contracts["The Python client imports nothing of the server side"]
    leaves = contracts[
        "The leaves the client shares with the node import nothing of pinmq but logging"
    ]
    shared = set(leaves["source_modules"])
    server_side = _broker_modules() - shared
    assert shared <= _broker_modules(), "a shared leaf that does not exist"
    assert server_side - set(client["forbidden_modules"]) == set()
    assert server_side - set(leaves["forbidden_modules"]) == set()
    assert "broker.client" in leaves["forbidden_modules"]
