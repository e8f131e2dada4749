"""Shared fixtures."""

from __future__ import annotations

import importlib.util
import os
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn, cast

import pytest

if TYPE_CHECKING:
    from exactly.localcluster import Binaries, GazetteCluster

# Without the spark extra (pyspark, pyarrow), the Spark tests are skipped with
# this reason, and the modules that import the pipeline at their top are not
# collected at all (importing them would fail).
def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ImportError:
        return True


SPARK_MISSING: Final = _missing("pyspark") or _missing("pyarrow")
SPARK_REASON: Final = (
    "Spark tests need the spark extra (pip install '.[spark]'): pyspark or pyarrow is missing"
)
_IMPORT_THE_PIPELINE: Final = frozenset({
    "test_pipeline_demo.py", "test_pipeline_scan.py", "test_spark_gazette.py",
    "test_spark_source.py",
})
_not_collected: set[str] = set()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if SPARK_MISSING and collection_path.name in _IMPORT_THE_PIPELINE:
        _not_collected.add(collection_path.name)
        return True
    return None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _not_collected:
        terminalreporter.write_line(
            f"{len(_not_collected)} Spark test modules not collected: {SPARK_REASON}"
        )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole run (starting one takes seconds),
    with the ``journal`` data source registered. ``local[2,4]``: two cores,
    and a failed task is retried up to three times, which the exactly-once
    write tests rely on."""
    pytest.importorskip("pyspark")
    import pipeline

    session = pipeline.local_session("local[2,4]", conf={"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@pytest.fixture(params=["native", "python"])
def read_loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with the read iterators' native loops and Sequencer
    (message/_native.c), then with the Python ones: both must behave the same."""
    import message._reader as reader

    if request.param == "python":
        monkeypatch.setattr(reader, "NATIVE", None)
    elif reader.NATIVE is None:
        pytest.skip("the native core is not in use here")
    return str(request.param)


@pytest.fixture(params=["native", "python"])
def sequencer_type(request: pytest.FixtureRequest) -> type[Any]:
    """The native Sequencer (message/_native.c), then the Python one
    (message/_sequencer.py): a test using it pins both."""
    from message import _core
    from message._sequencer import Sequencer

    if request.param == "python":
        return Sequencer
    if _core.NATIVE is None:
        pytest.skip("the native core is not in use here")
    return cast(type[Any], _core.NATIVE.Sequencer)


# -- a Gazette cluster -------------------------------------------------------------
#
# Tests that need Gazette's own binaries use `gazette_binaries`; tests that need
# a running cluster use `gazette_cluster` (one per run, three brokers) with
# `gazette_prefix` to name their journals. Both are built or started once per
# run. Without Go (or when the cluster cannot start) those tests are skipped
# with one line saying why, except under CI=true, where they fail.

ROOT = Path(__file__).resolve().parent.parent


def _gazette_unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason.splitlines()[0])


def _live_progress(config: pytest.Config) -> Callable[[str], None]:
    """Progress lines shown as they happen, even while pytest captures output
    (a cold build of Gazette takes minutes: it must not look like a hang)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")

    def say(line: str) -> None:
        if capman is None or reporter is None:
            return
        with capman.global_and_fixture_disabled():
            reporter.write_line(f"[gazette] {line}")

    return say


@pytest.fixture(scope="session")
def gazette_binaries(request: pytest.FixtureRequest) -> Binaries:
    """The pinned gazette, gazctl and etcd binaries, built on first use and
    cached (see exactly.localcluster)."""
    from exactly.localcluster import (
        GAZETTE_VERSION,
        ClusterError,
        GoNotFoundError,
        ensure_binaries,
    )

    try:
        return ensure_binaries(progress=_live_progress(request.config))
    except GoNotFoundError:
        reason = (f"Gazette tests need Go to build gazette {GAZETTE_VERSION}: no `go` on PATH "
                  "(Go 1.25 or newer, with cgo; see docs/local-cluster.md)")
    except ClusterError as exc:
        reason = f"Gazette tests could not build gazette {GAZETTE_VERSION}: {exc}"
    _gazette_unavailable(reason)


@pytest.fixture(scope="session")
def gazette_cluster(gazette_binaries: Binaries,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[GazetteCluster]:
    """One Gazette cluster for the whole run: etcd and three brokers on
    127.0.0.1, under pytest's temporary directory. Its ``address`` is a
    broker URL for ``BROKER_ADDRESS``; name journals with ``gazette_prefix``.
    A test that kills a broker should start it again (``start_broker``)."""
    from exactly.localcluster import ClusterError, GazetteCluster

    # A lease of 10 s, not 3: on a loaded two-core machine (Spark clusters,
    # fsyncs) every broker once lost its 3 s lease at the same moment and
    # exited. Tests that kill a broker lose nothing by it: kill_broker
    # revokes the dead broker's lease at once.
    cluster = GazetteCluster(tmp_path_factory.mktemp("gazette-cluster"), brokers=3,
                             binaries=gazette_binaries, etcd_lease=10)
    try:
        cluster.start()
    except ClusterError as exc:
        reason = f"the Gazette test cluster did not start: {exc}"
    else:
        yield cluster
        # A short grace: brokers that hold journals would not exit on SIGTERM,
        # with no broker left to hand their journals to.
        cluster.stop(grace=0.5)
        return
    _gazette_unavailable(reason)


@pytest.fixture(scope="session")
def gazette_secure_cluster(gazette_binaries: Binaries,
                           tmp_path_factory: pytest.TempPathFactory) -> Iterator[GazetteCluster]:
    """A second cluster for the whole run, secured as production clusters
    are: its two brokers serve TLS (certificates of a throwaway CA), ask for
    client certificates (mutual TLS) and check authorizations
    (``--broker.auth-keys``). ``cluster.security`` has the files and keys,
    ``cluster.client_options()`` the matching GazetteClient arguments."""
    from exactly.localcluster import ClusterError, ClusterSecurity, GazetteCluster

    work = tmp_path_factory.mktemp("gazette-secure")
    security = ClusterSecurity.generate(work / "tls", mutual=True, auth=True)
    cluster = GazetteCluster(work / "cluster", brokers=2, binaries=gazette_binaries,
                             etcd_lease=10, security=security)
    try:
        cluster.start()
    except ClusterError as exc:
        reason = f"the secured Gazette test cluster did not start: {exc}"
    else:
        yield cluster
        cluster.stop(grace=0.5)
        return
    _gazette_unavailable(reason)


@pytest.fixture(scope="session")
def s3_server(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An S3-compatible server (SeaweedFS, built with Go on first use and
    cached) on 127.0.0.1 for the whole run, with one bucket."""
    from exactly._clusterbuild import ClusterError, GoNotFoundError, ensure_seaweedfs
    from exactly._s3server import S3Server

    try:
        ensure_seaweedfs(progress=_live_progress(request.config))
        server = S3Server(tmp_path_factory.mktemp("s3")).start()
    except GoNotFoundError:
        reason = "S3 fragment store tests need Go to build SeaweedFS: no `go` on PATH"
    except ClusterError as exc:
        reason = f"the S3-compatible test server did not start: {exc}"
    else:
        yield server
        server.stop()
        return
    _gazette_unavailable(reason)


@pytest.fixture(scope="session")
def gazette_s3_cluster(gazette_binaries: Binaries, s3_server: Any,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[GazetteCluster]:
    """A cluster of two brokers that persist fragments to ``s3_server``
    (journals whose spec names ``s3_server.store_url(...)``)."""
    from exactly.localcluster import ClusterError, GazetteCluster

    cluster = GazetteCluster(tmp_path_factory.mktemp("gazette-s3"), brokers=2,
                             binaries=gazette_binaries, etcd_lease=10,
                             broker_env=s3_server.aws_env())
    try:
        cluster.start()
    except ClusterError as exc:
        reason = f"the Gazette cluster of the S3 tests did not start: {exc}"
    else:
        yield cluster
        cluster.stop(grace=0.5)
        return
    _gazette_unavailable(reason)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark standalone cluster for the whole run: a master and two
    workers (one core each) on 127.0.0.1, started from the installed pyspark;
    stopped, executors included, by PID at the end."""
    pytest.importorskip("pyspark")
    from exactly.localcluster import SparkCluster

    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2)
    cluster.start()
    yield cluster
    cluster.stop(grace=2.0)


@pytest.fixture
def gazette_prefix(gazette_cluster: GazetteCluster, request: pytest.FixtureRequest) -> str:
    """A journal-name prefix of this test alone (``t/<test>-<random>/``), so
    that tests sharing the session's cluster never collide. Also starts again
    any broker of the cluster that an earlier test left dead."""
    gazette_cluster.ensure_brokers()
    name = re.sub(r"[^A-Za-z0-9_]+", "-", request.node.name).strip("-")[:60] or "test"
    return f"t/{name}-{secrets.token_hex(4)}/"


@pytest.fixture(scope="session")
def gazette_interop(request: pytest.FixtureRequest, gazette_binaries: Binaries) -> Path:
    """The Go program of tests/gazette_interop (publish and read with Gazette's
    own `message` package), built on first use and whenever its sources change."""
    from exactly.localcluster import ClusterError, build_go_program

    try:
        return build_go_program(ROOT / "tests" / "gazette_interop", "gazette-interop",
                                progress=_live_progress(request.config))
    except ClusterError as exc:
        reason = f"the Go interop program did not build: {exc}"
    _gazette_unavailable(reason)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test using a Gazette fixture carries the `gazette` marker, so that
    `-m "not gazette"` leaves them out; without the spark extra, Spark tests
    are skipped, with the reason."""
    gazette = {"gazette_binaries", "gazette_cluster", "gazette_prefix", "gazette_interop",
               "gazette_secure_cluster", "s3_server", "gazette_s3_cluster"}
    spark = {"spark", "spark_cluster"}
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if gazette & names:
            item.add_marker(pytest.mark.gazette)
        if SPARK_MISSING and (spark & names or item.get_closest_marker("spark")):
            item.add_marker(pytest.mark.skip(reason=SPARK_REASON))


# -- a PostgreSQL server -------------------------------------------------------------
#
# consumer.PostgresStore's tests run against a real server started from the
# machine's PostgreSQL programs (installed from Debian's package if missing),
# one per run, stopped by PID at the end. Without one, they are skipped with
# one line saying why, except under CI=true, where they fail.


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A PostgreSQL server on 127.0.0.1 for the whole run (exactly._postgres)."""
    pytest.importorskip("psycopg", reason="PostgresStore tests need the postgres extra")
    from exactly._postgres import PostgresServer, PostgresUnavailableError

    server = PostgresServer()
    try:
        server.start()
    except PostgresUnavailableError as exc:
        reason = f"PostgresStore tests need a PostgreSQL server: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason.splitlines()[0])
    yield server
    server.stop()


@pytest.fixture
def postgres_dsn(postgres_server: Any) -> str:
    """A new, empty database of the run's server, for this test alone."""
    return str(postgres_server.create_database(f"t_{secrets.token_hex(6)}"))
