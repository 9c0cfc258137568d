"""No hand-written module over 500 lines: a module that long holds more than one thing.

The generated stubs (`pinmq_pb/`) are not written by hand and are left out.
"""

from __future__ import annotations

from conftest import REPO

ROOT = REPO
MAX_LINES = 500
PACKAGES = ("broker", "cluster", "handler", "pinmq", "pipeline", "bench", "tests", "deploy")


def test_every_hand_written_module_is_at_most_500_lines() -> None:
    modules = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    assert len(modules) > 100  # the tree was found
    too_long = {
        str(p.relative_to(ROOT)): n
        for p in modules
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert too_long == {}, f"over {MAX_LINES} lines: split by what they hold"
