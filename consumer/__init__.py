"""Exactly-once processing: read, change state, publish, commit all three together.

A consumer application reads committed messages from source journals,
changes the state in its store and publishes messages because of them. The
runtime commits each transaction's reading (offsets and producer states),
the store's changes and the messages published in one step — the store's
own commit — and only then appends the ACKs that make the output visible:
through crashes, restarts and zombie copies of itself, each transaction
commits exactly once. It is Gazette's consumer transaction lifecycle (see
docs/consumer.md).

**Write an application**: a store per shard, a message type, and what to
do with each message::

    >>> import tempfile
    >>> from journal import LocalJournalStore
    >>> from message import JsonDocument, modulo_mapping
    >>> from consumer import Application, JSONFileStore, Runner, ShardSpec
    >>> work = tempfile.mkdtemp()
    >>> journals = LocalJournalStore(f"{work}/journals")
    >>> ndjson = {"content-type": "application/x-ndjson"}
    >>> words = journals.create("words", ndjson)
    >>> totals = journals.create("totals", ndjson)
    >>> to_totals = modulo_mapping(lambda doc: doc["word"], lambda: [totals])
    >>> class WordCount(Application):
    ...     def new_store(self, shard):
    ...         return JSONFileStore(f"{work}/state/{shard.id}")
    ...     def new_message(self, spec):
    ...         return JsonDocument()
    ...     def consume_message(self, shard, store, envelope, publisher):
    ...         word = envelope.message["word"]
    ...         store.state[word] = n = store.state.get(word, 0) + 1
    ...         publisher.publish_uncommitted(to_totals, JsonDocument(word=word, n=n))

**Publish** some input (committed at once, here)::

    >>> from message import Publisher
    >>> to_words = modulo_mapping(lambda doc: doc["word"], lambda: [words])
    >>> pub = Publisher(journals)
    >>> for w in "the cat saw the dog".split():
    ...     _ = pub.publish_committed(to_words, JsonDocument(word=w))
    >>> journals.flush()  # every append durable (and readable)

**Run** the shard until it has read everything and committed it; a
restart resumes from the committed checkpoint, and repeats nothing::

    >>> spec = ShardSpec("word-count", sources=["words"])
    >>> with Runner(journals, WordCount(), [spec]) as runner:
    ...     runner.run_until_idle(timeout=30)
    >>> pub.publish_committed(to_words, JsonDocument(word="cat")).result().journal
    'words'
    >>> with Runner(journals, WordCount(), [spec]) as runner:   # a restart
    ...     runner.run_until_idle(timeout=30)

**Read** the output committed (the ACKs that commit it are left out)::

    >>> from message import ReadCommittedIter
    >>> with ReadCommittedIter(journals, "totals", lambda spec: JsonDocument()) as it:
    ...     [(d["word"], d["n"]) for d in (env.message for env in it) if "word" in d]
    [('the', 1), ('cat', 1), ('saw', 1), ('the', 2), ('dog', 1), ('cat', 2)]
    >>> journals.close()

Stores: :class:`JSONFileStore` (a dict, written whole at each commit),
:class:`SQLiteStore` and :class:`PostgresStore` (the application's SQL
statements and the checkpoint in one SQL transaction). Any object with the
:class:`Store` methods is a store; ``consumer.testing.check_store`` holds it
to the contract.
"""

from typing import TYPE_CHECKING, Any

from ._errors import ConsumerError as ConsumerError
from ._errors import EtcdError as EtcdError
from ._errors import FencedError as FencedError
from ._errors import StoreError as StoreError
from ._interfaces import Application as Application
from ._interfaces import PreparedCommit as PreparedCommit
from ._interfaces import Store as Store
from ._json_store import JSONFileStore as JSONFileStore
from ._runner import Runner as Runner
from ._shard import Shard as Shard
from ._shard import ShardSpec as ShardSpec
from ._sql_store import PostgresStore as PostgresStore
from ._sql_store import SQLiteStore as SQLiteStore
from ._sql_store import SQLStore as SQLStore

# Members and their group in etcd speak gRPC to etcd: loaded when first
# named, so that an application of one process does not load gRPC.
_LAZY = {
    "EtcdClient": "._etcd",
    "DEFAULT_ETCD_PREFIX": "._group", "Claim": "._group", "GroupView": "._group",
    "MemberInfo": "._group", "ShardGroup": "._group", "SpecFileError": "._group",
    "read_spec_file": "._group",
    "DEFAULT_LEASE_TTL": "._member", "MIN_LEASE_TTL": "._member", "Member": "._member",
    "StoreElsewhereError": "._member",
}

if TYPE_CHECKING:
    from ._etcd import EtcdClient as EtcdClient
    from ._group import DEFAULT_ETCD_PREFIX as DEFAULT_ETCD_PREFIX
    from ._group import Claim as Claim
    from ._group import GroupView as GroupView
    from ._group import MemberInfo as MemberInfo
    from ._group import ShardGroup as ShardGroup
    from ._group import SpecFileError as SpecFileError
    from ._group import read_spec_file as read_spec_file
    from ._member import DEFAULT_LEASE_TTL as DEFAULT_LEASE_TTL
    from ._member import MIN_LEASE_TTL as MIN_LEASE_TTL
    from ._member import Member as Member
    from ._member import StoreElsewhereError as StoreElsewhereError
else:
    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'consumer' has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(_LAZY))

__all__ = [
    # what a consumer is made of
    "ShardSpec", "Shard", "Application", "Store", "PreparedCommit",
    # running it: in one process, or as members of a group kept in etcd
    "Runner", "Member", "ShardGroup", "EtcdClient", "read_spec_file", "DEFAULT_ETCD_PREFIX",
    "DEFAULT_LEASE_TTL", "MIN_LEASE_TTL", "GroupView", "MemberInfo", "Claim",
    # stores
    "JSONFileStore", "SQLiteStore", "PostgresStore", "SQLStore",
    # errors
    "ConsumerError", "FencedError", "StoreError", "EtcdError", "StoreElsewhereError",
    "SpecFileError",
]
