"""Labels and label selectors, with Gazette's syntax and matching rules.

A ``LabelSet`` is an immutable multi-map: each label name has one or more
values, kept sorted and unique, as Gazette keeps its ``LabelSet.Labels``.

A ``LabelSelector`` has an ``include`` and an ``exclude`` set. A labelled
thing matches when every label named in ``include`` is present with one of
the listed values (an empty value means "any value"), and no label named in
``exclude`` is present with one of its listed values. A selector label whose
name ends in ``:prefix`` compares its values as prefixes instead of for
equality. Selector strings (see ``parse_label_selector``)::

    foo=bar            foo present with value bar ("==" also accepted)
    foo!=bar           foo not present with value bar
    foo                foo present, any value
    !foo               foo absent
    foo in (a, b)      foo present with value a or b
    foo notin (a, b)   foo, if present, has neither a nor b ("not in" too)
    foo:prefix=a/      foo has a value starting with a/

Expressions are separated by commas; single spaces around tokens are
tolerated, as in Gazette.

When matched against a ``JournalSpec`` (as ``list()`` does) two meta-labels
are available besides the journal's own labels: ``name`` (the journal name)
and ``prefix`` (a slash-terminated prefix of the name).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol, final, runtime_checkable

from ._errors import InvalidLabelError, LabelSelectorError

#: Label names that may carry only one value (as Gazette's ``labels.SingleValueLabels``).
SINGLE_VALUE_LABELS: Final = frozenset(
    {
        "content-type",
        "app.gazette.dev/instance",
        "app.gazette.dev/managed-by",
        "app.gazette.dev/message-subtype",
        "app.gazette.dev/message-type",
        "app.gazette.dev/region",
    }
)
#: Meta-labels derived from the journal name; journals may not set them.
META_LABELS: Final = frozenset({"name", "prefix"})

# Gazette bounds lengths in bytes of UTF-8. Its minimum label-name length (2)
# is relaxed to 1: nothing here depends on it and short names are common in
# tests and examples.
MAX_LABEL_NAME_LEN: Final = 64
MAX_LABEL_VALUE_LEN: Final = 1024

_PREFIX_SUFFIX: Final = ":prefix"
# Letters and numbers of any script, plus Gazette's token symbols "-_+/."; path
# values add "=%". Python's \w is letters, numbers and "_".
_TOKEN_CLASS: Final = r"[\w\-+/.]"
_PATH_CLASS: Final = r"[\w\-+/.=%]"
_TOKEN_RE: Final = re.compile(_TOKEN_CLASS + r"+")
_PATH_RE: Final = re.compile(_PATH_CLASS + r"*")

LabelsInit = Mapping[str, str | Sequence[str]] | Iterable[tuple[str, str]]


@final
class LabelSet:
    """An immutable, hashable multi-map of label name -> sorted unique values.

    Built from a mapping of ``name -> value`` or ``name -> [values]``, from
    ``(name, value)`` pairs, or from another ``LabelSet``. Iteration yields
    ``(name, value)`` pairs in sorted order, as Gazette's label lists do.
    """

    __slots__ = ("_hash", "_map")

    _map: dict[str, tuple[str, ...]]
    _hash: int

    def __init__(self, labels: LabelSet | LabelsInit | None = None) -> None:
        collected: dict[str, set[str]] = {}
        if isinstance(labels, LabelSet):
            object.__setattr__(self, "_map", labels._map)
            object.__setattr__(self, "_hash", labels._hash)
            return
        if labels is None:
            pass
        elif isinstance(labels, Mapping):
            for name, value in labels.items():
                _check_str(name, "label name")
                values = (value,) if isinstance(value, str) else value
                if isinstance(values, (bytes, bytearray)) or not isinstance(values, Sequence):
                    raise TypeError(f"label {name!r}: expected a str or a sequence of str")
                bucket = collected.setdefault(name, set())
                for v in values:
                    _check_str(v, f"value of label {name!r}")
                    bucket.add(v)
        else:
            for pair in labels:
                name, value = pair
                _check_str(name, "label name")
                _check_str(value, f"value of label {name!r}")
                collected.setdefault(name, set()).add(value)
        # A name listed with no values is not a label at all (as in Gazette).
        built = {k: tuple(sorted(v)) for k, v in sorted(collected.items()) if v}
        object.__setattr__(self, "_map", built)
        object.__setattr__(self, "_hash", hash(tuple(built.items())))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("LabelSet is immutable")

    def value_of(self, name: str) -> str | None:
        """The first (smallest) value of label ``name``, or None if it is absent."""
        values = self._map.get(name)
        return values[0] if values else None

    def values(self, name: str) -> tuple[str, ...]:
        """All values of label ``name``, sorted; empty if it is absent."""
        return self._map.get(name, ())

    def names(self) -> tuple[str, ...]:
        """The label names, sorted."""
        return tuple(self._map)

    def to_dict(self) -> dict[str, list[str]]:
        """A plain ``name -> [values]`` dict (e.g. for JSON)."""
        return {k: list(v) for k, v in self._map.items()}

    def union(self, other: LabelSet | LabelsInit) -> LabelSet:
        """A new set with the labels of both; where both name a label, ours win."""
        other = other if isinstance(other, LabelSet) else LabelSet(other)
        merged = dict(other._map)
        merged.update(self._map)
        return LabelSet(merged)

    def __contains__(self, name: object) -> bool:
        return name in self._map

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for name, values in self._map.items():
            for value in values:
                yield name, value

    def __len__(self) -> int:
        return sum(len(v) for v in self._map.values())

    def __bool__(self) -> bool:
        return bool(self._map)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LabelSet):
            return self._map == other._map
        return NotImplemented

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"LabelSet({self.to_dict()!r})"

    def __reduce__(self) -> tuple[type[LabelSet], tuple[dict[str, list[str]]]]:
        # Immutable with custom __setattr__: pickle through the constructor.
        return (LabelSet, (self.to_dict(),))


def _check_str(value: object, what: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")


def validate_label_name(name: str, *, allow_prefix: bool = False) -> None:
    """Raise ``InvalidLabelError`` unless ``name`` is a valid label name."""
    base = name
    if allow_prefix and name.endswith(_PREFIX_SUFFIX):
        base = name[: -len(_PREFIX_SUFFIX)]
    size = len(base.encode())
    if not 1 <= size <= MAX_LABEL_NAME_LEN:
        raise InvalidLabelError(
            name, f"invalid length ({size}; expected 1 <= length <= {MAX_LABEL_NAME_LEN})"
        )
    if not _TOKEN_RE.fullmatch(base):
        raise InvalidLabelError(name, "not a valid token (letters, digits and -_+/. only)")


def validate_label_value(name: str, value: str) -> None:
    """Raise ``InvalidLabelError`` unless ``value`` is a valid value of label ``name``."""
    size = len(value.encode())
    if size > MAX_LABEL_VALUE_LEN:
        raise InvalidLabelError(
            name, f"value has invalid length ({size}; expected <= {MAX_LABEL_VALUE_LEN})"
        )
    if not _PATH_RE.fullmatch(value):
        raise InvalidLabelError(
            name, f"value {value!r} is not a valid token (letters, digits and -_+/.=% only)"
        )


def validate_journal_labels(labels: LabelSet) -> None:
    """Raise ``InvalidLabelError`` unless ``labels`` may label a journal.

    Gazette's rules: valid names and values, no label with both an empty and
    a non-empty value, no meta-label (``name``, ``prefix``), and a single
    value for the labels of ``SINGLE_VALUE_LABELS`` (``content-type``...).
    """
    for name in labels.names():
        validate_label_name(name)
        values = labels.values(name)
        for value in values:
            validate_label_value(name, value)
        if name in META_LABELS:
            raise InvalidLabelError(name, "is a meta-label and cannot be set on a journal")
        if len(values) > 1 and "" in values:
            raise InvalidLabelError(name, "has both an empty and a non-empty value")
        if len(values) > 1 and name in SINGLE_VALUE_LABELS:
            raise InvalidLabelError(name, f"may have only one value (has {len(values)})")


@dataclass(frozen=True, slots=True)
class _Group:
    """The values a selector lists for one label name, each marked prefix or exact."""

    name: str
    values: tuple[tuple[str, bool], ...]

    def matches(self, candidates: Sequence[str]) -> bool:
        if not candidates:
            return False  # The label is absent: nothing to match.
        for value, prefix in self.values:
            if value == "":
                return True  # An empty selector value matches any value.
            for c in candidates:
                if c.startswith(value) if prefix else c == value:
                    return True
        return False


def _groups(labels: LabelSet) -> tuple[_Group, ...]:
    """Group selector labels by name with the ``:prefix`` suffix stripped."""
    by_name: dict[str, list[tuple[str, bool]]] = {}
    for key, value in labels:
        prefix = key.endswith(_PREFIX_SUFFIX)
        name = key[: -len(_PREFIX_SUFFIX)] if prefix else key
        by_name.setdefault(name, []).append((value, prefix))
    return tuple(_Group(k, tuple(v)) for k, v in sorted(by_name.items()))


def _meta_groups(groups: tuple[_Group, ...]) -> tuple[_Group, ...]:
    """Rewrite the ``prefix`` meta-label as a prefix match on ``name``, as Gazette's List does."""
    out: dict[str, list[tuple[str, bool]]] = {}
    for g in groups:
        if g.name == "prefix":
            out.setdefault("name", []).extend((v, True) for v, _ in g.values)
        else:
            out.setdefault(g.name, []).extend(g.values)
    return tuple(_Group(k, tuple(v)) for k, v in sorted(out.items()))


@runtime_checkable
class NamedLabels(Protocol):
    """A journal's name and labels (a ``JournalSpec``): what a selector's
    meta-labels match, without this module depending on the spec's."""

    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> LabelSet: ...


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """Include / exclude label sets; see the module docstring for the rules.

    ``include`` and ``exclude`` are ``LabelSet``s whose names may end in
    ``:prefix``. The empty selector matches everything.
    """

    include: LabelSet = field(default_factory=LabelSet)
    exclude: LabelSet = field(default_factory=LabelSet)
    _inc: tuple[_Group, ...] = field(init=False, repr=False, compare=False)
    _exc: tuple[_Group, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        include = self.include if isinstance(self.include, LabelSet) else LabelSet(self.include)
        exclude = self.exclude if isinstance(self.exclude, LabelSet) else LabelSet(self.exclude)
        object.__setattr__(self, "include", include)
        object.__setattr__(self, "exclude", exclude)
        object.__setattr__(self, "_inc", _groups(include))
        object.__setattr__(self, "_exc", _groups(exclude))

    def matches(self, labels: LabelSet | NamedLabels | LabelsInit) -> bool:
        """Whether ``labels`` is selected. Given a ``JournalSpec`` (anything
        with a ``name`` and ``labels``), the meta-labels ``name`` and
        ``prefix`` refer to the journal's name."""
        inc, exc = self._inc, self._exc
        if isinstance(labels, NamedLabels):
            target = labels.labels.union({"name": labels.name})
            inc, exc = _meta_groups(inc), _meta_groups(exc)
        elif isinstance(labels, LabelSet):
            target = labels
        else:
            target = LabelSet(labels)
        if any(g.matches(target.values(g.name)) for g in exc):
            return False
        return all(g.matches(target.values(g.name)) for g in inc)

    def __str__(self) -> str:
        """The canonical selector string; parsing it gives an equal selector."""
        parts = [*_format(self.include, exclude=False), *_format(self.exclude, exclude=True)]
        return ",".join(parts)


def _format(labels: LabelSet, *, exclude: bool) -> Iterator[str]:
    for name in labels.names():
        values = labels.values(name)
        if values == ("",):
            yield f"!{name}" if exclude else name
        elif len(values) == 1:
            yield f"{name}{'!=' if exclude else '='}{values[0]}"
        else:
            yield f"{name} {'notin' if exclude else 'in'} ({','.join(values)})"


# Gazette's selector grammar, expression by expression. Each pattern consumes
# one expression and its trailing comma; single optional spaces are allowed
# where Gazette allows them. \Z, not $, so that a trailing newline is an error.
_RE_TOKEN: Final = r" ?(" + _TOKEN_CLASS + r"+(?::prefix)?)"
_RE_PATH: Final = r" ?(" + _PATH_CLASS + r"*)"
_RE_END: Final = r" ?(?:,|\Z)"
_RE_PAREN: Final = r" ?\(([^)]+)\)"
_SEL_EQUAL: Final = re.compile(_RE_TOKEN + r" ?=?=" + _RE_PATH + _RE_END)
_SEL_NOT_EQUAL: Final = re.compile(_RE_TOKEN + r" ?!=" + _RE_PATH + _RE_END)
_SEL_IN: Final = re.compile(_RE_TOKEN + r" in" + _RE_PAREN + _RE_END)
_SEL_NOT_IN: Final = re.compile(_RE_TOKEN + r" not ?in" + _RE_PAREN + _RE_END)
_SEL_EXISTS: Final = re.compile(_RE_TOKEN + _RE_END)
_SEL_NOT_EXISTS: Final = re.compile(r" ?!" + _RE_TOKEN + _RE_END)
_SEL_SET_VALUE: Final = re.compile(_RE_PATH + _RE_END)


def parse_label_selector(s: str | LabelSelector) -> LabelSelector:
    """Parse a Gazette label selector string ``s`` (a ``LabelSelector`` passes through).

    The empty string selects everything. Raises ``LabelSelectorError`` (a
    ``ValueError``) for a malformed selector.
    """
    selector = s
    if isinstance(selector, LabelSelector):
        return selector
    if not isinstance(selector, str):
        raise TypeError(f"selector must be a str or LabelSelector, not {type(selector).__name__}")
    include: list[tuple[str, str]] = []
    exclude: list[tuple[str, str]] = []
    rest = selector
    while rest:
        if m := _SEL_EQUAL.match(rest):
            include.append((m[1], m[2]))
        elif m := _SEL_NOT_EQUAL.match(rest):
            exclude.append((m[1], m[2]))
        elif m := _SEL_IN.match(rest):
            include.extend((m[1], v) for v in _parse_set(selector, m[2]))
        elif m := _SEL_NOT_IN.match(rest):
            exclude.extend((m[1], v) for v in _parse_set(selector, m[2]))
        elif m := _SEL_EXISTS.match(rest):
            include.append((m[1], ""))
        elif m := _SEL_NOT_EXISTS.match(rest):
            exclude.append((m[1], ""))
        else:
            raise LabelSelectorError(
                selector, f"could not match {rest!r} to a label selector expression"
            )
        rest = rest[m.end() :]
    out = LabelSelector(LabelSet(include), LabelSet(exclude))
    _validate_selector(selector, out)
    return out


def _parse_set(selector: str, body: str) -> list[str]:
    values: list[str] = []
    while body:
        m = _SEL_SET_VALUE.match(body)
        if m is None:
            raise LabelSelectorError(
                selector, f"could not match {body!r} to a label selector set expression"
            )
        values.append(m[1])
        body = body[m.end() :]
    return values


def _validate_selector(selector: str, sel: LabelSelector) -> None:
    for which, labels in (("include", sel.include), ("exclude", sel.exclude)):
        for group in _groups(labels):
            try:
                validate_label_name(group.name)
                for value, _ in group.values:
                    validate_label_value(group.name, value)
            except InvalidLabelError as err:
                raise LabelSelectorError(selector, str(err)) from None
            values = [v for v, _ in group.values]
            if len(values) > 1 and "" in values:
                raise LabelSelectorError(
                    selector, f"{which}: label {group.name!r} has both empty and non-empty values"
                )
            if group.name == "prefix" and any(not v.endswith("/") for v in values):
                raise LabelSelectorError(
                    selector, f"{which}: meta-label 'prefix' values must end in '/'"
                )
