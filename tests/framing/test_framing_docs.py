"""docs/framing.md stays true: its Python examples run, in order."""

from __future__ import annotations

from pathlib import Path

from tests.docblocks import code_blocks

DOC = Path(__file__).resolve().parents[2] / "docs" / "framing.md"


def test_framing_doc_examples_run() -> None:
    """Every ```python block of docs/framing.md runs, sharing one namespace."""
    blocks = code_blocks(DOC)
    assert len(blocks) >= 4
    namespace: dict[str, object] = {"__name__": "framing_doc"}
    for i, code in enumerate(blocks):
        # dont_inherit: run as a reader would, without this module's __future__ flags.
        exec(compile(code, f"{DOC.name}[block {i}]", "exec", dont_inherit=True), namespace)


def test_framing_doc_names_every_error() -> None:
    """The error tree in the docs is the one in framing._errors."""
    import framing

    text = DOC.read_text()
    for name in framing.__all__:
        obj = getattr(framing, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert name in text, name
