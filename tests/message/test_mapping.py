"""Mapping routines: Gazette's routines_test.go, ported, plus mmh3 routing and caching.

The FNV-1a fixtures were computed with Gazette's Go ModuloMapping and
RendezvousMapping (the first two tables are those of routines_test.go).
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable, Sequence
from typing import Any

import mmh3
import pytest

import message
from journal import JournalSpec
from message import (
    EmptyPartitionsError,
    MessageError,
    modulo_mapping,
    random_mapping,
    rendezvous_mapping,
)
from message._mapping import py_modulo_mapping, py_rendezvous_mapping

NDJSON = "application/x-ndjson"
CSV = "text/csv"


def partitions(count: int, fmt: str = "a/topic/part-%03d") -> list[JournalSpec]:
    """Gazette's buildPartitionsFuncFixture."""
    return [JournalSpec(fmt % i, {"content-type": NDJSON}) for i in range(count)]


def by_text(msg: dict[str, str | bytes]) -> str | bytes:
    return msg["key"]


QUOTES = {
    "It always": (119, 21),
    "seems": (54, 179),
    "impossible": (308, 50),
    "until": (97, 13),
    "it is done.": (179, 337),
    "- Nelson Mandela": (437, 29),
    "Shall I compare": (84, 110),
    "thee to": (300, 395),
    "a summer's day?": (214, 192),
    "Thou art more": (135, 394),
    "lovely and more": (118, 344),
    "temperate - Shakespeare": (228, 75),
}

# Keys of the extended fixtures, as hex of their bytes (UTF-8 for text).
KEYS = [
    "497420616c77617973",  # "It always"
    "7365656d73",  # "seems"
    "696d706f737369626c65",  # "impossible"
    "756e74696c",  # "until"
    "697420697320646f6e652e",  # "it is done."
    "2d204e656c736f6e204d616e64656c61",  # "- Nelson Mandela"
    "",  # The empty key.
    "61",  # "a"
    "68c3a96c6c6f2077c3b6726c6420e29c93",  # "héllo wörld ✓"
    "ff00fe80",  # Not UTF-8.
    "73657373696f6e2d3432",  # "session-42"
    "757365722f31323334353637383930",  # "user/1234567890"
]

# Go's ModuloMapping index of each of KEYS, by partition count (it ignores names).
GO_MODULO = {
    1: "0 0 0 0 0 0 0 0 0 0 0 0",
    2: "1 0 0 1 0 1 1 0 1 0 0 0",
    3: "2 1 2 2 2 2 1 1 1 1 0 0",
    7: "3 0 3 3 3 0 2 5 0 3 4 1",
    10: "1 0 6 9 2 9 1 0 3 4 8 4",
    64: "61 44 24 15 2 57 5 44 25 20 20 30",
    443: "119 54 308 97 179 437 47 381 437 166 283 191",
    400: "61 140 376 319 322 249 261 220 73 4 68 174",
    500: "261 40 276 219 422 149 261 220 373 104 68 74",
}

# Go's RendezvousMapping index of each of KEYS, by (journal name format, count).
GO_RENDEZVOUS = {
    ("a/topic/part-%03d", 1): "0 0 0 0 0 0 0 0 0 0 0 0",
    ("a/topic/part-%03d", 2): "1 1 0 1 1 0 0 0 0 1 1 1",
    ("a/topic/part-%03d", 3): "1 1 0 1 2 0 0 0 0 1 2 1",
    ("a/topic/part-%03d", 7): "3 1 6 3 2 5 4 5 4 3 2 1",
    ("a/topic/part-%03d", 10): "9 8 9 3 9 9 4 9 9 9 8 8",
    ("a/topic/part-%03d", 64): "21 59 50 13 18 29 62 19 53 19 10 11",
    ("a/topic/part-%03d", 443): "21 179 50 13 337 29 410 336 350 334 140 11",
    ("a/topic/part-%03d", 400): "21 179 50 13 337 29 344 336 350 334 140 11",
    ("a/topic/part-%03d", 500): "21 179 50 13 337 29 410 336 350 334 140 11",
    ("x/part=%d", 1): "0 0 0 0 0 0 0 0 0 0 0 0",
    ("x/part=%d", 2): "0 1 1 0 1 1 1 1 0 0 1 1",
    ("x/part=%d", 3): "0 2 1 0 1 2 1 2 0 0 1 2",
    ("x/part=%d", 7): "0 2 5 0 1 6 5 6 4 0 1 2",
    ("x/part=%d", 10): "0 2 5 0 1 6 9 6 8 0 1 2",
    ("x/part=%d", 64): "26 40 51 14 1 50 19 60 50 0 17 16",
    ("x/part=%d", 443): "121 40 190 14 184 191 280 160 191 151 87 16",
    ("x/part=%d", 400): "121 40 190 14 184 191 280 160 191 151 87 16",
    ("x/part=%d", 500): "121 40 190 470 184 191 280 160 191 151 87 16",
}

# FNV-1a 32 of each of KEYS, from Go's hash/fnv.
GO_FNV1A = (
    1579115261, 752746540, 1172034776, 3132432719, 4245313922, 1149622649,
    2166136261, 3826002220, 1651438873, 4263195604, 2907850068, 3161948574,
)  # fmt: skip


def fnv1a(data: bytes) -> int:
    """32-bit FNV-1a, written out for the test."""
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def mmh3_u32(data: bytes) -> int:
    return mmh3.hash(data, 0, signed=False)


def expect_rendezvous(h: int, names: Sequence[str], hash_fn: object) -> int:
    """First index with the strictly largest h(key) ^ h(name)."""
    best, ind = -1, 0
    for i, name in enumerate(names):
        w = h ^ hash_fn(name.encode())  # type: ignore[operator]
        if w > best:
            best, ind = w, i
    return ind


def test_fnv1a_helper_matches_go() -> None:
    """The test's own FNV-1a agrees with Go's hash/fnv (so it may serve as an oracle)."""
    assert tuple(fnv1a(bytes.fromhex(k)) for k in KEYS) == GO_FNV1A


def test_random_mapping() -> None:
    """Gazette's TestRandomMapping: random journals of the partitions, with their content type."""
    parts = partitions(100)
    mapping = random_mapping(lambda: parts)
    results = set()
    for _ in range(101):
        journal, ct = mapping({"key": "foobar"})
        assert ct == NDJSON
        results.add(journal)
    # Probabilistic; the chance of failure is 1e-200.
    assert len(results) > 1
    assert results <= {p.name for p in parts}


def test_random_mapping_distribution() -> None:
    """random_mapping spreads messages evenly over the partitions."""
    parts = partitions(4)
    mapping = random_mapping(lambda: parts)
    counts = collections.Counter(mapping(None)[0] for _ in range(4000))
    assert set(counts) == {p.name for p in parts}
    # Each count is Binomial(4000, 1/4): mean 1000, sd 27; 200 away is 7 sd.
    assert all(800 < c < 1200 for c in counts.values()), counts


def test_modulo_mapping_regression_fixtures() -> None:
    """Gazette's TestModuloMappingRegressionFixtures with hash='fnv1a'."""
    parts = partitions(443)  # Prime number.
    mapping = modulo_mapping(by_text, lambda: parts, hash="fnv1a")
    for text, (expect, _) in QUOTES.items():
        journal, ct = mapping({"key": text})
        assert ct == NDJSON
        assert f"{text}-{journal}" == f"{text}-a/topic/part-{expect:03d}"


@pytest.mark.parametrize("count", [400, 500])
def test_rendezvous_mapping_regression_fixtures(count: int) -> None:
    """Gazette's TestRendezvousMappingRegressionFixtures: stable across 400 and 500 partitions."""
    parts = partitions(count)
    mapping = rendezvous_mapping(by_text, lambda: parts, hash="fnv1a")
    for text, (_, expect) in QUOTES.items():
        journal, ct = mapping({"key": text})
        assert ct == NDJSON
        assert f"{text}-{journal}" == f"{text}-a/topic/part-{expect:03d}"


@pytest.mark.parametrize(("fmt", "count"), list(GO_RENDEZVOUS))
def test_fnv1a_matches_go(fmt: str, count: int) -> None:
    """hash='fnv1a' reproduces Go's partition indexes, for str keys and for bytes keys."""
    parts = partitions(count, fmt)
    mod = modulo_mapping(by_text, lambda: parts, hash="fnv1a")
    ren = rendezvous_mapping(by_text, lambda: parts, hash="fnv1a")
    modulo = [int(i) for i in GO_MODULO[count].split()]
    rendezvous = [int(i) for i in GO_RENDEZVOUS[fmt, count].split()]
    for hex_key, m, r in zip(KEYS, modulo, rendezvous, strict=True):
        raw = bytes.fromhex(hex_key)
        keys: list[str | bytes] = [raw]
        if raw != b"\xff\x00\xfe\x80":
            keys.append(raw.decode())  # str keys are UTF-8 encoded.
        for k in keys:
            assert mod({"key": k}) == (fmt % m, NDJSON)
            assert ren({"key": k}) == (fmt % r, NDJSON)


@pytest.mark.parametrize("count", [1, 2, 3, 7, 64, 443])
def test_mmh3_routing(count: int) -> None:
    """hash='mmh3' (the default) routes by 32-bit unsigned MurmurHash3, seed 0."""
    parts = partitions(count)
    names = [p.name for p in parts]
    mapping_fns = {
        "modulo": modulo_mapping(by_text, lambda: parts, hash="mmh3"),
        "modulo default": modulo_mapping(by_text, lambda: parts),
        "rendezvous": rendezvous_mapping(by_text, lambda: parts, hash="mmh3"),
        "rendezvous default": rendezvous_mapping(by_text, lambda: parts),
    }
    for hex_key in [*KEYS, "00", "0000", "c3a9"]:
        raw = bytes.fromhex(hex_key)
        h = mmh3_u32(raw)
        expect_mod = names[h % count]
        expect_ren = names[expect_rendezvous(h, names, mmh3_u32)]
        for label, fn in mapping_fns.items():
            want = expect_mod if label.startswith("modulo") else expect_ren
            assert fn({"key": raw}) == (want, NDJSON), (label, hex_key)


def test_mmh3_and_fnv1a_differ() -> None:
    """The two hashes route differently (so the default is really mmh3, not fnv1a)."""
    parts = partitions(443)
    by_mmh3 = modulo_mapping(by_text, lambda: parts)
    by_fnv = modulo_mapping(by_text, lambda: parts, hash="fnv1a")
    keys = [f"key-{i}" for i in range(50)]
    assert [by_mmh3({"key": k}) for k in keys] != [by_fnv({"key": k}) for k in keys]


def test_str_and_bytes_keys_agree() -> None:
    """A str key routes as its UTF-8 encoding."""
    parts = partitions(97)
    for make in (modulo_mapping, rendezvous_mapping):
        for hash_name in ("mmh3", "fnv1a"):
            mapping = make(by_text, lambda: parts, hash=hash_name)
            for text in ("", "a", "héllo wörld ✓", "日本語のキー", "emoji 🎉"):
                assert mapping({"key": text}) == mapping({"key": text.encode("utf-8")})


def test_rendezvous_ties_pick_the_first_index() -> None:
    """Among equal weights (a journal listed twice) rendezvous picks the first index."""
    twins = [
        JournalSpec("t/x", {"content-type": CSV}),
        JournalSpec("t/x", {"content-type": NDJSON}),
    ]
    for hash_name in ("mmh3", "fnv1a"):
        mapping = rendezvous_mapping(by_text, lambda: twins, hash=hash_name)
        for k in ("a", "b", "t/x", ""):
            assert mapping({"key": k}) == ("t/x", CSV)
    # The key equal to the only name: every weight is 0, the first index wins.
    assert rendezvous_mapping(by_text, lambda: twins[1:], hash="fnv1a")({"key": "t/x"}) == (
        "t/x",
        NDJSON,
    )


def test_content_type_comes_from_the_chosen_journal() -> None:
    """The mapping returns the content-type label of the journal it picked."""
    parts = [
        JournalSpec(f"mixed/{i}", {"content-type": CSV if i % 2 else NDJSON}) for i in range(10)
    ]
    for make in (modulo_mapping, rendezvous_mapping):
        mapping = make(by_text, lambda: parts, hash="fnv1a")
        for i in range(40):
            name, ct = mapping({"key": f"k{i}"})
            assert ct == (CSV if int(name.split("/")[1]) % 2 else NDJSON)
    name, ct = random_mapping(lambda: parts)(None)
    assert ct == (CSV if int(name.split("/")[1]) % 2 else NDJSON)


def test_partitions_as_tuple() -> None:
    """partitions() may return any sequence, e.g. a tuple."""
    parts = tuple(partitions(443))
    mapping = modulo_mapping(by_text, lambda: parts, hash="fnv1a")
    assert mapping({"key": "It always"}) == ("a/topic/part-119", NDJSON)


def test_rendezvous_recomputes_for_new_partitions() -> None:
    """A new partitions() result is hashed afresh; the identical one keeps mapping correctly."""
    first, second = partitions(400), partitions(500, "x/part=%d")
    current = [first]
    calls = [0]

    def parts() -> list[JournalSpec]:
        calls[0] += 1
        return current[0]

    mapping = rendezvous_mapping(by_text, parts, hash="fnv1a")
    for _ in range(3):  # The identical object, again and again.
        assert mapping({"key": "It always"}) == ("a/topic/part-021", NDJSON)
        assert mapping({"key": "seems"}) == ("a/topic/part-179", NDJSON)
    assert calls[0] == 6  # partitions() is asked on every call.

    current[0] = second  # A new object: no stale hashes.
    assert mapping({"key": "It always"}) == ("x/part=121", NDJSON)
    assert mapping({"key": "until"}) == ("x/part=470", NDJSON)

    # A new object equal in content to an earlier one maps as it did.
    current[0] = partitions(400)
    assert mapping({"key": "It always"}) == ("a/topic/part-021", NDJSON)

    # Shrinking to fewer journals than cached hashes.
    current[0] = partitions(3)
    assert mapping({"key": "It always"}) == ("a/topic/part-001", NDJSON)
    current[0] = partitions(1)
    assert mapping({"key": "It always"}) == ("a/topic/part-000", NDJSON)


def test_mappings_follow_a_new_partitions_object() -> None:
    """Only a partitions() result identical by ``is`` to the last one may reuse
    cached per-journal hashes: after renamed or fewer partitions, modulo and
    rendezvous both map as a fresh mapping over the new ones."""
    first = partitions(7)
    renamed = partitions(7, "other/part-%03d")
    keys = [f"key-{i}" for i in range(20)]
    for make in (modulo_mapping, rendezvous_mapping):
        for hash_name in ("mmh3", "fnv1a"):
            current = [first]
            mapping = make(by_text, lambda c=current: c[0], hash=hash_name)
            for parts in (first, renamed, renamed[:3], first):
                current[0] = parts
                fresh = make(by_text, lambda p=parts: p, hash=hash_name)
                for k in keys:
                    assert mapping({"key": k}) == fresh({"key": k}), (make, hash_name, k)
                assert {mapping({"key": k})[0] for k in keys} <= {p.name for p in parts}


def test_mappings_see_a_list_grown_or_shrunk_in_place() -> None:
    """A partitions() result that is the same list, appended to or cut, maps
    as a fresh mapping over what it now holds."""
    keys = [f"key-{i}" for i in range(50)]
    for make in (modulo_mapping, rendezvous_mapping):
        parts = partitions(2)
        mapping = make(by_text, lambda p=parts: p)
        for change in ("append", "pop first", "pop last"):
            if change == "append":
                parts.append(JournalSpec("a/topic/new", {"content-type": CSV}))
            else:
                parts.pop(0 if change == "pop first" else -1)
            fresh = make(by_text, lambda p=list(parts): p)
            for k in keys:
                assert mapping({"key": k}) == fresh({"key": k}), (make, k)
            assert {mapping({"key": k})[0] for k in keys} <= {p.name for p in parts}


def test_rendezvous_mapping_from_mmh3_fresh_vs_cached() -> None:
    """With the default hash, repeated calls on the same partitions agree with a fresh mapping."""
    parts = partitions(64)
    cached = rendezvous_mapping(by_text, lambda: parts)
    for i in range(200):
        k = f"session-{i}"
        fresh = rendezvous_mapping(by_text, lambda: parts)
        assert cached({"key": k}) == fresh({"key": k})


@pytest.mark.parametrize("empty", [[], ()])
def test_empty_partitions(empty: Sequence[JournalSpec]) -> None:
    """No partitions: EmptyPartitionsError, a MessageError, from every mapping."""
    assert issubclass(EmptyPartitionsError, MessageError)
    for mapping in (
        modulo_mapping(by_text, lambda: empty),
        modulo_mapping(by_text, lambda: empty, hash="fnv1a"),
        rendezvous_mapping(by_text, lambda: empty),
        rendezvous_mapping(by_text, lambda: empty, hash="fnv1a"),
        random_mapping(lambda: empty),
    ):
        with pytest.raises(EmptyPartitionsError):
            mapping({"key": "k"})


def test_empty_then_non_empty_partitions() -> None:
    """A rendezvous mapping recovers once partitions appear."""
    current: list[list[JournalSpec]] = [[]]
    mapping = rendezvous_mapping(by_text, lambda: current[0], hash="fnv1a")
    with pytest.raises(EmptyPartitionsError):
        mapping({"key": "It always"})
    current[0] = partitions(400)
    assert mapping({"key": "It always"}) == ("a/topic/part-021", NDJSON)
    current[0] = []
    with pytest.raises(EmptyPartitionsError):
        mapping({"key": "It always"})


def test_unknown_hash_is_rejected() -> None:
    """An unknown hash name is bad input: ValueError (or a MessageError), not silence."""
    parts = partitions(3)
    with pytest.raises((ValueError, MessageError)):
        modulo_mapping(by_text, lambda: parts, hash="sha1")({"key": "k"})
    with pytest.raises((ValueError, MessageError)):
        rendezvous_mapping(by_text, lambda: parts, hash="crc32")({"key": "k"})


@pytest.mark.skipif(message.IMPLEMENTATION == "python",
                    reason="the Python implementation runs: its mappings are the definitions")
@pytest.mark.parametrize("hash_name", ["mmh3", "fnv1a"])
@pytest.mark.parametrize(("make", "definition"), [(modulo_mapping, py_modulo_mapping),
                                                  (rendezvous_mapping, py_rendezvous_mapping)])
def test_native_mappings_map_as_their_python_definitions(
    make: Callable[..., Any], definition: Callable[..., Any], hash_name: str
) -> None:
    """The native core's mapping and the closure that defines it agree on
    every key (str, non-ASCII str, bytes, bytearray, memoryview), while the
    partitions change underneath both: a new object, one grown or cut in
    place, another naming scheme."""
    rng = random.Random(hash_name + make.__name__)
    current = [partitions(5)]
    native = make(by_text, lambda: current[0], hash=hash_name)
    assert type(native).__module__ == "message._native"
    ref = definition(by_text, lambda: current[0], hash=hash_name)
    for step in range(4000):
        roll = rng.random()
        if roll < 0.005:
            current[0] = partitions(rng.randint(1, 70), rng.choice(["a/p-%03d", "b/q=%d"]))
        elif roll < 0.01:
            current[0].append(JournalSpec(f"c/extra-{step}", {"content-type": CSV}))
        elif roll < 0.015 and len(current[0]) > 1:
            current[0].pop(rng.randrange(len(current[0])))
        text = f"{rng.choice(['s', 'é', '日本', ''])}{rng.randint(0, 10**rng.randint(0, 12))}"
        key = rng.choice([text, text.encode(), bytearray(text.encode()),
                          memoryview(text.encode())])
        assert native({"key": key}) == ref({"key": key}), (step, key)


def _session(msg: dict[str, str]) -> str:
    return msg["key"]


@pytest.mark.parametrize("hash_name", ["mmh3", "fnv1a"])
@pytest.mark.parametrize("make", [modulo_mapping, rendezvous_mapping])
def test_a_mapping_travels_by_pickle(make: Callable[..., Any], hash_name: str) -> None:
    """A mapping pickled as Spark pickles functions (cloudpickle), with the
    functions it was made from, maps as the original."""
    cloudpickle = pytest.importorskip("pyspark.cloudpickle", reason="needs the spark extra")
    parts = partitions(9)
    mapping = make(_session, lambda: parts, hash=hash_name)
    again = cloudpickle.loads(cloudpickle.dumps(mapping))
    for i in range(200):
        assert again({"key": f"k{i}"}) == mapping({"key": f"k{i}"})


def test_a_mapping_passes_on_what_its_functions_raise() -> None:
    """What key() or partitions() raises, the mapping raises; a key that is
    neither text nor bytes-like is a TypeError; the mapping works on after."""
    parts = partitions(4)
    state = {"fail": False}

    def flaky() -> list[JournalSpec]:
        if state["fail"]:
            raise OSError("listing failed")
        return parts

    for make in (modulo_mapping, rendezvous_mapping):
        mapping = make(by_text, flaky)
        before = mapping({"key": "k"})
        with pytest.raises(KeyError):
            mapping({})
        with pytest.raises(TypeError):
            mapping({"key": 1.5})
        state["fail"] = True
        with pytest.raises(OSError, match="listing failed"):
            mapping({"key": "k"})
        state["fail"] = False
        assert mapping({"key": "k"}) == before
