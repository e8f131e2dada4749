"""exactly.localcluster and ``exactly cluster``, with real etcd and Gazette
processes on 127.0.0.1 (no mocks)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from exactly.localcluster import (
    Binaries,
    ClusterError,
    ClusterStartError,
    GazctlError,
    GazetteCluster,
    GoNotFoundError,
    build_go_program,
)
from tests.docblocks import code_blocks

ROOT = Path(__file__).resolve().parents[2]


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def exactly(*args: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exactly", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=ROOT)


# -- the session cluster ----------------------------------------------------------


@pytest.mark.gazette
def test_session_cluster_serves(gazette_cluster: GazetteCluster) -> None:
    """etcd is healthy, every broker answers gazctl, and cluster.json records
    each process's PID and address, as attach() reads them back."""
    c = gazette_cluster
    with urllib.request.urlopen(f"{c.etcd_address}/health", timeout=5) as resp:
        assert json.loads(resp.read())["health"] == "true"
    assert len(c.addresses) == 3 and c.address == c.addresses[0]
    for i, address in enumerate(c.addresses):
        assert address.startswith("http://127.0.0.1:")
        assert c.gazctl("journals", "list", broker=i).returncode == 0
    state = json.loads(c.state_file.read_text())
    assert state["etcd_address"] == c.etcd_address
    assert [b["address"] for b in state["brokers"]] == c.addresses
    assert [b["pid"] for b in state["brokers"]] == c.broker_pids
    attached = GazetteCluster.attach(c.workdir)
    assert attached.addresses == c.addresses and attached.broker_pids == c.broker_pids
    assert attached.is_running()
    assert all(p.running and p.log.is_file() for p in attached.processes())


@pytest.mark.gazette
def test_gazctl_round_trips_bytes(gazette_cluster: GazetteCluster,
                                  gazette_prefix: str) -> None:
    """Bytes appended with gazctl read back identical through another broker,
    and closed fragments persist under fragment_root."""
    c = gazette_cluster
    name = f"{gazette_prefix}bytes"
    route = c.create_journal(name, replication=2, content_type="application/octet-stream",
                             fragment_length=1024)
    assert route.primary in route.members and len(route.members) == 2
    chunks = [bytes(range(256)) * 3, b"\x00\n" * 400, "é\n".encode() * 300]
    for chunk in chunks:
        c.gazctl("journals", "append", "-l", f"name={name}", input=chunk)
    data = b"".join(chunks)
    other = next(i for i in range(3) if i != route.primary)
    assert c.gazctl("journals", "read", "-l", f"name={name}", broker=other).stdout == data

    # Each append beyond the fragment length closes a fragment, which the
    # primary persists at once, named <begin>-<end>-<sha1>.raw (uncompressed).
    deadline = time.monotonic() + 20
    while not (files := sorted((c.fragment_root / name).glob("*.raw"))):
        assert time.monotonic() < deadline, "no fragment persisted"
        time.sleep(0.1)
    for f in files:
        begin, end = (int(x, 16) for x in f.name.split("-")[:2])
        assert f.read_bytes() == data[begin:end]


@pytest.mark.gazette
def test_gazctl_error_is_one_clear_error(gazette_cluster: GazetteCluster) -> None:
    """A failing gazctl raises GazctlError (a CalledProcessError) whose first
    line names the command and gazctl's reason; check=False returns instead."""
    bad = b"name: x\nreplication: 1\n"  # a journal name is 4 characters or more
    with pytest.raises(GazctlError) as err:
        gazette_cluster.gazctl("journals", "apply", input=bad)
    assert isinstance(err.value, subprocess.CalledProcessError)
    first = str(err.value).splitlines()[0]
    assert first.startswith("gazctl journals apply exited with status 1: ")
    assert "invalid length" in first
    assert gazette_cluster.gazctl("journals", "apply", input=bad, check=False).returncode == 1


@pytest.mark.gazette
@pytest.mark.slow
def test_killed_primary_is_replaced(gazette_cluster: GazetteCluster,
                                    gazette_prefix: str) -> None:
    """SIGKILL the primary of a journal with replication 2 of 3 brokers: once its
    etcd lease expires, two surviving brokers serve the journal, appends go on,
    and the surviving replica reads all; start_broker brings the killed one back.

    (The broker added in the dead one's place starts at the write head: until
    the earlier fragments are persisted, a read of them sent to it finds
    nothing, and a non-blocking gazctl read prints nothing.)"""
    c = gazette_cluster
    name = f"{gazette_prefix}failover"
    route = c.create_journal(name, replication=2, content_type="application/octet-stream")
    assert route.primary is not None
    replica = next(i for i in route.members if i != route.primary)
    c.gazctl("journals", "append", "-l", f"name={name}", input=b"before\n")
    killed_at = time.monotonic()
    c.kill_broker(route.primary)
    try:
        while True:
            now = c.journal_brokers(name)  # asked of a broker that runs
            if now.primary is not None and route.primary not in now.members \
                    and len(now.members) == 2:
                break
            assert time.monotonic() - killed_at < 10 * c.etcd_lease, now
            time.sleep(0.05)
        assert replica in now.members
        c.gazctl("journals", "append", "-l", f"name={name}", input=b"after\n",
                 broker=replica)
        assert c.gazctl("journals", "read", "-l", f"name={name}",
                        broker=replica).stdout == b"before\nafter\n"
    finally:
        c.start_broker(route.primary)
    assert c.is_running()


# -- clusters of their own --------------------------------------------------------


@pytest.mark.gazette
@pytest.mark.slow
def test_kill_restart_and_stop(gazette_binaries: Binaries, tmp_path: Path) -> None:
    """kill_broker(SIGKILL) kills; start_broker restarts on the same port and id;
    stop() leaves none of the recorded PIDs alive, and is idempotent."""
    cluster = GazetteCluster(tmp_path / "c", brokers=2, binaries=gazette_binaries)
    with cluster:
        old_pid, address = cluster.broker_pids[1], cluster.addresses[1]
        assert old_pid is not None and pid_alive(old_pid)
        cluster.kill_broker(1, signal.SIGKILL)
        assert not pid_alive(old_pid) and not cluster.broker_running(1)
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", int(address.rsplit(":", 1)[1]))) != 0
        with pytest.raises(ClusterError):
            cluster.kill_broker(1)

        cluster.start_broker(1)
        assert cluster.addresses[1] == address and cluster.broker_pids[1] != old_pid
        assert cluster.gazctl("journals", "list", broker=1).returncode == 0
        with pytest.raises(ClusterError):
            cluster.start_broker(1)
        recorded = json.loads(cluster.state_file.read_text())
        pids = [recorded["etcd"]["pid"], *(b["pid"] for b in recorded["brokers"])]
        assert pids == [cluster.etcd_pid, *cluster.broker_pids]
        assert all(pid_alive(p) for p in pids)
    assert not any(pid_alive(p) for p in pids)
    assert not cluster.is_running()
    cluster.stop()  # again: nothing to do


@pytest.mark.gazette
@pytest.mark.slow
def test_cli_start_status_stop(gazette_binaries: Binaries, tmp_path: Path) -> None:
    """`exactly cluster start` leaves a cluster running after the command
    exits; `status` shows it; `stop`, from yet another process, ends it."""
    where = str(tmp_path / "cluster")
    started = exactly("cluster", "start", "--dir", where, "--brokers", "1")
    try:
        assert started.returncode == 0, started.stderr
        line, = started.stdout.splitlines()
        assert line.startswith("BROKER_ADDRESS=http://127.0.0.1:")
        address = line.partition("=")[2]
        assert f"exactly cluster stop --dir {where}" in started.stderr
        env = {**os.environ, "BROKER_ADDRESS": address}
        subprocess.run([str(gazette_binaries.gazctl), "journals", "list"], env=env,
                       check=True, capture_output=True, timeout=30)

        status = exactly("cluster", "status", "--dir", where)
        assert status.returncode == 0, status.stderr
        assert status.stdout.count(" running ") == 2 and line in status.stdout
        doc = json.loads((tmp_path / "cluster" / "cluster.json").read_text())
        pids = [doc["etcd"]["pid"], *(b["pid"] for b in doc["brokers"])]
        assert all(pid_alive(p) for p in pids)

        again = exactly("cluster", "start", "--dir", where)
        assert again.returncode == 1
        assert again.stderr.startswith("exactly: error: a cluster already runs in ")

        stopped = exactly("cluster", "stop", "--dir", where)
        assert stopped.returncode == 0, stopped.stderr
        assert not any(pid_alive(p) for p in pids)
        status = exactly("cluster", "status", "--dir", where)
        assert status.returncode == 1
        assert status.stderr == f"exactly: error: the cluster in {where} is stopped\n"
    finally:
        if (tmp_path / "cluster" / "cluster.json").exists():
            GazetteCluster.attach(where).stop(grace=0)


def test_cli_secure_cluster_restarts_with_the_same_credentials(
        gazette_binaries: Binaries, tmp_path: Path) -> None:
    """`cluster start --secure --mutual-tls` prints the settings a client
    needs, and they work; stopped, the cluster starts again only secured
    (a plain start says why), with the same CA, certificates and keys, so
    the settings a client has keep working."""
    where = str(tmp_path / "cluster")
    started = exactly("cluster", "start", "--dir", where, "--brokers", "1", "--secure",
                      "--mutual-tls")
    try:
        assert started.returncode == 0, started.stderr
        settings = dict(line.split("=", 1) for line in started.stdout.splitlines())
        assert settings["BROKER_ADDRESS"].startswith("https://127.0.0.1:")
        assert {"BROKER_TRUSTED_CA_FILE", "BROKER_CERT_FILE", "BROKER_CERT_KEY_FILE",
                "BROKER_AUTH_KEYS"} <= set(settings)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("BROKER_") and k != "EXACTLY_ROOT"}
        env.update((k, v.strip("'")) for k, v in settings.items())
        listed = exactly("journals", "list", env=env)
        assert listed.returncode == 0, listed.stderr
        tls = tmp_path / "cluster" / "tls"
        files = {f.name: f.read_bytes() for f in tls.iterdir()}
        assert exactly("cluster", "stop", "--dir", where).returncode == 0

        plain = exactly("cluster", "start", "--dir", where, "--brokers", "1")
        assert plain.returncode == 1
        assert "was started with --secure: start it with --secure again" in plain.stderr
        again = exactly("cluster", "start", "--dir", where, "--brokers", "1", "--secure",
                        "--mutual-tls")
        assert again.returncode == 0, again.stderr
        assert "reusing the CA, certificates and keys" in again.stderr
        assert {f.name: f.read_bytes() for f in tls.iterdir()} == files
        resettings = dict(line.split("=", 1) for line in again.stdout.splitlines())
        env["BROKER_ADDRESS"] = resettings["BROKER_ADDRESS"]
        listed = exactly("journals", "list", env=env)  # the settings kept from the first start
        assert listed.returncode == 0, listed.stderr
    finally:
        if (tmp_path / "cluster" / "cluster.json").exists():
            GazetteCluster.attach(where).stop(grace=0)


def test_cli_without_cluster_is_one_line_error(tmp_path: Path) -> None:
    """status and stop of a directory without a cluster: one line, status 1."""
    for action in ("status", "stop"):
        r = exactly("cluster", action, "--dir", str(tmp_path))
        assert r.returncode == 1
        assert r.stderr == f"exactly: error: no cluster in {tmp_path} (no cluster.json)\n"


@pytest.mark.parametrize("args", [["build"], ["start", "--dir", "DIR"]])
def test_missing_go_is_one_line_error(tmp_path: Path, args: list[str]) -> None:
    """Without `go` on PATH and nothing cached, building says so in one line."""
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not os.access(os.path.join(d, "go"), os.X_OK)]
    env = {**os.environ, "PATH": os.pathsep.join(path),
           "EXACTLY_CACHE": str(tmp_path / "cache")}
    assert shutil.which("go", path=env["PATH"]) is None
    r = exactly("cluster", *[str(tmp_path / "c") if a == "DIR" else a for a in args], env=env)
    assert r.returncode == 1
    assert r.stdout == ""
    line, = r.stderr.splitlines()
    assert line.startswith("exactly: error: building gazette v0.103.0 needs Go")
    assert "no `go` on PATH" in line
    assert not (tmp_path / "c" / "cluster.json").exists()


def test_missing_go_raises_go_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """build_go_program without Go raises GoNotFoundError, a ClusterError."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "go.mod").write_text("module example.com/hello\n\ngo 1.22\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GoNotFoundError) as err:
        build_go_program(tmp_path / "src", "hello", cache_dir=tmp_path / "cache")
    assert isinstance(err.value, ClusterError)


@pytest.mark.gazette
def test_go_program_rebuilt_only_when_sources_change(gazette_binaries: Binaries,
                                                     tmp_path: Path) -> None:
    """build_go_program caches by a hash of the sources: the same sources give
    the same binary without a build; changed ones a new binary, the old removed."""
    src = tmp_path / "hello"
    src.mkdir()
    (src / "go.mod").write_text("module example.com/hello\n\ngo 1.22\n")
    (src / "main.go").write_text(
        'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("one") }\n')
    cache = tmp_path / "cache"
    lines: list[str] = []
    first = build_go_program(src, "hello", cache_dir=cache, progress=lines.append)
    assert subprocess.run([first], capture_output=True, text=True).stdout == "one\n"
    assert any(line.startswith("building hello") for line in lines)
    mtime = first.stat().st_mtime_ns

    lines.clear()
    assert build_go_program(src, "hello", cache_dir=cache, progress=lines.append) == first
    assert lines == [] and first.stat().st_mtime_ns == mtime

    (src / "main.go").write_text(
        'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("two") }\n')
    second = build_go_program(src, "hello", cache_dir=cache)
    assert second != first and not first.exists()
    assert subprocess.run([second], capture_output=True, text=True).stdout == "two\n"
    assert not list(src.glob("hello*")), "the build wrote into the sources"


@pytest.mark.gazette
@pytest.mark.slow
def test_docs_python_example_runs(gazette_binaries: Binaries, tmp_path: Path) -> None:
    """The Python example of docs/local-cluster.md runs as written, and leaves
    no process behind."""
    code, = code_blocks("docs/local-cluster.md")[:1]
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "b'{\"n\": 1}\\n'\n"
    doc = json.loads((tmp_path / "my-cluster" / "cluster.json").read_text())
    assert not any(pid_alive(p["pid"]) for p in [doc["etcd"], *doc["brokers"]])


@pytest.mark.gazette
def test_failed_start_reports_the_log_and_stops_all(gazette_binaries: Binaries,
                                                    tmp_path: Path) -> None:
    """A broker that cannot start: ClusterStartError names it with its log's
    tail, and etcd, already running, is stopped."""
    cluster = GazetteCluster(tmp_path / "c", brokers=1, binaries=gazette_binaries,
                             log_level="chatty")
    with pytest.raises(ClusterStartError) as err:
        cluster.start(timeout=30)
    assert err.value.process == "broker-0"
    assert str(err.value).startswith("broker-0 exited with status ")
    assert "chatty" in err.value.log_tail
    assert err.value.log_path == cluster.log_dir / "broker-0.log"
    doc = json.loads(cluster.state_file.read_text())
    assert not pid_alive(doc["etcd"]["pid"])


def _failing_gazette(tmp_path: Path, real: Path, failures: int) -> Path:
    """A ``gazette`` whose first ``failures`` runs of ``serve`` exit as a
    broker does when etcd did not answer its client in time; later runs are
    the real broker."""
    count = tmp_path / "serve-runs"
    wrapper = tmp_path / "gazette"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = serve ]; then echo x >> "{count}"; fi\n'
        f'if [ "$1" = serve ] && [ "$(wc -l < "{count}")" -le {failures} ]; then\n'
        "  echo 'level=fatal msg=\"failed to build Etcd client\""
        " err=\"context deadline exceeded\"'\n"
        "  exit 1\n"
        "fi\n"
        f'exec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.mark.gazette
def test_a_broker_that_gave_up_on_etcd_while_starting_is_launched_again(
        gazette_binaries: Binaries, tmp_path: Path) -> None:
    """Gazette's broker exits at once when etcd does not answer its client
    within a twentieth of the lease (150 ms for 3 s), which a busy machine
    can cause: the cluster launches it again and it serves; its log holds
    both runs, and stop() leaves no process of it."""
    wrapper = _failing_gazette(tmp_path, gazette_binaries.gazette, failures=2)
    bins = Binaries(gazette=wrapper, gazctl=gazette_binaries.gazctl, etcd=gazette_binaries.etcd)
    cluster = GazetteCluster(tmp_path / "c", brokers=1, binaries=bins)
    with cluster:
        r = subprocess.run([str(gazette_binaries.gazctl), "journals", "list",
                            f"--broker.address={cluster.address}"],
                           capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr
        pids = [p["pid"] for p in json.loads(cluster.state_file.read_text())["brokers"]]
    log = (cluster.log_dir / "broker-0.log").read_text()
    assert log.count("exactly.localcluster starts:") == 3
    assert log.count("failed to build Etcd client") == 2
    assert not any(pid_alive(pid) for pid in pids)


@pytest.mark.gazette
def test_a_broker_that_keeps_giving_up_on_etcd_is_reported(gazette_binaries: Binaries,
                                                            tmp_path: Path) -> None:
    """Launched again a few times only: then ClusterStartError with the log."""
    wrapper = _failing_gazette(tmp_path, gazette_binaries.gazette, failures=100)
    bins = Binaries(gazette=wrapper, gazctl=gazette_binaries.gazctl, etcd=gazette_binaries.etcd)
    cluster = GazetteCluster(tmp_path / "c", brokers=1, binaries=bins)
    with pytest.raises(ClusterStartError) as err:
        cluster.start(timeout=30)
    assert err.value.process == "broker-0"
    assert "failed to build Etcd client" in err.value.log_tail
    log = (cluster.log_dir / "broker-0.log").read_text()
    assert log.count("exactly.localcluster starts:") == 4  # the first run and 3 more


@pytest.mark.gazette
def test_cluster_stops_when_its_process_exits(gazette_binaries: Binaries,
                                              tmp_path: Path) -> None:
    """A cluster left running by a Python process is stopped at its exit."""
    code = (
        "import sys\n"
        "from exactly.localcluster import Binaries, GazetteCluster\n"
        "b = Binaries(*sys.argv[2:5])\n"
        "GazetteCluster(sys.argv[1], brokers=1, binaries=b).start()\n"
    )
    bins = [str(p) for p in (gazette_binaries.gazette, gazette_binaries.gazctl,
                             gazette_binaries.etcd)]
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c"), *bins],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "c" / "cluster.json").read_text())
    pids = [doc["etcd"]["pid"], doc["brokers"][0]["pid"]]
    assert not any(pid_alive(p) for p in pids)


@pytest.mark.gazette
def test_concurrent_builds_build_once(gazette_binaries: Binaries, tmp_path: Path) -> None:
    """Two processes building the same program at once: one builds, the other
    waits for it (or finds it built), and both get the same binary."""
    src = tmp_path / "hello"
    src.mkdir()
    (src / "go.mod").write_text("module example.com/hello\n\ngo 1.22\n")
    (src / "main.go").write_text("package main\n\nfunc main() {}\n")
    code = (
        "import sys\n"
        "from exactly.localcluster import build_go_program\n"
        "print(build_go_program(sys.argv[1], 'hello', cache_dir=sys.argv[2], progress=print))\n"
    )
    # Relative paths, on purpose: the build runs elsewhere (in the sources).
    procs = [subprocess.Popen([sys.executable, "-c", code, "hello", "cache"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    paths = {out.splitlines()[-1] for out, _ in outs}
    assert len(paths) == 1 and Path(paths.pop()).is_file()
    lines = [line for out, _ in outs for line in out.splitlines()]
    assert sum(line.startswith("building hello") for line in lines) == 1


def test_public_names() -> None:
    """exactly.localcluster's __all__ names only what exists, and its errors
    form one tree under ClusterError."""
    import exactly.localcluster as lc

    for name in lc.__all__:
        assert hasattr(lc, name), name
    for err in (lc.BuildError, lc.GoNotFoundError, lc.ClusterStartError,
                lc.ClusterNotFoundError, lc.GazctlError):
        assert issubclass(err, lc.ClusterError)
    assert issubclass(lc.GoNotFoundError, lc.BuildError)
    assert (lc.GAZETTE_VERSION, lc.ETCD_VERSION) == ("v0.103.0", "v3.6.5")
