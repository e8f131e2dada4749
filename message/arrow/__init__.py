"""Committed reads as Arrow: the committed messages of journals as ``pyarrow.RecordBatch``es.

:class:`ReadCommittedArrow` reads what :class:`message.ReadCommittedIter`
reads — duplicates dropped, transactions held until their ACK, roll-backs
dropped — and hands it over as columns, for pyarrow, pandas, polars, DuckDB
or Spark, with no Python object per message::

    >>> import tempfile
    >>> from journal import LocalJournalStore
    >>> from message import JsonDocument, Publisher
    >>> from message.arrow import ReadCommittedArrow
    >>> store = LocalJournalStore(tempfile.mkdtemp())
    >>> spec = store.create("clicks", {"content-type": "application/x-ndjson"})
    >>> pub = Publisher(store)
    >>> to_clicks = lambda doc: (spec.name, spec.content_type)
    >>> for page in ["/", "/cart"]:
    ...     _ = pub.publish_committed(to_clicks, JsonDocument(page=page)).result()
    >>> reader = ReadCommittedArrow(store, "clicks")
    >>> table = reader.read_all()
    >>> table.column("page").to_pylist()
    ['/', '/cart']
    >>> table.column_names[:4]
    ['journal', 'begin', 'end', 'uuid']
    >>> saved = reader.checkpoint()           # resume here: nothing lost or repeated
    >>> store.close()

Each row has the envelope columns (:data:`ENVELOPE_FIELDS`: ``journal``,
``begin``, ``end``, ``uuid``, ``producer``, ``clock``, ``flags``,
``publish_time``, ``commit_offset``) and the message's content as columns:
NDJSON fields by a schema, or inferred from the journal's first MiB; CSV
fields by position after the UUID; fixed protobuf fields by name. A field
named like an envelope column is the column ``content_<name>``
(:func:`content_column_names`), as in the Spark source. ACK_TXN
messages (control records) are left out unless ``include_acks=True``.

How: a journal is read in windows of about ``batch_bytes`` whole frames.
An NDJSON window is parsed by Arrow's C++ JSON reader in one call; the UUIDs
become two uint64 columns, read from the lines' bytes where each begins with
its UUID as the framing writes it (``message.columns.prefixed_uuids``), else
from the parsed column (``message.columns.parse_uuid_strings``); which rows
commit, and in which order, is decided over columns
(``message/_columns_sequencer.py``: the Sequencer's rules, in numpy, or in one native
pass); the committed rows are taken from the parsed table in commit order. Other
framings, and an NDJSON window Arrow will not parse (a corrupt frame, a
value of another type), are decoded frame by frame, with the framing's own
errors. Memory is bounded by ``batch_bytes`` (and by the largest
transaction open across windows), not by the journal's size.

Needs pyarrow and numpy: ``pip install 'exactly[arrow]'``. ``import message``
does not import this module.
"""

from ._content import (
    BATCH_BYTES as BATCH_BYTES,
)
from ._content import (
    ENVELOPE_FIELDS as ENVELOPE_FIELDS,
)
from ._content import (
    ENVELOPE_NAMES as ENVELOPE_NAMES,
)
from ._content import (
    INFER_BYTES as INFER_BYTES,
)
from ._content import (
    PROTO_TYPES as PROTO_TYPES,
)
from ._content import (
    ArrowContent as ArrowContent,
)
from ._content import (
    content_column_names as content_column_names,
)
from ._content import (
    infer_content_fields as infer_content_fields,
)
from ._content import (
    infer_json_fields as infer_json_fields,
)
from ._content import (
    load_proto_class as load_proto_class,
)
from ._content import (
    to_arrow as to_arrow,
)
from ._encode import json_values as json_values
from ._encode import ndjson_frames as ndjson_frames
from ._readers import ReadCommittedArrow as ReadCommittedArrow
from ._readers import ReadUncommittedArrow as ReadUncommittedArrow
from ._windows import bucket_of as bucket_of
from ._windows import envelope_columns as envelope_columns

__all__ = [
    "ReadCommittedArrow", "ReadUncommittedArrow", "ArrowContent", "ENVELOPE_FIELDS",
    "ENVELOPE_NAMES", "BATCH_BYTES", "PROTO_TYPES", "envelope_columns", "infer_json_fields",
    "infer_content_fields",
    "load_proto_class", "to_arrow", "bucket_of", "ndjson_frames", "json_values",
    "content_column_names",
]

