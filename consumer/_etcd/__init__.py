"""A small etcd v3 client over gRPC: what ``consumer.Member`` and ``exactly
shards`` need of etcd (keys, transactions, leases), no more.

The stubs are generated from ``proto/etcd.proto``, a subset of etcd's own
``rpc.proto``, the way ``proto/`` generates Gazette's: grpcio and protobuf
are dependencies already. Of the etcd clients on PyPI, ``etcd3`` is no
longer kept up (its generated code does not load with protobuf 4 and
later), and ``aetcd`` is asyncio-only, where a member runs on threads.
"""

from .client import EtcdClient as EtcdClient
from .client import KeyValue as KeyValue
from .client import Watch as Watch
from .client import prefix_end as prefix_end

__all__ = ["EtcdClient", "KeyValue", "Watch", "prefix_end"]
