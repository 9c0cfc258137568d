"""A paired benchmark comparison: the tree of a base commit against the working tree.

Each tree runs its own code and its own copy of the benchmark with its own interpreter: the
working tree as it is (uncommitted changes included) with its `.venv`, the base commit as an
extracted copy under `.bench/base-<sha12>/` with a virtualenv of its own (an editable install of
that tree plus what bench/ needs, at the working venv's versions where they fit), reused while
BASE names the same commit. The runs alternate per benchmark (base, new, new, base, base,
new, ...), so a drift of the shared machine's load weighs on both sides alike. Each run's
output goes to `.bench/runs/<start>/`, its figures are read from what the benchmark prints
(bench/harness/figures.py), and each figure gets the medians of both sides, the ratio new/base
of those medians and the spread (min-max) of the per-pair ratios: "within noise" when that
spread contains 1.0.

Usage: python bench/compare.py --base COMMIT [--bench "SCRIPT ARGS; ..."] [--pairs 4] [--out F]
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.figures import Figure, FigureError, figures, script_of, table

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BENCH = (
    "bench/stomp_vs_activemq.py --only pinmq --rounds 3; bench/core_dispatch.py; "
    "bench/end_to_end.py"
)
BENCH_DEPS = ("stomp.py",)  # what bench/ imports beyond the project's own dependencies
TAIL_LINES = 40
STOP_GRACE_S = 30.0  # after SIGTERM, a timed-out benchmark's time to stop what it started


class CompareError(Exception):
    """The comparison cannot go on; the message says why, with the command and its output."""


# ---- the two trees -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tree:
    side: str  # "base" or "new"
    root: Path
    label: str  # commit id, and whether the tree has changes on top of it

    @property
    def python(self) -> Path:
        return self.root / ".venv" / "bin" / "python"


def _run(cmd: list[str], cwd: Path, what: str) -> str:
    """A set-up command's stdout; a CompareError with its output tail when it fails."""
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise CompareError(failure(what, cmd, cwd, p.returncode, p.stdout + p.stderr))
    return p.stdout


def failure(what: str, cmd: list[str], cwd: Path, code: int | str, output: str) -> str:
    tail = "\n".join(output.rstrip().splitlines()[-TAIL_LINES:])
    return (
        f"{what} failed ({code})\n  command: cd {cwd} && {shlex.join(cmd)}\n"
        f"  last {TAIL_LINES} lines of its output:\n{tail}"
    )


def new_tree() -> Tree:
    """The working tree as it is, with its own venv."""
    head = _run(["git", "rev-parse", "--short=12", "HEAD"], ROOT, "git rev-parse").strip()
    dirty = _run(["git", "status", "--porcelain"], ROOT, "git status").strip()
    return Tree("new", ROOT, head + (" + uncommitted changes" if dirty else ""))


def base_tree(ref: str, workdir: Path, new: Tree) -> Tree:
    """BASE's tree and venv under `workdir`, built unless a finished one is there."""
    cmd = ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise CompareError(f"BASE {ref!r} is not a commit of {ROOT}")
    sha = p.stdout.strip()
    tree = Tree("base", workdir / f"base-{sha[:12]}", sha[:12])
    stamp = tree.root / ".venv" / ".installed"
    if stamp.exists():
        print(f"base tree: reusing {tree.root}", flush=True)
        return tree
    if not tree.root.exists():
        partial = workdir / f".base-{sha[:12]}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        archive = subprocess.Popen(["git", "archive", sha], cwd=ROOT, stdout=subprocess.PIPE)
        untar = subprocess.run(["tar", "-x", "-C", str(partial)], stdin=archive.stdout)
        if archive.wait() != 0 or untar.returncode != 0:
            raise CompareError(f"git archive {sha} | tar -x -C {partial} failed")
        partial.rename(tree.root)
    print(f"base tree: building the venv of {tree.root} (pip, its cache)", flush=True)
    shutil.rmtree(tree.root / ".venv", ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(tree.root / ".venv")], tree.root, "python -m venv")
    # The working venv's versions, so that the comparison measures the code and not a newer
    # grpcio: pip's constraints take `name==version` lines only.
    freeze = _run([str(new.python), "-m", "pip", "freeze"], ROOT, "pip freeze")
    pins = [line for line in freeze.splitlines() if re.fullmatch(r"[A-Za-z0-9._-]+==\S+", line)]
    constraints = tree.root / ".venv" / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    install = [str(tree.python), "-m", "pip", "install", "-q", "-e", str(tree.root), *BENCH_DEPS]
    p = subprocess.run([*install, "-c", str(constraints)], capture_output=True, text=True)
    if p.returncode != 0:
        print(
            "base tree: its dependencies do not fit the working venv's versions; installing "
            f"its own. pip said:\n{p.stdout + p.stderr}",
            flush=True,
        )
        _run(install, tree.root, "pip install of the base tree")
    stamp.touch()
    return tree


def check_imports(tree: Tree) -> None:
    """The tree's venv imports the tree's own code (run from elsewhere, so not via cwd)."""
    cmd = [str(tree.python), "-c", "import broker, pinmq; print(broker.__file__)"]
    if not tree.python.exists():
        raise CompareError(f"{tree.side} tree {tree.root} has no {tree.python}")
    where = Path(_run(cmd, Path("/"), f"{tree.side} tree's import check").strip()).resolve()
    if not where.is_relative_to(tree.root):
        raise CompareError(f"{tree.python} imports {where}, not the code of {tree.root}")


# ---- the runs ------------------------------------------------------------------------------


def schedule(pairs: int, benches: list[str]) -> list[tuple[int, str, str]]:
    """(pair, side, bench) in run order: base first in even pairs, new first in odd (ABBA)."""
    out = []
    for i in range(pairs):
        order = ("base", "new") if i % 2 == 0 else ("new", "base")
        out += [(i, side, bench) for bench in benches for side in order]
    return out


def run_bench(tree: Tree, bench: str, timeout: float, log: Path) -> str:
    """One run of one benchmark in its tree; its output, or a CompareError with the tail."""
    cmd = [str(tree.python), *shlex.split(bench)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["VIRTUAL_ENV"] = str(tree.root / ".venv")
    env["PATH"] = f"{tree.python.parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.Popen(
        cmd, cwd=tree.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        code: int | str = proc.returncode
    except subprocess.TimeoutExpired:
        output, code = _stop(proc), f"timed out after {timeout:.0f} s"
    except BaseException:  # interrupted: the benchmark stops too
        _stop(proc)
        raise
    log.write_text(output)
    if code != 0:
        raise CompareError(failure(f"{tree.side} run", cmd, tree.root, code, output))
    return output


def _stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, on which the benchmarks stop what they started; SIGKILL after a grace period."""
    proc.terminate()
    try:
        return proc.communicate(timeout=STOP_GRACE_S)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[0]


def compare(args: argparse.Namespace) -> str:
    """Run every pair and return the report."""
    benches = list(dict.fromkeys(b.strip() for b in args.bench.split(";") if b.strip()))
    if not benches:
        raise CompareError("BENCH names no benchmark")
    for b in benches:
        script_of(b)
    workdir = Path(args.workdir).resolve()
    new = new_tree()
    trees = {"new": new, "base": base_tree(args.base, workdir, new)}
    for tree in trees.values():
        check_imports(tree)
    logs = workdir / "runs" / time.strftime("%Y%m%d-%H%M%S")
    logs.mkdir(parents=True, exist_ok=True)
    print(f"run outputs: {logs}", flush=True)
    results: dict[str, dict[str, list[list[Figure]]]] = {
        b: {"base": [], "new": []} for b in benches
    }
    load0, t0 = os.getloadavg()[0], time.monotonic()
    plan = schedule(args.pairs, benches)
    for k, (pair, side, bench) in enumerate(plan, 1):
        print(
            f"[{k}/{len(plan)}] pair {pair + 1}/{args.pairs} {side:<4} {bench} ...",
            end=" ",
            flush=True,
        )
        started = time.monotonic()
        log = logs / f"{k:02d}-{side}-{Path(shlex.split(bench)[0]).stem}.txt"
        output = run_bench(trees[side], bench, args.timeout, log)
        try:
            results[bench][side].append(figures(bench, output))
        except FigureError as err:
            raise CompareError(f"{err}\n  its output: {log}") from err
        now = time.monotonic()
        print(f"{now - started:.0f} s (elapsed {(now - t0) / 60:.1f} min)", flush=True)
    load1 = os.getloadavg()[0]
    head = [
        f"## bench-compare: base {trees['base'].label} against new {new.label}",
        "",
        f"{args.pairs} pair(s), run base, new, new, base, ...; {time.strftime('%Y-%m-%d %H:%M')}; "
        f"{os.cpu_count()} CPUs, load average (1 min) {load0:.2f} before, {load1:.2f} after. "
        "↑ higher is better, ↓ lower; new/base is the ratio of the medians, the spread that of "
        "the per-pair ratios. Noise alone puts every pair of a figure on one side of 1.0 "
        f"(better or worse) with a chance of {2 / 2**args.pairs:.0%}.",
    ]
    return "\n\n".join(
        ["\n".join(head), *(table(b, r["base"], r["new"]) for b, r in results.items())]
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="With the default BENCH one pair took about 8 minutes on a shared 2-core machine "
        "(a side: the STOMP benchmark 3.3 min, core_dispatch 30 s, end_to_end 20 s), so the "
        "default 4 pairs about half an hour, plus a minute or so to build a new base venv. "
        "The STOMP benchmark's --rounds 3 is that of the paired measurement in issue 26.",
    )
    p.add_argument("--base", required=True, help="the commit to compare against (any git ref)")
    p.add_argument(
        "--bench",
        default=DEFAULT_BENCH,
        help="';'-separated benchmark commands, relative to a tree (default: %(default)s)",
    )
    p.add_argument("--pairs", type=int, default=4, help="runs per side (default: %(default)s)")
    p.add_argument(
        "--timeout", type=float, default=1200.0, help="seconds per run (default: %(default)s)"
    )
    p.add_argument("--out", type=Path, help="also write the report to this file")
    p.add_argument(
        "--workdir",
        default=str(ROOT / ".bench"),
        help="where the base trees and run outputs go (default: %(default)s)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.pairs < 1:
        parser().error("--pairs must be at least 1")
    try:
        report = compare(args)
    except (CompareError, FigureError) as err:
        print(f"\nbench-compare: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nbench-compare: interrupted", file=sys.stderr)
        return 130
    print(f"\n{report}")
    if args.out:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
