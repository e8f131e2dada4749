"""Ready-made message types, so that users never hand-write get_uuid/set_uuid.

- :class:`JsonDocument` — a dict whose UUID lives at a path such as
  ``_meta/uuid`` (``document_type("id")`` makes one for another path).
- :class:`DataclassMessage` — a mixin for dataclasses with a ``uuid`` field.
- :class:`CSVRecord` — a list of strings whose first field is the UUID.
- :func:`proto_message_type` — wraps a protobuf class with a UUID field
  (bytes or string) for the fixed-header protobuf framing.

:func:`sortable_uuid` turns a message's v1 UUID into the equivalent v6 UUID,
whose bytes sort by time (then counter, flags and producer): a good key for
storage that orders rows by publishing time.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, ClassVar, Final, Self, cast
from uuid import UUID

import uuid6

from framing import FrameDecodeError

from ._uuid import UUID_INT_OF, uuid_from_int, uuid_text

NIL_UUID = uuid.UUID(int=0)


def sortable_uuid(u: uuid.UUID) -> uuid.UUID:
    """The v6 form of a v1 UUID: same bits, reordered so that bytes sort by time."""
    return uuid.UUID(int=uuid6.uuid1_to_uuid6(u).int)


def _uuid_from_str(s: str) -> uuid.UUID:
    """Parse a UUID string; the canonical form about twice as fast as uuid.UUID(s)."""
    if len(s) == 36 and s[8] == s[13] == s[18] == s[23] == "-":
        try:
            # int() also takes "_" between digits and a leading sign: such a
            # string is no UUID anyway, and any value it gives is as good.
            return uuid_from_int(int(s.replace("-", ""), 16))
        except ValueError:
            return NIL_UUID
    try:
        return uuid.UUID(s)  # other spellings: braces, urn:uuid:, no hyphens
    except ValueError:
        return NIL_UUID


def _int_of(value: object) -> int:
    """``_as_uuid(value).int``, without building the UUID for the canonical form."""
    if type(value) is str and len(value) == 36:
        try:
            return int(value.replace("-", ""), 16)
        except ValueError:
            return 0
    return _as_uuid(value).int


def _as_uuid(value: object) -> uuid.UUID:
    if type(value) is str:
        return _uuid_from_str(value) if value else NIL_UUID
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, bytes | bytearray) and len(value) == 16:
        return uuid.UUID(bytes=bytes(value))
    return NIL_UUID


#: Where a :class:`JsonDocument` keeps its UUID unless told otherwise
#: (``_meta/uuid``). The one definition: the document types, the Arrow
#: readers and writers, the Spark source's options and the native core
#: (``message/_core.py`` passes it) all take it from here.
DEFAULT_UUID_PATH: Final = ("_meta", "uuid")
_META, _UUID_KEY = DEFAULT_UUID_PATH


def uuid_path_of(text: str) -> tuple[str, ...]:
    """The keys of a ``/``-separated UUID path: ``"_meta/uuid"`` is
    ``("_meta", "uuid")``. Raises ``ValueError`` if it names no key."""
    parts = tuple(p for p in text.split("/") if p)
    if not parts:
        raise ValueError(f"a UUID path names at least one key, not {text!r}")
    return parts


def json_uuid_int(doc: dict[str, Any]) -> int:
    """The UUID of a document keeping it at :data:`DEFAULT_UUID_PATH`, as an
    int (``get_uuid().int`` without building the UUID; 0 for none): the
    Sequencer's shortcut for such documents (``UUID_INT_OF``), which the
    native core also recognises."""
    try:
        value = doc[_META][_UUID_KEY]
    except (KeyError, TypeError, IndexError):
        return 0
    return _int_of(value)


class JsonDocument(dict[str, Any]):
    """A JSON document (a dict) carrying its UUID at ``uuid_path``.

    The path is a ``/``-separated list of keys; the default ``_meta/uuid``
    keeps the UUID beside the content, as Estuary Flow does::

        {"_meta": {"uuid": "…"}, "page": "/home"}

    ``set_uuid`` stores the UUID's canonical string, as a document read back
    holds it (a published document equals itself read back), and, unlike a
    ``uuid.UUID`` object, a string leaves the object holding it out of the
    garbage collector's work. It creates the objects of the path that are
    missing (or null), and raises ``TypeError`` rather than replace a value
    of the document that is not an object (``{"_meta": "v1"}``): publishing
    such a document appends nothing.
    """

    uuid_path: ClassVar[tuple[str, ...]] = DEFAULT_UUID_PATH

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.uuid_path != DEFAULT_UUID_PATH and "set_uuid" not in vars(cls):
            cls.set_uuid = JsonDocument._set_uuid_at_path  # type: ignore[method-assign]
        if "get_uuid" in vars(cls):
            return  # its own get_uuid decides: no shortcut for the Sequencer
        if cls.uuid_path != DEFAULT_UUID_PATH:
            cls.get_uuid = JsonDocument._get_uuid_at_path  # type: ignore[method-assign]
        else:
            UUID_INT_OF[cls] = json_uuid_int

    def get_uuid(self) -> uuid.UUID:
        # The default path, spelled out: a reader calls this once per message.
        try:
            value = self[_META][_UUID_KEY]
        except (KeyError, TypeError, IndexError):
            return NIL_UUID
        if type(value) is str and len(value) == 36:
            # The canonical form, parsed inline (see _uuid_from_str).
            try:
                return uuid_from_int(int(value.replace("-", ""), 16))
            except ValueError:
                return NIL_UUID
        return _as_uuid(value)

    def _get_uuid_at_path(self) -> uuid.UUID:
        node: Any = self
        try:
            for k in self.uuid_path:
                node = node[k]
        except (KeyError, TypeError, IndexError):
            return NIL_UUID
        return _as_uuid(node)

    def set_uuid(self, u: uuid.UUID) -> None:
        # The default path, spelled out: the Publisher calls this per message
        # (the native one stores the string without making the UUID object).
        meta = self.get(_META)
        if not isinstance(meta, dict):
            if meta is not None:
                raise _not_an_object(self, _META, meta)
            meta = self[_META] = {}
        meta[_UUID_KEY] = uuid_text(u)

    def _set_uuid_at_path(self, u: uuid.UUID) -> None:
        node: dict[str, Any] = self
        *parents, leaf = self.uuid_path
        for n, k in enumerate(parents):
            child = node.get(k)
            if not isinstance(child, dict):
                if child is not None:
                    raise _not_an_object(self, "/".join(parents[: n + 1]), child)
                child = node[k] = {}
            node = child
        node[leaf] = uuid_text(u)

    def new_acknowledgement(self, journal: str) -> Self:
        return type(self)()


def _not_an_object(doc: JsonDocument, path: str, value: object) -> TypeError:
    # Replacing the value would lose it: the document is the caller's data.
    return TypeError(
        f"{type(doc).__name__} keeps its UUID at {'/'.join(doc.uuid_path)}, but its"
        f" {path!r} is a {type(value).__name__}, not an object: rename that key,"
        " or choose another uuid_path with document_type()"
    )


def document_type(uuid_path: str = "/".join(DEFAULT_UUID_PATH), name: str | None = None
                  ) -> type[JsonDocument]:
    """A :class:`JsonDocument` subclass keeping the UUID at ``uuid_path``."""
    parts = uuid_path_of(uuid_path)
    cls_name = name or "JsonDocument_" + "_".join(parts)
    return type(cls_name, (JsonDocument,), {"uuid_path": parts})


_ZERO: dict[Any, Any] = {str: "", int: 0, float: 0.0, bool: False, bytes: b"", "str": "",
                         "int": 0, "float": 0.0, "bool": False, "bytes": b""}


class DataclassMessage:
    """Mixin for a dataclass with a ``uuid: uuid.UUID`` field.

    ::

        @dataclass
        class PageView(DataclassMessage):
            page: str
            uuid: uuid.UUID = NIL_UUID

    The acknowledgement is an instance with every field at its default, or
    at the zero value of its type when it has none.
    """

    uuid: UUID

    def get_uuid(self) -> UUID:
        return _as_uuid(getattr(self, "uuid", NIL_UUID))

    def set_uuid(self, u: UUID) -> None:
        self.uuid = u

    def new_acknowledgement(self, journal: str) -> Self:
        cls = type(self)
        obj = cls.__new__(cls)
        for f in dataclasses.fields(cast(Any, cls)):
            if f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = _ZERO.get(f.type)
            object.__setattr__(obj, f.name, value)
        obj.set_uuid(NIL_UUID)
        return obj


class CSVRecord(list[str]):
    """A CSV record whose first field is the message's UUID."""

    def get_uuid(self) -> uuid.UUID:
        return _as_uuid(self[0]) if self else NIL_UUID

    def _uuid_int(self) -> int:
        return _int_of(self[0]) if self else 0

    def set_uuid(self, u: uuid.UUID) -> None:
        if self:
            self[0] = uuid_text(u)
        else:
            self.append(uuid_text(u))

    def new_acknowledgement(self, journal: str) -> CSVRecord:
        # As wide as this record (Gazette's CSVRecord does the same): a CSV
        # reader such as Go's requires every record to have as many fields
        # as the first.
        return CSVRecord([""] * max(1, len(self)))

    def marshal_csv(self) -> list[str]:
        return list(self)

    def unmarshal_csv(self, fields: list[str]) -> None:
        # A record whose first field is no UUID is a corrupt frame like any
        # other: a FrameDecodeError (also a ValueError), which readers with
        # skip_corrupt skip and count.
        if not fields:
            raise FrameDecodeError("a CSVRecord needs at least the UUID field")
        try:
            uuid.UUID(fields[0])
        except ValueError:
            shown = fields[0] if len(fields[0]) <= 40 else fields[0][:40] + "..."
            raise FrameDecodeError(f"first field of a CSVRecord is not a UUID: {shown!r}") from None
        self[:] = fields


class ProtoMessage:
    """A protobuf message (``.pb``) with its UUID in one of its fields.

    Made by :func:`proto_message_type`; the fixed-header protobuf framing
    calls ``SerializeToString`` and ``ParseFromString``, which go to ``.pb``.
    """

    __slots__ = ("pb",)
    pb_class: ClassVar[Any]
    uuid_field: ClassVar[str]
    uuid_as_bytes: ClassVar[bool]

    def __init__(self, pb: Any = None, **fields: Any) -> None:
        self.pb = self.pb_class(**fields) if pb is None else pb

    def get_uuid(self) -> uuid.UUID:
        return _as_uuid(getattr(self.pb, self.uuid_field))

    def _uuid_int(self) -> int:
        value = getattr(self.pb, self.uuid_field)
        if type(value) is bytes:
            return int.from_bytes(value, "big") if len(value) == 16 else 0
        return _int_of(value)

    def set_uuid(self, u: uuid.UUID) -> None:
        setattr(self.pb, self.uuid_field, u.bytes if self.uuid_as_bytes else uuid_text(u))

    def new_acknowledgement(self, journal: str) -> Self:
        return type(self)()

    def SerializeToString(self, **kwargs: Any) -> bytes:  # noqa: N802 -- protobuf's name
        return cast(bytes, self.pb.SerializeToString(**kwargs))

    def ParseFromString(self, data: bytes) -> int:  # noqa: N802 -- protobuf's name
        self.pb.Clear()
        return cast(int, self.pb.ParseFromString(data))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProtoMessage) and self.pb == other.pb

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.pb!r})"


def proto_message_type(pb_class: Any, uuid_field: str = "uuid") -> type[ProtoMessage]:
    """A :class:`ProtoMessage` type for ``pb_class``, whose ``uuid_field`` is a
    ``bytes`` (16 raw bytes) or ``string`` (canonical form) field."""
    descriptor: Any = getattr(pb_class, "DESCRIPTOR", None)
    if not isinstance(pb_class, type) or getattr(descriptor, "fields_by_name", None) is None:
        raise TypeError(f"{pb_class!r} is not a generated protobuf message class")
    fd = descriptor.fields_by_name.get(uuid_field)
    if fd is None:
        raise ValueError(f"{descriptor.full_name} has no field {uuid_field!r}")
    if fd.type not in (fd.TYPE_BYTES, fd.TYPE_STRING):
        raise ValueError(f"{descriptor.full_name}.{uuid_field} must be bytes or string")
    cls = type(
        descriptor.name,
        (ProtoMessage,),
        {
            "__slots__": (),
            "pb_class": pb_class,
            "uuid_field": uuid_field,
            "uuid_as_bytes": fd.type == fd.TYPE_BYTES,
        },
    )
    UUID_INT_OF[cls] = ProtoMessage._uuid_int
    return cls


UUID_INT_OF[JsonDocument] = json_uuid_int
UUID_INT_OF[CSVRecord] = CSVRecord._uuid_int
