"""A local Spark standalone cluster: a master and N workers on 127.0.0.1,
run from the installed ``pyspark`` (``bin/spark-class ...Master`` / ``...Worker``).

Applications connect with ``SparkSession.builder.master(cluster.master_url)``;
each worker runs its executors as JVMs of their own, with Python workers of
their own: nothing but the network is shared with the driver (here, all
processes are on one machine, so a store directory would be too; a Gazette
cluster is what such executors are meant to reach).

A cluster lives in a work directory::

    <workdir>/spark-cluster.json   PIDs and ports (read by SparkCluster.attach)
    <workdir>/logs/*.log           master.log, worker-0.log, ...
    <workdir>/work/worker-N/       each worker's work directory (executor logs)
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Final, Self, final

from exactly._clusterbuild import ClusterError
from exactly._procs import (
    Proc,
    alive,
    child_env,
    pick_ports,
    proc_stat,
    send_signal,
    spawn,
    wait_dead,
)

_MASTER: Final = "org.apache.spark.deploy.master.Master"
_WORKER: Final = "org.apache.spark.deploy.worker.Worker"
_EXECUTOR: Final = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def worker_host(i: int) -> str:
    """The loopback address worker ``i`` listens on."""
    return f"127.0.0.{2 + i}"


def spark_home() -> Path:
    """The Spark installation of the ``pyspark`` package."""
    try:
        import pyspark
    except ImportError:
        raise ClusterError("a Spark cluster needs pyspark (pip install 'exactly[spark]')") from None
    return Path(pyspark.__file__).resolve().parent


@final
class SparkCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1, each
    worker offering ``cores`` cores and ``memory`` to executors.

    ``start()`` picks free ports, starts the master, then the workers, and
    waits until the master counts every worker alive. ``stop()`` stops the
    workers (and the executors they run), then the master, by PID: SIGTERM,
    then SIGKILL after a grace period. ``executor_pids()`` finds the running
    executors' JVMs, and ``kill_executor()`` kills one, for fault tests.
    """

    def __init__(self, workdir: str | os.PathLike[str], *, workers: int = 2, cores: int = 1,
                 memory: str = "1g", stop_at_exit: bool = True) -> None:
        if workers < 1:
            raise ValueError(f"a Spark cluster needs at least one worker, not {workers}")
        self.workdir = Path(workdir).resolve()
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.stop_at_exit = stop_at_exit
        self._lock = threading.RLock()
        self._master: Proc | None = None
        self._ui_port = 0
        self._workers: list[Proc] = []
        self._at_exit = False

    # -- what it is --------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT``, for ``SparkSession.builder.master``."""
        self._require_started()
        assert self._master is not None
        return f"spark://127.0.0.1:{self._master.port}"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def pids(self) -> list[int]:
        """The PIDs of the master and the workers that run."""
        procs = [self._master, *self._workers] if self._master is not None else []
        return [p.pid for p in procs if p is not None and p.pid is not None and alive(p)]

    def executor_pids(self) -> list[int]:
        """The PIDs of the executor JVMs the workers run now (their children)."""
        workers = {p.pid for p in self._workers if p.pid is not None and alive(p)}
        out = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read().decode(errors="replace")
                ppid = int(stat[stat.rindex(")") + 2:].split()[1])
                if ppid not in workers:
                    continue
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if _EXECUTOR.encode() in f.read():
                        out.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
        return sorted(out)

    def kill_executor(self, pid: int | None = None, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to executor ``pid`` (the first running one by default),
        wait for it to die, and return its PID. Its worker starts another."""
        pids = self.executor_pids()
        if pid is None:
            if not pids:
                raise ClusterError("no executor runs")
            pid = pids[0]
        elif pid not in pids:
            raise ClusterError(f"{pid} is not an executor of this cluster")
        proc = Proc(f"executor-{pid}", 0, pid=pid, start_time=_start_time(pid))
        send_signal(proc, sig)
        if not wait_dead(proc, 30.0):
            raise ClusterError(f"executor {pid} still runs 30s after signal {sig}")
        return pid

    # -- start and stop ------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> Self:
        """Start the master and the workers; wait (at most ``timeout``
        seconds) until every worker has registered with the master. Raises
        ``ClusterError`` (with the tail of a log) after stopping what it started."""
        with self._lock:
            if self._master is not None and alive(self._master):
                raise ClusterError(f"the Spark cluster in {self.workdir} is already started")
            self.log_dir.mkdir(parents=True, exist_ok=True)
            home = spark_home()
            ports = pick_ports(2 + 2 * self.workers, [])
            self._master = Proc("master", ports[0])
            self._ui_port = ports[1]
            self._workers = [Proc(f"worker-{i}", ports[2 + 2 * i]) for i in range(self.workers)]
            deadline = time.monotonic() + timeout
            try:
                env = self._env(home)
                self._spawn(self._master, [
                    str(home / "bin" / "spark-class"), _MASTER, "--host", "127.0.0.1",
                    "--port", str(self._master.port), "--webui-port", str(self._ui_port),
                ], env)
                self._write_state()
                self._wait(lambda: self._status() is not None, deadline, self._master,
                           "serve its status page")
                for i, w in enumerate(self._workers):
                    work = self.workdir / "work" / w.name
                    work.mkdir(parents=True, exist_ok=True)
                    # Each worker on a loopback address of its own (127.0.0.2,
                    # ...): to Spark, distinct hosts, as on a real cluster (it
                    # runs a task's speculative copy only on another host).
                    host = worker_host(i)
                    self._spawn(w, [
                        str(home / "bin" / "spark-class"), _WORKER, self.master_url,
                        "--host", host, "--port", str(w.port),
                        "--webui-port", str(ports[3 + 2 * i]), "--cores", str(self.cores),
                        "--memory", self.memory, "--work-dir", str(work),
                    ], {**env, "SPARK_LOCAL_IP": host})
                self._write_state()
                self._wait(lambda: self._alive_workers() >= self.workers, deadline,
                           self._workers[-1], "register with the master")
            except BaseException:
                self._stop_processes(0.0)
                raise
            if self.stop_at_exit and not self._at_exit:
                atexit.register(self._stop_quietly)
                self._at_exit = True
            return self

    def stop(self, grace: float = 5.0) -> None:
        """Stop the workers, their executors and the master, by PID: SIGTERM,
        then SIGKILL after ``grace`` seconds. Idempotent."""
        with self._lock:
            self._stop_processes(grace)
            if self._at_exit:
                atexit.unregister(self._stop_quietly)
                self._at_exit = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @classmethod
    def attach(cls, workdir: str | os.PathLike[str]) -> SparkCluster:
        """The cluster that a process started in ``workdir`` (to stop it)."""
        path = Path(workdir).resolve() / "spark-cluster.json"
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise ClusterError(f"no Spark cluster in {path.parent}") from None
        c = cls(workdir, workers=len(doc["workers"]), stop_at_exit=False)
        c._master = Proc.from_json(doc["master"])
        c._workers = [Proc.from_json(w) for w in doc["workers"]]
        return c

    # -- internals -----------------------------------------------------------------

    def _env(self, home: Path) -> dict[str, str]:
        env = child_env(["SPARK_", "PYSPARK_"])
        env.update({
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.log_dir),
            # No REST submission server (it listens on a fixed port, 6066).
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            # Executors' work directories are removed with the cluster's.
            "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=false",
        })
        return env

    def _spawn(self, proc: Proc, argv: list[str], env: dict[str, str]) -> None:
        spawn(proc, argv, env, cwd=self.workdir, log_path=self.log_dir / f"{proc.name}.log",
              what="exactly.localcluster")

    def _status(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self._ui_port}/json/",
                                        timeout=1.0) as resp:
                doc = json.loads(resp.read())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def _alive_workers(self) -> int:
        status = self._status() or {}
        return int(status.get("aliveworkers", 0))

    def _wait(self, ready: Any, deadline: float, proc: Proc, what: str) -> None:
        while not ready():
            for p in [self._master, *self._workers]:
                if p is not None and p.pid is not None and not alive(p):
                    raise self._error(p, "exited while starting")
            if time.monotonic() >= deadline:
                raise self._error(proc, f"did not {what} in time")
            time.sleep(0.2)

    def _error(self, proc: Proc, what: str) -> ClusterError:
        log = self.log_dir / f"{proc.name}.log"
        tail = ""
        with contextlib.suppress(OSError):
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        return ClusterError(f"Spark {proc.name} {what} (log: {log})\n{tail}")

    def _write_state(self) -> None:
        doc = {
            "master": self._master.to_json() if self._master else None,
            "workers": [w.to_json() for w in self._workers],
        }
        (self.workdir / "spark-cluster.json").write_text(json.dumps(doc, indent=2))

    def _stop_processes(self, grace: float) -> None:
        executors = [Proc(f"executor-{pid}", 0, pid=pid, start_time=_start_time(pid))
                     for pid in self.executor_pids()]
        groups = [self._workers, executors, [self._master] if self._master else []]
        for group in groups:
            live = [p for p in group if alive(p)]
            for p in live:
                send_signal(p, signal.SIGTERM)
            for p in live:
                if not wait_dead(p, grace):
                    send_signal(p, signal.SIGKILL)
                    wait_dead(p, 10.0)

    def _stop_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(grace=1.0)

    def _require_started(self) -> None:
        if self._master is None:
            raise ClusterError("the Spark cluster is not started")


def _start_time(pid: int) -> int | None:
    stat = proc_stat(pid)
    return stat[1] if stat else None
