"""Regenerate the Python modules of the ``.proto`` files in this folder.

Run ``python proto/generate.py`` (needs the ``test`` extra for grpcio-tools).
``--check`` exits 1 when a committed module differs from what protoc makes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: Where each .proto's generated modules live, relative to the repository:
#: inside the package that uses them.
DESTINATIONS = {
    "broker.proto": "journal/_gazette",
    "checkpoint.proto": "message/_proto",
    "etcd.proto": "consumer/_etcd",
    "examples.proto": "tests",  # example messages of the tests
}


def generate(out_root: Path) -> list[Path]:
    """Compile every .proto of this folder into its destination under
    ``out_root`` (the repository, or a scratch copy of its layout); return
    the files written, relative to ``out_root``."""
    import grpc_tools  # the test extra; not a runtime dependency
    from grpc_tools import protoc

    # The well-known types (google/protobuf/duration.proto) ship with grpc_tools.
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    written = []
    for source in sorted(HERE.glob("*.proto")):
        dest = DESTINATIONS[source.name]
        out_dir = out_root / dest
        out_dir.mkdir(parents=True, exist_ok=True)
        args = [
            "protoc", f"-I{HERE}", f"-I{well_known}",
            f"--python_out={out_dir}", f"--pyi_out={out_dir}", str(source),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed: " + " ".join(args))
        written += [Path(dest) / (source.stem + suffix) for suffix in ("_pb2.py", "_pb2.pyi")]
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    if not args.check:
        for path in generate(ROOT):
            print(f"wrote {path}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        stale = [
            path
            for path in generate(Path(tmp))
            if not (ROOT / path).exists()
            or (ROOT / path).read_bytes() != (Path(tmp) / path).read_bytes()
        ]
    for path in stale:
        print(f"stale: {path}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
