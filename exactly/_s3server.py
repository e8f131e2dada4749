"""A throwaway S3-compatible server on 127.0.0.1: SeaweedFS (Apache-2.0),
for fragment stores in the cloud as Gazette brokers use them.

``S3Server(workdir).start()`` builds (once, cached) and starts ``weed mini``
— a master, a volume server, a filer and the S3 gateway in one process —
with every port of its own picked free, its credentials (``access_key``,
``secret_key``) and one bucket made at start (``bucket``). ``aws_env()`` is
what a broker needs in its environment to reach it; ``store_url(prefix)``
the ``s3://`` fragment store URL of a journal spec. Stopped by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote

from ._clusterbuild import ClusterError, ensure_seaweedfs, log_tail
from ._procs import free_ports, port_open

#: The region S3 clients must name (any will do for SeaweedFS).
REGION = "us-east-1"


class S3Server:
    """SeaweedFS's S3 gateway on 127.0.0.1 (see the module docstring)."""

    def __init__(self, workdir: str | os.PathLike[str], *, bucket: str = "fragments") -> None:
        self.workdir = Path(workdir).resolve()
        self.bucket = bucket
        self.access_key = "exactly" + secrets.token_hex(4)
        self.secret_key = secrets.token_hex(16)
        self.port = 0
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._popen is None else self._popen.pid

    def aws_env(self) -> dict[str, str]:
        """The environment of a process (a broker) that reaches this server."""
        return {"AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": REGION}

    def store_url(self, prefix: str = "") -> str:
        """A Gazette fragment store URL in this server's bucket, under ``prefix``."""
        query = f"endpoint={quote(self.endpoint, safe='')}&region={REGION}"
        return f"s3://{self.bucket}/{prefix}?{query}"

    def start(self, timeout: float = 60.0) -> Self:
        weed = ensure_seaweedfs()
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "exactly",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        os.chmod(config, 0o600)
        (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc,
         admin, admin_grpc) = free_ports(10)
        self.port = s3
        log_path = self.workdir / "weed.log"
        argv = [
            str(weed), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}", f"-s3.config={config}",
            f"-admin.port={admin}", f"-admin.port.grpc={admin_grpc}",
            "-admin.port.legacy=0", "-admin.ui=false", "-webdav=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-bucket={self.bucket}",
            "-master.volumeSizeLimitMB=64",
        ]
        with open(log_path, "ab") as log:
            self._popen = subprocess.Popen(argv, cwd=self.workdir, stdin=subprocess.DEVNULL,
                                           stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._ready():
            assert self._popen is not None
            if self._popen.poll() is not None or time.monotonic() > deadline:
                tail = log_tail(log_path)
                self.stop()
                raise ClusterError(f"the S3 server did not start (log: {log_path})\n{tail}")
            time.sleep(0.2)
        return self

    def _ready(self) -> bool:
        """The gateway answers, and the bucket exists (a signed request would
        be refused; an unsigned HEAD of the bucket says 403 once it does)."""
        if not port_open(self.port):
            return False
        request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="HEAD")
        try:
            with urllib.request.urlopen(request, timeout=2):
                return True
        except urllib.error.HTTPError as err:
            return err.code in (200, 301, 403)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        popen, self._popen = self._popen, None
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(timeout=10)

    def remove(self) -> None:
        """Stop, and remove the server's data."""
        self.stop()
        shutil.rmtree(self.workdir / "data", ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
