"""Run the benchmarks listed in ``exactly.benchmarks.BENCHMARKS`` and print a table."""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from exactly.benchmarks import BENCHMARKS
from exactly.benchmarks._harness import Result, format_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="exactly bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check they run")
    parser.add_argument("--only", action="append", help="run only this benchmark module")
    args = parser.parse_args(argv)
    scale = 0.01 if args.quick else 1.0
    names = [n for n in BENCHMARKS if not args.only or n in args.only]
    unknown = sorted(set(args.only or []) - set(BENCHMARKS))
    if unknown:
        print(f"exactly: error: unknown benchmark {', '.join(unknown)} "
              f"(known: {', '.join(BENCHMARKS)})", file=sys.stderr)
        return 1
    results: list[Result] = []
    for name in names:
        t0 = time.perf_counter()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        module = importlib.import_module(f"exactly.benchmarks.{name}")
        results.extend(module.run(scale))
        print(f"  done in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    print(format_table(results))
    from message import IMPLEMENTATION

    print("implementation: " + ("native core (message/_native.c, journal/_native.c)"
                                if IMPLEMENTATION == "native" else
                                "Python (native core not built, or EXACTLY_PURE_PYTHON set)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
