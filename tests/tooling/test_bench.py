"""The benchmark scripts run end to end on small sizes, and their shared checks catch faults.

The benchmarks are not timed here; what is checked is that they still start their nodes,
carry the load and verify it (bench/harness), so a change elsewhere cannot leave them broken.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

BENCH = REPO / "bench"
sys.path.append(str(BENCH))  # after the standard library: bench/profile.py is a script

from harness.stats import order_and_owners, order_checks, pct  # noqa: E402


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_order_checks_count_reordering_and_shared_groups() -> None:
    deliveries = {
        "c1": [("a", "a", 1), ("a", "a", 3), ("a", "a", 2), ("b", "b", 1)],
        "c2": [("b", "b", 2), ("", "", 1), ("", "", 1)],  # ungrouped: no owner
    }
    disorder, owners = order_and_owners(deliveries.items())
    assert disorder == 2  # a:2 after a:3 at c1, and the repeated ungrouped seq at c2
    assert owners == {"a": {"c1"}, "b": {"c1", "c2"}}
    checks = order_checks(deliveries.items())
    assert checks["per-group order"][0] is False
    assert checks["one consumer per group"] == (False, "1 groups at >1 consumer")


def test_pct_takes_the_nearest_rank_below() -> None:
    values = list(range(1, 101))
    assert (pct(values, 0.5), pct(values, 0.99), pct(values, 1.0)) == (51, 100, 100)


def test_end_to_end_runs_and_verifies() -> None:
    out = _run(
        "end_to_end.py", "--messages", "900", "--groups", "30", "--modes", "persistent",
        "--scrape-every", "0.05",
    )  # fmt: skip
    assert out.count("exactly-once            PASS  (sent 900, delivered 900") == 2
    assert "one consumer per group  PASS" in out
    assert "== /metrics scraped every 0.05 s against not scraped, medians ==" in out
    assert "     30 persistent" in out.split("against not scraped")[1]
    assert "all checks PASS" in out


def test_metrics_scrape_bench_runs() -> None:
    out = _run("metrics.py", "--groups", "2000", "--scrapes", "2")
    table = out.split("x base: to 10")[1].splitlines()[2:]
    rows = [line.split() for line in table if line.strip()]
    assert [r[0] for r in rows] == ["10", "2,000"] and rows[0][4] == rows[0][6] == "1.00"


@pytest.mark.slow
def test_cluster_throughput_runs_and_verifies() -> None:
    out = _run(
        "cluster_throughput.py", "--messages", "900", "--groups", "30", "--variants", "on-demand"
    )
    assert "send path: grouped messages sent through node1 (LOCAL) and node2 (REMOTE)" in out
    assert "forwarded               " in out
    assert out.count("exactly-once            PASS") == 2  # standalone and the cluster
    assert "all checks PASS" in out


@pytest.mark.slow
def test_ha_catchup_runs_and_verifies() -> None:
    out = _run("ha.py", "--catchup", "--pending", "800", "--baseline", "1")
    assert "snapshots begun: " in out
    assert "orders holds 800 of 800: PASS" in out


def test_profile_samples_the_node_and_says_where_its_time_goes(tmp_path: Path) -> None:
    out = _run(
        "profile.py", "--only", "grpc", "--messages", "20000", "--rate", "500",
        "--out", str(tmp_path),
    )  # fmt: skip
    top = (tmp_path / "grpc" / "top.txt").read_text()
    assert top in out
    shares = {
        line[:46].strip(): float(line[46:53].strip().rstrip("%"))
        for line in top.splitlines()[2 : top.splitlines().index("")]
    }
    assert 99.0 <= sum(shares.values()) <= 101.0  # every sample in one part
    assert shares["dispatch and groups (delivery, acks)"] > 0
    assert shares["store writes (sends, acks, delivery counts)"] > 0
    assert "top 25 functions by own time (running threads):" in top
    assert "top 25 functions by own time holding the GIL (Python's own work):" in top
    [flame] = (tmp_path / "grpc").glob("node1-*.svg")
    assert "<svg" in flame.read_text()[:2000]


def test_bench_profile_py_hides_no_standard_module() -> None:
    """A script in bench/ has bench/ first on its path, where profile.py would hide the
    standard library's `profile`, which cProfile (and so PySpark) imports."""
    check = "import cProfile, pstats; cProfile.run('sum(range(10))', sort='calls')"
    done = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(BENCH)!r}); {check}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "function calls" in done.stdout


def test_restore_opens_a_store_by_its_index_and_whole_with_the_same_messages() -> None:
    out = _run("restore.py", "--messages", "3000", "--groups", "7", "--rounds", "1")
    assert "round 1: by index" in out and "kept index" in out
    assert "every message restored every way (depths [3000]): PASS" in out
