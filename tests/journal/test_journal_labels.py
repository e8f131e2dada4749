"""Journal names, specs, label sets and Gazette label selectors."""

from __future__ import annotations

import dataclasses
import pickle
import types
from pathlib import Path

import pytest

import journal
from journal import (
    AppendResult,
    InvalidJournalNameError,
    InvalidLabelError,
    JournalError,
    JournalSpec,
    LabelSelector,
    LabelSelectorError,
    LabelSet,
    MemoryJournalClient,
    parse_label_selector,
    validate_journal_name,
)


def _sel(
    include: dict[str, list[str]] | None = None, exclude: dict[str, list[str]] | None = None
) -> LabelSelector:
    return LabelSelector(LabelSet(include or {}), LabelSet(exclude or {}))


# LabelSet -------------------------------------------------------------------


def test_labelset_is_a_sorted_unique_multimap() -> None:
    """Values are kept sorted and unique per name; value_of gives the first."""
    ls = LabelSet({"b": ["2", "1", "2"], "a": "x"})
    assert list(ls) == [("a", "x"), ("b", "1"), ("b", "2")]
    assert ls.values("b") == ("1", "2")
    assert ls.value_of("b") == "1"
    assert ls.value_of("missing") is None
    assert ls.values("missing") == ()
    assert ls.names() == ("a", "b")
    assert len(ls) == 3
    assert "a" in ls and "c" not in ls
    assert ls.to_dict() == {"a": ["x"], "b": ["1", "2"]}


def test_labelset_equality_hash_and_sources() -> None:
    """Sets built from a mapping, from pairs or from a set are equal and hash alike."""
    a = LabelSet({"k": ["v1", "v2"], "z": "1"})
    b = LabelSet([("z", "1"), ("k", "v2"), ("k", "v1")])
    assert a == b and hash(a) == hash(b)
    assert LabelSet(a) == a
    assert a != LabelSet({"k": "v1"})
    assert {a: 1}[b] == 1
    assert pickle.loads(pickle.dumps(a)) == a


def test_labelset_is_immutable_and_typed() -> None:
    """No attribute can be set; non-str names or values raise TypeError; empty lists vanish."""
    ls = LabelSet({"k": "v"})
    with pytest.raises(AttributeError):
        ls._map = {}
    with pytest.raises(TypeError):
        LabelSet({"k": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        LabelSet({"k": b"v"})  # type: ignore[arg-type]
    assert LabelSet({"k": []}) == LabelSet()
    assert not LabelSet()


def test_labelset_union_prefers_own_values() -> None:
    """union() keeps our values for a name both sets have."""
    assert LabelSet({"a": "1"}).union({"a": "2", "b": "3"}) == LabelSet({"a": "1", "b": "3"})


# JournalSpec ------------------------------------------------------------------


def test_journal_spec_accepts_a_plain_dict() -> None:
    """JournalSpec converts a dict to a LabelSet and exposes content_type."""
    spec = JournalSpec("a/b", {"content-type": "application/x-ndjson"})
    assert isinstance(spec.labels, LabelSet)
    assert spec.content_type == "application/x-ndjson"
    assert spec == JournalSpec("a/b", LabelSet({"content-type": ["application/x-ndjson"]}))
    assert hash(spec) == hash(JournalSpec("a/b", {"content-type": "application/x-ndjson"}))
    assert JournalSpec("a/b").content_type is None
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_journal_spec_is_frozen() -> None:
    """A JournalSpec is a frozen dataclass: it cannot be changed after construction."""
    assert dataclasses.is_dataclass(JournalSpec)
    assert [f.name for f in dataclasses.fields(JournalSpec)][:2] == ["name", "labels"]
    spec = JournalSpec("a/b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "c"  # type: ignore[misc]


def test_append_result_is_a_named_tuple() -> None:
    """AppendResult is a NamedTuple: (journal, begin, end)."""
    assert issubclass(AppendResult, tuple)
    assert AppendResult._fields == ("journal", "begin", "end")
    journal_name, begin, end = AppendResult("j", 3, 9)
    assert (journal_name, begin, end) == ("j", 3, 9)
    assert AppendResult("j", 3, 9).end == 9


# Journal names --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["a", "a/b", "examples/a-name/part=000", "x.y_z+1%20", "répertoire/日本", "a" * 512, "..."],
)
def test_valid_journal_names(name: str) -> None:
    """Names drawn from letters, digits and -_+/.=% forming a clean path are accepted."""
    validate_journal_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/a",
        "a/",
        "a//b",
        "./a",
        "a/./b",
        "a/..",
        "..",
        ".",
        "a b",
        "a;meta",
        "a:b",
        "a@b",
        "a" * 513,
        "é" * 257,
    ],
)
def test_invalid_journal_names(name: str) -> None:
    """Gazette's rules: bad symbols, unclean paths, overlong names raise InvalidJournalNameError."""
    with pytest.raises(InvalidJournalNameError) as info:
        validate_journal_name(name)
    assert isinstance(info.value, ValueError)
    assert info.value.journal == name


@pytest.mark.parametrize(
    "labels",
    [
        {"name": "x"},
        {"prefix": "x/"},
        {"content-type": ["text/csv", "application/x-ndjson"]},
        {"k": ["", "v"]},
        {"bad label": "v"},
        {"k": "bad value"},
        {"k" * 65: "v"},
        {"k": "v" * 1025},
    ],
)
def test_invalid_journal_labels_rejected_on_create(labels: dict[str, str | list[str]]) -> None:
    """Meta-labels, multi-valued content-type, mixed empty values and bad tokens are refused."""
    with MemoryJournalClient() as client:
        with pytest.raises(InvalidLabelError):
            client.create("journal", labels)
        assert client.list() == []


def test_any_content_type_is_created_and_read_as_raw_bytes(tmp_path: Path) -> None:
    """Any content-type is created, as Gazette's brokers create it (a
    framing may be registered only where the journal is read); raw appends
    and reads work, and messages of a type no framing reads are refused with
    Gazette's words, at publishing and at reading."""
    from framing import UnknownContentTypeError
    from journal import LocalJournalStore
    from message import JsonDocument, Publisher, ReadUncommittedIter

    for client in (MemoryJournalClient(), LocalJournalStore(str(tmp_path))):
        with client:
            spec = client.create("raw/j", {"content-type": "text/plain"})
            assert spec.content_type == "text/plain" and client.list() == [spec]
            client.append("raw/j", b"hello\n").result()
            with client.read("raw/j") as r:
                assert r.read() == b"hello\n"
            with pytest.raises(UnknownContentTypeError, match=r"^unrecognized content-type"
                                                              r" \(text/plain\)"):
                list(ReadUncommittedIter(client, "raw/j", lambda spec: JsonDocument()))
            with pytest.raises(UnknownContentTypeError):
                Publisher(client).publish_committed(
                    lambda m: ("raw/j", "text/plain"), JsonDocument(a=1)).result()


# Selectors: parsing (Gazette's cases) -------------------------------------------


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("foo = bar", _sel({"foo": ["bar"]})),
        ("foo:prefix =bar", _sel({"foo:prefix": ["bar"]})),
        ("foo != bar", _sel(exclude={"foo": ["bar"]})),
        ("foo ", _sel({"foo": [""]})),
        (" !foo", _sel(exclude={"foo": [""]})),
        (" foo in (bing, baz,bar)", _sel({"foo": ["bar", "baz", "bing"]})),
        (" foo not in ( pear, apple )", _sel(exclude={"foo": ["apple", "pear"]})),
        (
            "foo==bar, baz !=bing ,apple:prefix in (fruit, banana)",
            _sel({"apple:prefix": ["banana", "fruit"], "foo": ["bar"]}, {"baz": ["bing"]}),
        ),
        (
            "!foo,baz,bing:prefix not in (thing-one, thing-2),!bar,",
            _sel(
                {"baz": [""]}, {"bar": [""], "bing:prefix": ["thing-2", "thing-one"], "foo": [""]}
            ),
        ),
        (
            "foo = ba=ar, baz=bi=ngo,exc!=who=ops",
            _sel({"foo": ["ba=ar"], "baz": ["bi=ngo"]}, {"exc": ["who=ops"]}),
        ),
        (
            "foo in (bi=ng,ba=ar), exc notin (who=ops,oth=er)",
            _sel({"foo": ["bi=ng", "ba=ar"]}, {"exc": ["who=ops", "oth=er"]}),
        ),
        ("", _sel()),
    ],
)
def test_parse_label_selector_cases(text: str, expect: LabelSelector) -> None:
    """Gazette's parsing cases give the same include/exclude sets, and str() round-trips."""
    sel = parse_label_selector(text)
    assert sel == expect
    assert parse_label_selector(str(sel)) == sel


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("apple,banana err in (bar)", "could not match 'banana err in (bar)'"),
        ("apple,banana in (bar,err baz)", "could not match 'err baz'"),
        ("ban=ana in (bar)", "could not match 'ban=ana in (bar)'"),
        ("foo, foo in (bar)", "both empty and non-empty"),
        ("prefix=a", "must end in '/'"),
        ("foo in (a", "could not match"),
        ("a=b\n", "could not match"),
        ("!", "could not match"),
        ("=x", "could not match"),
        ("app notin a", "could not match"),
    ],
)
def test_malformed_selectors(text: str, message: str) -> None:
    """Malformed selectors raise LabelSelectorError, a JournalError and a ValueError, saying why."""
    with pytest.raises(LabelSelectorError, match=None) as info:
        parse_label_selector(text)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, JournalError)
    assert info.value.selector == text


def test_selector_passes_through_and_type_checks() -> None:
    """A LabelSelector is returned as is; other types raise TypeError."""
    sel = parse_label_selector("a=b")
    assert parse_label_selector(sel) is sel
    with pytest.raises(TypeError):
        parse_label_selector(3)  # type: ignore[arg-type]


# Selectors: matching (Gazette's cases) --------------------------------------------------


_MATCH_SEL = _sel(
    {"inc-1:prefix": ["a-val/"], "inc-2": [""], "inc-3": ["val-1", "val-2"]},
    {"exc-1": [""], "exc-2": ["val-3", "val-4"]},
)


def _ls(*nv: str) -> LabelSet:
    return LabelSet(list(zip(nv[::2], nv[1::2], strict=True)))


@pytest.mark.parametrize(
    ("labels", "expect"),
    [
        (_ls(), False),
        (_ls("foo", "bar", "inc-1", "a-val/a/1", "inc-2", "any", "inc-3", "val-1"), True),
        (_ls("foo", "bar", "inc-1", "a-val/b/2", "inc-2", "foo", "inc-3", "val-1"), True),
        (_ls("foo", "bar", "inc-1", "a-val/c/3", "inc-2", "any", "inc-3", "val-2"), True),
        (_ls("foo", "bar", "inc-1", "bad-val/4", "inc-2", "any", "inc-3", "val-1"), False),
        (_ls("foo", "bar", "inc-1", "a-val/5", "inc-3", "val-1"), False),
        (_ls("foo", "bar", "inc-1", "a-val/6", "inc-2", "any", "inc-3", "val-other"), False),
        (_ls("exc-1", "any", "inc-1", "a-val/a/7", "inc-2", "any", "inc-3", "val-1"), False),
        (_ls("exc-2", "val-4", "inc-1", "a-val/8", "inc-2", "any", "inc-3", "val-1"), False),
        (_ls("exc-2", "val-ok", "inc-1", "a-val/9/9", "inc-2", "any", "inc-3", "val-1"), True),
    ],
)
def test_selector_matching_cases(labels: LabelSet, expect: bool) -> None:
    """Gazette's matching cases: prefix, any-value, alternatives and exclusions."""
    assert _MATCH_SEL.matches(labels) is expect


def test_exclude_only_selector() -> None:
    """A selector with only exclusions matches everything not excluded."""
    sel = _sel(exclude={"exc-1": [""], "exc-2": ["val-3"]})
    assert sel.matches(LabelSet())
    assert sel.matches({"foo": "bar", "exc-2": "val-ok"})
    assert not sel.matches({"exc-2": "val-3"})
    assert not sel.matches({"exc-1": "any"})


def test_meta_labels_match_journal_names() -> None:
    """Against a JournalSpec, name= and prefix= match its name; against bare labels they do not."""
    spec = JournalSpec("topic/one/part-1", {"topic": "one"})
    assert parse_label_selector("name=topic/one/part-1").matches(spec)
    assert not parse_label_selector("name=topic/one").matches(spec)
    assert parse_label_selector("prefix=topic/one/").matches(spec)
    assert not parse_label_selector("prefix=topic/two/").matches(spec)
    assert parse_label_selector("prefix notin (topic/two/), topic=one").matches(spec)
    assert not parse_label_selector("prefix=topic/").matches(spec.labels)


# Package surface -------------------------------------------------------------------


def test_exports_are_curated() -> None:
    """journal.__all__ lists exactly the public names (those loaded when first
    named included), each defined in a private module."""
    public = {
        n
        for n in dir(journal)
        if not n.startswith("_") and not isinstance(getattr(journal, n), types.ModuleType)
    }
    assert public == set(journal.__all__)
    for name in journal.__all__:
        module = getattr(getattr(journal, name), "__module__", "journal._")
        assert module.startswith("journal._"), name


def test_error_tree() -> None:
    """Errors caused by bad input are also ValueErrors; all are JournalErrors."""
    for cls in (
        journal.InvalidJournalNameError,
        journal.InvalidLabelError,
        journal.LabelSelectorError,
        journal.AppendTooLargeError,
        journal.OffsetNotYetAvailableError,
    ):
        assert issubclass(cls, JournalError) and issubclass(cls, ValueError), cls
    for other in (
        journal.JournalNotFoundError,
        journal.JournalExistsError,
        journal.CorruptJournalError,
    ):
        assert issubclass(other, JournalError) and not issubclass(other, ValueError), other
    assert issubclass(journal.JournalClosedError, RuntimeError)
