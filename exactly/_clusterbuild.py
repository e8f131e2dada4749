"""Building the binaries of a local Gazette cluster, and Go programs, with
the Go toolchain, into a cache outside any work tree. The public names are
``exactly.localcluster``'s, which documents them."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from exactly._errors import ExactlyError

GAZETTE_VERSION: Final = "v0.103.0"
ETCD_VERSION: Final = "v3.6.5"
#: SeaweedFS (Apache-2.0): the S3-compatible fragment store of test clusters.
#: The Go module proxy serves its commits as pseudo-versions.
SEAWEEDFS_VERSION: Final = "v0.0.0-20261109003541-7506e5f91cd6"

# How often a long build says it is still going.
_HEARTBEAT: Final = 30.0
_LOG_TAIL_LINES: Final = 25

Progress = Callable[[str], None]


# -- errors -----------------------------------------------------------------------


class ClusterError(ExactlyError):
    """Anything exactly.localcluster raises: building binaries, or running a cluster."""


def with_log_tail(message: str, log_path: Path | None, log_tail: str) -> str:
    """``message``, followed by the last lines of the log they come from."""
    if log_tail:
        return f"{message}\n--- last lines of {log_path} ---\n{log_tail}"
    return message


class BuildError(ClusterError):
    """A binary could not be built. ``log_path`` is the build's log and
    ``log_tail`` its last lines."""

    def __init__(self, message: str, *, log_path: Path | None = None,
                 log_tail: str = "") -> None:
        super().__init__(with_log_tail(message, log_path, log_tail))
        self.log_path = log_path
        self.log_tail = log_tail


class GoNotFoundError(BuildError):
    """No Go toolchain on PATH: the binaries cannot be built."""


# -- binaries ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Binaries:
    """Paths of the ``gazette`` broker, the ``gazctl`` tool and the ``etcd`` server."""

    gazette: Path
    gazctl: Path
    etcd: Path


def default_cache_dir() -> Path:
    """Where built binaries are cached: ``$EXACTLY_CACHE``, else
    ``$XDG_CACHE_HOME/exactly``, else ``~/.cache/exactly``."""
    env = os.environ.get("EXACTLY_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "exactly"
    return Path.home() / ".cache" / "exactly"


def ensure_binaries(*, cache_dir: str | os.PathLike[str] | None = None,
                    progress: Progress | None = None) -> Binaries:
    """The pinned ``gazette``, ``gazctl`` (``GAZETTE_VERSION``) and ``etcd``
    (``ETCD_VERSION``) binaries, built with Go on first use and cached.

    Each version is built in a throwaway Go module under the cache, into a
    temporary name renamed into place, so that a killed build never leaves a
    half-written binary; a file lock makes concurrent callers wait for one
    build. ``progress`` receives one line per step (and one every 30 s while
    a build runs). Raises ``GoNotFoundError`` without ``go`` on PATH, and
    ``BuildError`` (with the tail of the build log) when a build fails.
    """
    cache = (Path(cache_dir) if cache_dir is not None else default_cache_dir()).resolve()
    gazette_dir = cache / f"gazette-{GAZETTE_VERSION}"
    etcd_dir = cache / f"etcd-{ETCD_VERSION}"
    _build_pinned(
        gazette_dir, f"gazette {GAZETTE_VERSION}",
        requires=[f"go.gazette.dev/core/cmd/gazette@{GAZETTE_VERSION}",
                  f"go.gazette.dev/core/cmd/gazctl@{GAZETTE_VERSION}"],
        outputs={"gazette": "go.gazette.dev/core/cmd/gazette",
                 "gazctl": "go.gazette.dev/core/cmd/gazctl"},
        eta="2 to 7 minutes", progress=progress,
    )
    _build_pinned(
        etcd_dir, f"etcd {ETCD_VERSION}",
        requires=[f"go.etcd.io/etcd/server/v3@{ETCD_VERSION}"],
        outputs={"etcd": "go.etcd.io/etcd/server/v3"},
        eta="about 30 seconds", progress=progress,
    )
    return Binaries(
        gazette=gazette_dir / "bin" / "gazette",
        gazctl=gazette_dir / "bin" / "gazctl",
        etcd=etcd_dir / "bin" / "etcd",
    )


def ensure_seaweedfs(*, cache_dir: str | os.PathLike[str] | None = None,
                     progress: Progress | None = None) -> Path:
    """The pinned SeaweedFS ``weed`` binary (``SEAWEEDFS_VERSION``), built
    with Go on first use and cached, as ``ensure_binaries`` builds Gazette's."""
    cache = (Path(cache_dir) if cache_dir is not None else default_cache_dir()).resolve()
    dest = cache / f"seaweedfs-{SEAWEEDFS_VERSION}"
    _build_pinned(
        dest, f"seaweedfs {SEAWEEDFS_VERSION}",
        requires=[f"github.com/seaweedfs/seaweedfs@{SEAWEEDFS_VERSION}"],
        outputs={"weed": "github.com/seaweedfs/seaweedfs/weed"},
        eta="5 to 15 minutes", progress=progress,
    )
    return dest / "bin" / "weed"


def build_go_program(src_dir: str | os.PathLike[str], name: str, *,
                     cache_dir: str | os.PathLike[str] | None = None,
                     progress: Progress | None = None) -> Path:
    """Build the Go ``main`` package of module ``src_dir`` (its ``go.mod`` and
    ``go.sum`` complete) into the cache, and return the binary's path.

    The binary is keyed by a hash of the module's ``.go``, ``go.mod`` and
    ``go.sum`` files: it is rebuilt only when they change (older builds of the
    same ``name`` are then removed). Building never writes into ``src_dir``.
    Raises as ``ensure_binaries`` does.
    """
    src = Path(src_dir).resolve()
    if not (src / "go.mod").is_file():
        raise BuildError(f"{src} is not a Go module (no go.mod)")
    digest = hashlib.sha256(name.encode())
    for path in sorted(src.rglob("*")):
        if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
            digest.update(b"\0" + str(path.relative_to(src)).encode() + b"\0")
            digest.update(path.read_bytes())
    cache = (Path(cache_dir) if cache_dir is not None else default_cache_dir()).resolve()
    programs = cache / "go-programs"
    dest = programs / f"{name}-{digest.hexdigest()[:16]}"
    binary = dest / "bin" / name
    if not binary.is_file():
        _build(dest, name, module_dir=src, outputs={name: "."}, go_flags="-mod=readonly",
               eta="up to a few minutes", progress=progress)
        for old in programs.glob(f"{name}-*"):
            if old != dest and re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{16}}", old.name):
                shutil.rmtree(old, ignore_errors=True)
    return binary


def _build_pinned(dest: Path, what: str, *, requires: list[str], outputs: dict[str, str],
                  eta: str, progress: Progress | None) -> None:
    if all((dest / "bin" / out).is_file() for out in outputs):
        return
    _build(dest, what, module_dir=None, requires=requires, outputs=outputs,
           go_flags="-mod=mod", eta=eta, progress=progress)


def _build(dest: Path, what: str, *, module_dir: Path | None, outputs: dict[str, str],
           go_flags: str, eta: str, progress: Progress | None,
           requires: Sequence[str] = ()) -> None:
    """Build ``outputs`` (binary name -> Go package) into ``dest/bin``, holding
    ``dest/build.lock``. With ``module_dir`` None, a throwaway module under
    ``dest`` requires ``requires``."""
    say = progress or (lambda _line: None)
    bin_dir = dest / "bin"
    dest.mkdir(parents=True, exist_ok=True)
    with _file_lock(dest / "build.lock", what, say):
        if all((bin_dir / out).is_file() for out in outputs):
            return  # another process built it while we waited
        go = shutil.which("go")
        if go is None:
            raise GoNotFoundError(
                f"building {what} needs Go 1.25 or newer (with cgo and a C compiler), "
                "and there is no `go` on PATH: install it from https://go.dev/dl/"
            )
        env = dict(os.environ)
        env["CGO_ENABLED"] = "1"  # github.com/DataDog/zstd, a Gazette dependency, is cgo
        env["GOWORK"] = "off"
        env["GOFLAGS"] = f"{go_flags} -buildvcs=false"
        log_path = dest / "build.log"
        log_path.write_bytes(b"")
        started = time.monotonic()
        say(f"building {what} with {go}: a cold build takes {eta} "
            f"(then it is cached in {dest})")
        if module_dir is None:
            module_dir = dest / "module"
            shutil.rmtree(module_dir, ignore_errors=True)
            module_dir.mkdir()
            _run_go([go, "mod", "init", "exactly.local/build"], module_dir, env, log_path,
                    what, say, started)
            say(f"fetching the sources of {what} (go get)")
            _run_go([go, "get", *requires], module_dir, env, log_path, what, say, started)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=dest))
        try:
            for out, package in outputs.items():
                say(f"compiling {out}")
                _run_go([go, "build", "-trimpath", "-o", str(tmp / out), package],
                        module_dir, env, log_path, what, say, started)
            bin_dir.mkdir(exist_ok=True)
            for out in outputs:
                os.replace(tmp / out, bin_dir / out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        say(f"built {what} in {_duration(time.monotonic() - started)}")


def _run_go(cmd: list[str], cwd: Path, env: dict[str, str], log_path: Path, what: str,
            say: Progress, started: float) -> None:
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                try:
                    rc = proc.wait(timeout=_HEARTBEAT)
                    break
                except subprocess.TimeoutExpired:
                    say(f"still building {what} "
                        f"({_duration(time.monotonic() - started)} so far)")
        finally:
            if proc.poll() is None:  # interrupted: leave no go process behind
                proc.kill()
                proc.wait()
    if rc != 0:
        raise BuildError(
            f"building {what} failed: `{' '.join(cmd[1:3])} ...` exited with status {rc} "
            f"(log: {log_path})",
            log_path=log_path, log_tail=log_tail(log_path),
        )


@contextlib.contextmanager
def _file_lock(path: Path, what: str, say: Progress) -> Iterator[None]:
    with open(path, "a+b") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another process that is building {what}")
            waited = time.monotonic()
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(0.2)
                    if time.monotonic() - waited >= _HEARTBEAT:
                        waited = time.monotonic()
                        say(f"still waiting for the other build of {what}")
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])
