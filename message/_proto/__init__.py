"""Generated protobuf modules of the ``message`` package (from ``proto/``;
regenerate with ``python proto/generate.py``)."""
