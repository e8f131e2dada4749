"""The public API: every name the API reference (docs/api.md) fixes is
importable from its package root, and every package's ``__all__`` names only what exists."""

from __future__ import annotations

import importlib

import pytest

SPEC_NAMES = {
    "message": [
        "new_producer_id", "Flags", "build_uuid", "get_clock", "get_flags",
        "get_producer_id", "new_clock", "Clock", "Message", "Envelope", "JournalProducer",
        "ProducerState", "Sequencer", "Checkpoint", "modulo_mapping", "rendezvous_mapping",
        "random_mapping", "Publisher", "AckIntent", "ReadUncommittedIter",
        "ReadCommittedIter", "MessageError", "MustStartReplay", "ReplayError",
        "EmptyPartitionsError",
    ],
    "framing": [
        "CONTENT_TYPE_CSV", "CONTENT_TYPE_JSON_LINES", "CONTENT_TYPE_PROTO_FIXED",
        "FIXED_FRAME_WORD", "FIXED_FRAME_HEADER_LENGTH", "register_framing",
        "framing_by_content_type", "UnknownContentTypeError", "Framing",
        "encode_fixed_proto_frame", "unpack_line", "unpack_fixed_frame", "FramingError",
        "TruncatedFrameError", "DesyncError",
    ],
    "journal": [
        "JournalSpec", "LabelSet", "parse_label_selector", "LabelSelectorError",
        "AppendResult", "JournalClient", "LocalJournalStore", "JournalError",
        "JournalNotFoundError", "JournalExistsError", "JournalStore", "GazetteClient",
    ],
    "consumer": [
        "ShardSpec", "Shard", "Application", "Store", "JSONFileStore", "SQLiteStore",
        "PostgresStore", "Runner", "ConsumerError", "FencedError",
    ],
}


@pytest.mark.parametrize("package", sorted(SPEC_NAMES))
def test_spec_names_are_exported(package: str) -> None:
    """Each name the contract fixes is importable from the package root and listed in __all__."""
    mod = importlib.import_module(package)
    for name in SPEC_NAMES[package]:
        assert hasattr(mod, name), f"{package}.{name}"
        assert name in mod.__all__, f"{package}.__all__ lacks {name}"


@pytest.mark.parametrize("package", ["message", "framing", "journal", "consumer", "pipeline"])
def test_all_names_exist(package: str) -> None:
    """__all__ lists only names that exist."""
    mod = importlib.import_module(package)
    for name in getattr(mod, "__all__", []):
        assert hasattr(mod, name), f"{package}.{name}"


def test_error_hierarchy() -> None:
    """Errors derive from their package's base, and bad-input errors are ValueErrors."""
    import framing
    import journal
    import message

    for cls in (message.MustStartReplay, message.ReplayError, message.EmptyPartitionsError):
        assert issubclass(cls, message.MessageError)
    assert issubclass(framing.UnknownContentTypeError, framing.FramingError)
    assert issubclass(framing.UnknownContentTypeError, ValueError)
    assert issubclass(journal.LabelSelectorError, ValueError)
    assert issubclass(journal.JournalNotFoundError, journal.JournalError)
    import consumer

    assert issubclass(consumer.FencedError, consumer.ConsumerError)
    assert issubclass(consumer.StoreError, consumer.ConsumerError)


def test_each_package_has_one_exception_tree_drawn_in_its_docstring() -> None:
    """Every exception class a package exports derives from the package's
    one base, and the tree in the docstring of its errors module names each."""
    import importlib
    import inspect

    bases = {"framing": "FramingError", "journal": "JournalError", "message": "MessageError",
             "consumer": "ConsumerError", "pipeline": "PipelineError", "exactly": "ExactlyError"}
    for package, base_name in bases.items():
        pkg = importlib.import_module(package)
        base = getattr(pkg, base_name)
        errors = importlib.import_module(f"{package}._errors")
        picture = inspect.getdoc(errors) or ""
        exported = [getattr(pkg, n) for n in getattr(pkg, "__all__", dir(pkg))
                    if not n.startswith("_")]
        if package == "exactly":
            import exactly.localcluster as lc

            exported = [getattr(lc, n) for n in dir(lc) if not n.startswith("_")]
            exported.append(importlib.import_module("exactly._common").UsageError)
        classes = [c for c in exported if isinstance(c, type) and issubclass(c, BaseException)]
        assert base in classes or package == "exactly", package
        for cls in classes:
            if cls.__module__.split(".")[0] != package:
                continue  # another package's, re-exported
            assert issubclass(cls, base), f"{package}.{cls.__name__} is not a {base_name}"
            assert cls.__name__ in picture, f"{package}: {cls.__name__} not in the tree"


def test_dependencies_flow_one_way() -> None:
    """framing and journal never import message (nor pipeline, nor consumer)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for package in ("framing", "journal"):
        for path in (root / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                for n in names:
                    top = n.split(".")[0]
                    assert top not in ("message", "pipeline", "consumer"), f"{path} imports {n}"


# The packages and what each may import: only the packages below it.
LAYERS = {
    "framing": set(),
    "journal": {"framing"},
    "message": {"framing", "journal"},
    "consumer": {"framing", "journal", "message"},
    "pipeline": {"framing", "journal", "message"},
    "exactly": {"framing", "journal", "message", "consumer", "pipeline"},
}


def _imports(path: object) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import of a module's source."""
    import ast
    from pathlib import Path

    assert isinstance(path, Path)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(node.lineno, node.module)]
    return out


def test_packages_import_only_the_packages_below_them() -> None:
    """framing <- journal <- message <- {consumer, pipeline} <- exactly: no import runs up."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for package, allowed in LAYERS.items():
        for path in (root / package).rglob("*.py"):
            for line, name in _imports(path):
                top = name.split(".")[0]
                if top in LAYERS and top != package:
                    assert top in allowed, f"{path}:{line} imports {name}"


def _private_names(path: object) -> list[tuple[int, str]]:
    """``(line, name)`` of every absolute import in a module's source that
    names something private: a ``_module`` on the path, or ``from x import _name``."""
    import ast
    from pathlib import Path

    assert isinstance(path, Path)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return [(line, name) for line, name in out
            if any(part.startswith("_") and not part.startswith("__")
                   for part in name.split(".")[1:])]


def test_no_module_imports_another_packages_private_names() -> None:
    """Where a package needs another's internals, the owner offers a public
    name: no module imports a private (``_name``) module or name of another
    of the project's packages."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = []
    for package in LAYERS:
        for path in (root / package).rglob("*.py"):
            if path.name.endswith("_pb2.py"):
                continue  # generated by protoc
            for line, name in _private_names(path):
                top = name.split(".")[0]
                if top in LAYERS and top != package:
                    found.append(f"{path.relative_to(root)}:{line} imports {name}")
    assert not found, "\n".join(found)


def test_the_private_import_check_sees_one() -> None:
    """The check above finds what it looks for (on a module written for it)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.py"
        path.write_text("from message._reader import NATIVE\nfrom journal import _files\n"
                        "import framing.testing\nfrom message import Sequencer\n")
        assert [n for _, n in _private_names(path)] == [
            "message._reader.NATIVE", "journal._files"]


def test_installed_top_level_names_are_the_public_packages() -> None:
    """An install adds these import names and no others (``proto`` would
    collide with proto-plus, ``benchmarks`` with anyone's)."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())
    packages = config["tool"]["setuptools"]["packages"]
    assert {p.split(".")[0] for p in packages} == {
        "framing", "journal", "message", "consumer", "pipeline", "exactly"}
    for p in packages:  # each listed package is a directory with its __init__.py
        assert (root / p.replace(".", "/") / "__init__.py").is_file(), p


def _loads_lazily(package: str, checks: str) -> None:
    """Run ``checks`` in a fresh interpreter, then check that ``package``
    has no attribute ``NoSuchName`` (its lazy loader says which)."""
    import subprocess
    import sys

    code = (
        checks
        + "try:\n"
        f"    {package}.NoSuchName\n"
        "except AttributeError as e:\n"
        "    assert 'NoSuchName' in str(e)\n"
        "else:\n"
        f"    raise AssertionError('{package}.NoSuchName exists')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr


def test_the_gazette_client_loads_grpc_only_when_named() -> None:
    """Programs on the embedded store import no grpc; naming the Gazette
    client (attribute, ``from journal import ...``, ``*``) loads it."""
    _loads_lazily("journal", (
        "import sys, message, journal, framing\n"
        "assert 'grpc' not in sys.modules, 'grpc imported on the embedded store'\n"
        "assert {'GazetteClient', 'GazetteReader', 'JournalRoute'} <= set(dir(journal))\n"
        "from journal import GazetteClient\n"
        "assert 'grpc' in sys.modules\n"
        "from journal._gazette.client import GazetteClient as Real\n"
        "assert GazetteClient is Real is journal.GazetteClient\n"
        "ns = {}\n"
        "exec('from journal import *', ns)\n"
        "assert ns['GazetteReader'] is journal.GazetteReader\n"
        "assert ns['JournalRoute'] is journal.JournalRoute\n"
    ))


def test_consumer_loads_the_etcd_client_only_when_a_member_is_named() -> None:
    """A consumer of one process (Runner) imports no grpc; naming what
    members use (attribute, ``from consumer import ...``, ``*``) loads it."""
    _loads_lazily("consumer", (
        "import sys, consumer\n"
        "assert 'grpc' not in sys.modules, 'grpc imported by consumer'\n"
        "assert {'Member', 'ShardGroup', 'EtcdClient', 'GroupView'} <= set(dir(consumer))\n"
        "from consumer import Member\n"
        "assert 'grpc' in sys.modules\n"
        "from consumer._member import Member as Real\n"
        "assert Member is Real is consumer.Member\n"
        "ns = {}\n"
        "exec('from consumer import *', ns)\n"
        "assert all(name in ns for name in consumer.__all__)\n"
    ))


@pytest.mark.parametrize("module", ["message._native", "journal._native"])
def test_native_stubs_name_what_the_module_has(module: str) -> None:
    """Each native extension module's ``.pyi`` names exactly its functions
    and classes, and each class's public methods."""
    import ast
    import importlib
    from pathlib import Path

    try:
        native = importlib.import_module(module)
    except ImportError:
        pytest.skip(f"{module} is not built here")
    root = Path(__file__).resolve().parent.parent
    tree = ast.parse((root / (module.replace(".", "/") + ".pyi")).read_text())
    stubbed = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    assert set(stubbed) == {n for n in dir(native) if not n.startswith("_")}
    for name, node in stubbed.items():
        if isinstance(node, ast.ClassDef):
            methods = {m.name for m in node.body if isinstance(m, ast.FunctionDef)
                       and not m.name.startswith("_")}
            actual = {m for m in dir(getattr(native, name)) if not m.startswith("_")}
            assert methods == actual, name


def test_spec_parameter_names_work_as_keywords() -> None:
    """The parameter names SPEC writes are the functions' own:
    framing_by_content_type(ct), Checkpoint.from_bytes(b), parse_label_selector(s)."""
    from framing import CONTENT_TYPE_CSV, framing_by_content_type
    from journal import parse_label_selector
    from message import Checkpoint

    assert framing_by_content_type(ct=CONTENT_TYPE_CSV).content_type == CONTENT_TYPE_CSV
    cp = Checkpoint({"a/b": 7})
    assert Checkpoint.from_bytes(b=cp.to_bytes()) == cp
    assert parse_label_selector(s="app=web").matches({"app": "web"})
