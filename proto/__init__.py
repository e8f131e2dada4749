"""Protocol buffer sources and their generated Python modules.

Regenerate with ``python -m proto.generate`` after editing a ``.proto`` file;
``tests/test_proto.py`` fails when the generated code is stale."""
