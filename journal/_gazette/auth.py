"""Authorizations for a cluster whose brokers check them (``--auth-keys``).

Gazette's ``auth.KeyedAuth``: every request carries an ``authorization:
Bearer <JWT>`` header, a token signed with HS256 by the first of the
cluster's pre-shared keys, whose claims say what it may do::

    {"cap": <capability bits>,                    # LIST 2, APPLY 4, READ 8, APPEND 16
     "sel": {"include": {"labels": [...]},        # the journals it may touch
             "exclude": {"labels": [...]}},
     "iat": <issued at>, "exp": <expires at>}     # seconds since the epoch

The claims of each RPC are those of Gazette's ``AuthJournalClient``
(``broker/protocol/auth.go``): List reads with the request's selector,
Apply with none (every journal), Read, Append and ListFragments with
``name=<journal>``. A broker ends a request when its token expires: a
blocking read that lasts longer is opened again with a new token.
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
import warnings
from typing import Any, Final

import jwt
from jwt.warnings import InsecureKeyLengthWarning

from . import broker_pb2 as pb

CAP_LIST: Final = 1 << 1
CAP_APPLY: Final = 1 << 2
CAP_READ: Final = 1 << 3
CAP_APPEND: Final = 1 << 4

#: The base64 of a single zero byte: to a broker, "requests with no token
#: are let through"; never a key to sign with.
_ALLOW_MISSING: Final = "AA=="


def parse_keys(keys: str) -> list[bytes]:
    """The keys of ``--auth-keys``: base64, separated by commas or spaces."""
    out = []
    for i, text in enumerate(keys.replace(",", " ").split()):
        if text == _ALLOW_MISSING:
            continue
        try:
            out.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"auth_keys: the key at index {i} is not base64: {exc}") from None
    if not out:
        raise ValueError(
            "auth_keys: give at least one base64 key (as the brokers' --broker.auth-keys)")
    return out


def _labels(labels: Any) -> dict[str, Any]:
    """A LabelSet as Go's JSON encoding of it."""
    out = []
    for label in labels.labels:
        item: dict[str, Any] = {"name": label.name, "value": label.value}
        if label.prefix:
            item["prefix"] = True
        out.append(item)
    return {"labels": out or None}


def selector_claim(selector: pb.LabelSelector | None) -> dict[str, Any]:
    selector = selector or pb.LabelSelector()
    return {"include": _labels(selector.include), "exclude": _labels(selector.exclude)}


def journal_selector(journal: str) -> pb.LabelSelector:
    return pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="name", value=journal)]))


class KeyedAuth:
    """Signs each request's authorization with the first of ``keys``.

    Tokens live ``ttl`` seconds and are reused for half of that; Apply's
    live at most a minute, as Gazette's.
    """

    def __init__(self, keys: str, *, ttl: float = 3600.0) -> None:
        if not ttl > 0:
            raise ValueError(f"the authorization's lifetime must be positive ({ttl})")
        self._key = parse_keys(keys)[0]
        self.ttl = ttl
        self._lock = threading.Lock()
        self._cache: dict[tuple[int, bytes], tuple[float, tuple[tuple[str, str], ...]]] = {}

    def metadata(
        self, capability: int, selector: pb.LabelSelector | None = None
    ) -> tuple[tuple[str, str], ...]:
        """The gRPC metadata authorizing ``capability`` on ``selector``."""
        key = (capability, selector.SerializeToString(deterministic=True) if selector else b"")
        now = time.time()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > now:
                return cached[1]
        ttl = min(self.ttl, 60.0) if capability == CAP_APPLY else self.ttl
        claims = {
            "cap": capability,
            "sel": selector_claim(selector),
            "iat": int(now),
            "exp": int(now + ttl),
        }
        with warnings.catch_warnings():
            # The key is the cluster's, whatever its length: Gazette takes any.
            warnings.simplefilter("ignore", InsecureKeyLengthWarning)
            token = jwt.encode(claims, self._key, algorithm="HS256")
        md = (("authorization", f"Bearer {token}"),)
        with self._lock:
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = (now + ttl / 2, md)
        return md

    def expiry(self) -> float:
        """Seconds a token signed now is good for."""
        return self.ttl
