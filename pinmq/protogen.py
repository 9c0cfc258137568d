"""Regenerates the checked-in gRPC stubs in `pinmq_pb/` from `proto/*.proto`.

The protos are mapped onto the virtual path `pinmq_pb`, so the generated modules import each
other package-qualified (`from pinmq_pb import client_pb2`) and never as a top-level `proto`.
Run `python -m pinmq.protogen` (or `make proto`); `tests/tooling/test_proto_stubs.py` checks
that the checked-in stubs match a fresh generation.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PB_PACKAGE = "pinmq_pb"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _protoc(out_dir: Path) -> None:
    from grpc_tools import protoc  # development dependency only

    well_known = resources.files("grpc_tools") / "_proto"
    protos = sorted(str(p.relative_to(ROOT)) for p in PROTO_DIR.glob("*.proto"))
    args = [
        "protoc",
        f"--proto_path={PB_PACKAGE}={PROTO_DIR.relative_to(ROOT)}",
        f"--proto_path={well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    with contextlib.chdir(ROOT):
        code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}")


def generated_texts() -> dict[str, str]:
    """Freshly generated stub files, keyed by file name inside `pinmq_pb`."""
    with tempfile.TemporaryDirectory() as tmp:
        _protoc(Path(tmp))
        out = Path(tmp) / PB_PACKAGE
        return {p.name: p.read_text() for p in sorted(out.iterdir()) if p.name.endswith(SUFFIXES)}


def checked_in_texts() -> dict[str, str]:
    """The stub files currently in `pinmq_pb`, keyed like `generated_texts`."""
    pb = ROOT / PB_PACKAGE
    return {p.name: p.read_text() for p in sorted(pb.iterdir()) if p.name.endswith(SUFFIXES)}


def main() -> None:
    pb = ROOT / PB_PACKAGE
    fresh = generated_texts()
    for name in set(checked_in_texts()) - set(fresh):
        (pb / name).unlink()
    for name, text in fresh.items():
        (pb / name).write_text(text)
    print(f"generated {len(fresh)} files in {pb}", file=sys.stderr)


if __name__ == "__main__":
    main()
