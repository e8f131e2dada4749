"""CSV journals read as Go's reader reads them: every record through
``new_unmarshal_func``, which requires each to be as wide as the first."""

from __future__ import annotations

from typing import Any

from framing import CONTENT_TYPE_CSV, framing_by_content_type
from message import CSVRecord


def strict_csv_records(reader: Any) -> list[CSVRecord]:
    """Every record of ``reader`` (a journal reader), decoded one by one."""
    unmarshal = framing_by_content_type(CONTENT_TYPE_CSV).new_unmarshal_func(reader)
    records = []
    while True:
        record = CSVRecord()
        try:
            unmarshal(record)
        except EOFError:
            return records
        records.append(record)
