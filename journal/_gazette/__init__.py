"""``GazetteClient``: journals on a Gazette broker cluster.

One module per concern: ``wire`` converts between this package's values and
Gazette's protobuf messages (``broker_pb2``, generated from
``proto/broker.proto``); ``brokers`` owns the gRPC channels, the routes of
journals and the retry policy; ``appender`` sends batches of appends as
Append RPCs; ``reader`` streams Read RPCs (or persisted fragments, read
directly) as a ``JournalReader``; ``client`` is the ``JournalStore``.
"""
