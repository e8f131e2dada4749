"""Write docs/api.md from the public names of each package and their docstrings.

Run ``python docs/gen_api.py``; ``tests/test_docs.py`` fails when api.md is stale.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import os
import sys
from pathlib import Path

# Document the Python implementation, the definition of the behaviour: its
# signatures and docstrings (the native core has the same methods).
os.environ["EXACTLY_PURE_PYTHON"] = "1"

PACKAGES = ("message", "message.rules", "message.arrow", "framing", "journal",
            "journal.metrics", "consumer", "pipeline")
HERE = Path(__file__).resolve().parent


def _signature(obj: object) -> str:
    try:
        return str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""


def _first_paragraph(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def render() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings by `docs/gen_api.py`; every name here is",
        "importable from its package, e.g. `from message import Sequencer`.",
        "",
    ]
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        names = list(getattr(pkg, "__all__", []))
        lines += [f"## `{pkg_name}`", "", _first_paragraph(pkg), ""]
        for name in names:
            obj = getattr(pkg, name)
            if inspect.isclass(obj) and issubclass(obj, enum.Enum):
                lines += [f"### enum `{name}`", "", _first_paragraph(obj) or "—", ""]
                lines += [f"- `{name}.{m.name}` = `{m.value!r}`" for m in obj] + [""]
            elif inspect.isclass(obj):
                kind = "exception" if issubclass(obj, BaseException) else "class"
                lines.append(f"### {kind} `{name}{_signature(obj) if kind == 'class' else ''}`")
                lines += ["", _first_paragraph(obj) or "—", ""]
                members = [
                    (m, v.__func__ if isinstance(v, classmethod | staticmethod) else v,
                     "classmethod " if isinstance(v, classmethod) else "")
                    for m, v in vars(obj).items()
                    if not m.startswith("_")
                    and (callable(v) or isinstance(v, property | classmethod | staticmethod))
                    and (inspect.getdoc(v) or "") and kind == "class"
                ]
                for m, v, how in members:
                    sig = "" if isinstance(v, property) else _signature(getattr(obj, m))
                    lines.append(f"- {how}`{m}{sig}`: {_first_paragraph(v)}")
                if members:
                    lines.append("")
            elif callable(obj):
                lines += [f"### `{name}{_signature(obj)}`", "", _first_paragraph(obj) or "—", ""]
            else:
                lines += [f"### `{name}` = `{obj!r}`", ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    target = HERE / "api.md"
    text = render()
    if "--check" in sys.argv:
        return 0 if target.exists() and target.read_text() == text else 1
    target.write_text(text)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
