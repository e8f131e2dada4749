"""Regenerate the Python modules of the ``.proto`` files in this folder.

Run ``python -m proto.generate`` (needs the ``test`` extra for grpcio-tools).
``--check`` exits 1 when a committed module differs from what protoc makes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def generate(out_dir: Path) -> list[Path]:
    """Compile every .proto of this folder into ``out_dir``; return the files."""
    from grpc_tools import protoc  # the test extra; not a runtime dependency

    sources = sorted(HERE.glob("*.proto"))
    args = [
        "protoc", f"-I{HERE}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
        *map(str, sources),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed: " + " ".join(args))
    return [out_dir / (p.stem + suffix) for p in sources for suffix in ("_pb2.py", "_pb2.pyi")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    if not args.check:
        for path in generate(HERE):
            print(f"wrote {path.relative_to(HERE.parent)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        stale = [
            p.name
            for p in generate(Path(tmp))
            if not (HERE / p.name).exists() or (HERE / p.name).read_bytes() != p.read_bytes()
        ]
    for name in stale:
        print(f"stale: proto/{name}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
