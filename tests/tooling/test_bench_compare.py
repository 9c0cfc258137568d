"""bench/compare.py: the figures it reads (bench/harness/figures.py), its order, its table.

The extractors read outputs captured from real runs of the benchmarks at 200d2dd (the format
the base trees of issue 26 print; tests/data/bench_outputs/), and one test runs the script for
real: a base venv built from HEAD, a tiny core_dispatch on both sides.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO

ROOT = REPO
OUTPUTS = Path(__file__).resolve().parent / "data" / "bench_outputs"
sys.path.append(str(ROOT / "bench"))  # after the standard library (bench/profile.py)

import compare  # noqa: E402
from compare import schedule  # noqa: E402
from harness.figures import Figure, FigureError, figures, script_of, summarize, table  # noqa: E402

TINY = "bench/core_dispatch.py --quick --messages 2000 --repeats 1"


def _read(name: str) -> str:
    return (OUTPUTS / name).read_text()


def _by_name(figs: list[Figure]) -> dict[str, Figure]:
    return {f.name: f for f in figs}


# ---- extractors ----------------------------------------------------------------------------


def test_stomp_figures_are_pinmqs_medians_over_its_rounds_not_the_sinks() -> None:
    figs = _by_name(
        figures("bench/stomp_vs_activemq.py --only pinmq", _read("stomp_vs_activemq.txt"))
    )
    scenarios = ["100 groups backlog", "100 groups concurrent", "1 group backlog"]
    scenarios.append("1 group concurrent")
    expected = {f"{s}: {k}" for s in scenarios for k in ("consume msg/s", "broker CPU µs/msg")}
    assert set(figs) == expected
    # rounds 1 and 2 of pinmq: 9,429 and 9,877 msg/s, 80 and 75 us/msg (the sink: 12,378)
    assert figs["100 groups backlog: consume msg/s"].value == 9653
    assert figs["100 groups backlog: broker CPU µs/msg"].value == 77.5
    assert figs["1 group concurrent: consume msg/s"].value == (7507 + 8201) / 2
    assert figs["100 groups backlog: consume msg/s"].higher_is_better
    assert not figs["100 groups backlog: broker CPU µs/msg"].higher_is_better


def test_core_dispatch_figures_per_group_count() -> None:
    figs = _by_name(figures("bench/core_dispatch.py --quick", _read("core_dispatch.txt")))
    assert len(figs) == 9
    assert figs["10 groups: mean µs"].value == 5.71
    assert figs["1,000 groups: p50 µs"].value == 5.72
    assert figs["10,000 groups: msg/s"] == Figure("10,000 groups: msg/s", 152_734, True)
    assert not figs["10 groups: mean µs"].higher_is_better


def test_end_to_end_figures_from_its_summary() -> None:
    figs = _by_name(figures("bench/end_to_end.py --quick", _read("end_to_end.txt")))
    assert len(figs) == 4 * 5
    assert figs["100 groups persistent: e2e msg/s"].value == 17_003
    assert figs["100 groups persistent: send msg/s"].value == 31_417
    assert figs["1000 groups non-persistent: p99 ms"].value == 137.7
    assert figs["1000 groups non-persistent: node CPU s"] == Figure(
        "1000 groups non-persistent: node CPU s", 0.12, False
    )
    assert figs["100 groups non-persistent: p50 ms"].value == 105.5


def test_cluster_throughput_figures_per_run_and_the_ratios_to_one_node() -> None:
    # Captured at 05f85d1; the summary's format is the same since 200d2dd.
    output = _read("cluster_throughput.txt")
    figs = _by_name(figures("bench/cluster_throughput.py --quick", output))
    runs = ("standalone", "cluster on-demand", "cluster off")
    kinds = ("e2e msg/s", "send msg/s", "p50 ms", "p99 ms", "node CPU µs/msg")
    ratios = ("e2e", "node CPU per message")
    expected = {f"{r}: {k}" for r in runs for k in kinds}
    expected |= {f"{r} / standalone: {k}" for r in runs[1:] for k in ratios}
    assert set(figs) == expected
    e2e = figs["cluster on-demand: e2e msg/s"]
    assert (e2e.value, e2e.higher_is_better) == (21_760, True)
    assert figs["cluster off: p99 ms"].value == 188.6
    assert figs["standalone: node CPU µs/msg"] == Figure("standalone: node CPU µs/msg", 25, False)
    assert figs["cluster on-demand / standalone: e2e"].value == 0.77
    ratio = figs["cluster on-demand / standalone: node CPU per message"]
    assert (ratio.value, ratio.higher_is_better) == (2.27, False)
    with pytest.raises(FigureError, match="failed its checks"):
        failed = output.replace("57 us   67%  PASS", "57 us   67%  FAIL")
        figures("bench/cluster_throughput.py", failed)


def test_output_an_extractor_cannot_read_is_an_error_naming_the_script() -> None:
    with pytest.raises(FigureError, match=r"end_to_end\.py"):
        figures("bench/end_to_end.py", _read("core_dispatch.txt"))
    with pytest.raises(FigureError, match=r"core_dispatch\.py.*no line"):
        figures("bench/core_dispatch.py", "Traceback (most recent call last):\n")


def test_a_row_that_failed_its_checks_is_no_figure() -> None:
    failed = _read("end_to_end.txt").replace("0.12s  PASS", "0.12s  FAIL")
    with pytest.raises(FigureError, match="failed its checks"):
        figures("bench/end_to_end.py", failed)


def test_an_unknown_benchmark_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    with pytest.raises(FigureError, match=r"unknown benchmark 'bench/paging\.py'"):
        script_of("bench/paging.py")
    code = compare.main(
        ["--base", "HEAD", "--bench", "bench/paging.py", "--workdir", str(tmp_path)]
    )
    assert code == 1
    assert list(tmp_path.iterdir()) == []


# ---- order, medians, ratios ----------------------------------------------------------------


def test_pairs_alternate_base_new_new_base_for_each_benchmark() -> None:
    assert [side for _, side, _ in schedule(4, ["a"])] == [
        *("base", "new", "new", "base"),
        *("base", "new", "new", "base"),
    ]
    assert schedule(2, ["a", "b"]) == [
        (0, "base", "a"),
        (0, "new", "a"),
        (0, "base", "b"),
        (0, "new", "b"),
        (1, "new", "a"),
        (1, "base", "a"),
        (1, "new", "b"),
        (1, "base", "b"),
    ]


def test_ratio_of_medians_and_the_spread_of_per_pair_ratios() -> None:
    row = summarize(True, [10.0, 12.0, 11.0, 13.0], [11.0, 12.0, 13.0, 13.0])
    assert (row.base, row.new) == (11.5, 12.5)  # even count: the mean of the middle two
    assert row.ratio == pytest.approx(12.5 / 11.5)
    assert (row.low, row.high) == (1.0, pytest.approx(13 / 11))
    assert row.verdict == "within noise"  # one pair saw no change


@pytest.mark.parametrize(
    ("higher_is_better", "new", "verdict"),
    [
        (True, [11.0, 12.0], "better"),
        (True, [9.0, 9.5], "worse"),
        (False, [11.0, 12.0], "worse"),
        (False, [9.0, 9.5], "better"),
        (False, [9.0, 10.5], "within noise"),
    ],
)
def test_better_or_worse_only_when_every_pair_agrees(
    higher_is_better: bool, new: list[float], verdict: str
) -> None:
    assert summarize(higher_is_better, [10.0, 10.0], new).verdict == verdict


def test_one_pair_or_a_zero_base_makes_no_judgement() -> None:
    assert summarize(True, [10.0], [20.0]).verdict == "one pair: no spread"
    row = summarize(False, [0.0, 0.0], [0.1, 0.2])
    assert row.verdict == "n/a (base is 0)"


def test_table_has_a_row_per_figure_in_every_run() -> None:
    def run(a: float, b: float | None = None) -> list[Figure]:
        extra = [] if b is None else [Figure("b", b, True)]
        return [Figure("a msg/s", a, True), *extra]

    text = table("bench/x.py --quick", [run(100, 1), run(110, 1)], [run(121), run(132, 2)])
    assert "### `bench/x.py --quick`" in text
    # medians 105 / 126.5; per-pair ratios 1.21 and 1.20
    assert "| a msg/s ↑ | 105 | 126 | 1.20 | 1.20-1.21 | better |" in text
    assert "Not in every run, left out: b." in text


# ---- the script for real -------------------------------------------------------------------


def _compare(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(ROOT / "bench" / "compare.py"), "--workdir", str(workdir), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for tree in tmp_path.glob("base-*"):
        shutil.rmtree(tree)  # a venv of about 100 MB, and pytest keeps the last runs' tmp_path


@pytest.mark.slow
def test_compare_builds_the_base_tree_runs_pairs_and_prints_the_table(workdir: Path) -> None:
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    out = workdir / "table.md"
    done = _compare(workdir, "--base", "HEAD", "--bench", TINY, "--pairs", "1", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    base = workdir / f"base-{head}"
    assert (base / ".venv" / ".installed").exists()
    assert (base / "bench" / "core_dispatch.py").exists()  # its own copy of the benchmark
    report = out.read_text()
    assert report.strip() in done.stdout
    assert report.startswith(f"## bench-compare: base {head} against new {head}")
    for figure in ("mean µs ↓", "p50 µs ↓", "msg/s ↑"):
        for groups in ("10", "1,000", "10,000"):
            assert re.search(rf"\| {groups} groups: {figure} \| [\d.,]+ \| [\d.,]+ \|", report)
    assert "one pair: no spread" in report

    # Again, the tree and venv reused; two pairs, in ABBA order; then a run that fails.
    done = _compare(workdir, "--base", "HEAD", "--bench", TINY, "--pairs", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"reusing {base}" in done.stdout
    sides = re.findall(r"^\[\d/4\] pair \d/2 (base|new)", done.stdout, re.M)
    assert sides == ["base", "new", "new", "base"]
    bad = "bench/core_dispatch.py --repeats many"
    done = _compare(workdir, "--base", "HEAD", "--bench", bad, "--pairs", "1")
    assert done.returncode == 1
    assert "base run failed (2)" in done.stderr
    assert f"cd {base} && {base}/.venv/bin/python bench/core_dispatch.py" in done.stderr
    assert "invalid int value: 'many'" in done.stderr
    done = _compare(
        workdir, "--base", "HEAD", "--bench", "bench/core_dispatch.py", "--timeout", "1"
    )
    assert done.returncode == 1
    assert "base run failed (timed out after 1 s)" in done.stderr
