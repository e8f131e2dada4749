"""The embedded store, ``LocalJournalStore``: journals as files on local disk.

- ``store``: the store (create, list, append, read, retention, repair);
- ``writer``: one journal's append queue writing batches (write, fsync,
  commit record);
- ``reader``: ``LocalJournalReader``, over fragments and the open one;
- ``fragment``: file names and the commit record (no I/O);
- ``files``: the journal directory's I/O (specs, locks, records, recovery,
  sealing, quarantine);
- ``sums``: each committed batch's CRC-32C;
- ``check``: ``fsck``'s checks and repairs;
- ``watch``: wake-ups for following readers (inotify);
- ``transient``: emits to live followers (shared-memory rings).

See docs/journal-store.md.
"""
