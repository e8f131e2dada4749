"""``gazctl``, Gazette's command-line client, as the local cluster drives
it: the YAML of a journal spec that ``gazctl journals apply`` reads, running
a command against a broker, the error of one that failed, and a journal's
route from what ``gazctl journals list`` prints."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from exactly._clusterbuild import ClusterError
from exactly._procs import child_env


class GazctlError(ClusterError, subprocess.CalledProcessError):
    """A ``gazctl`` command exited with a non-zero status; ``stderr`` says why."""

    def __str__(self) -> str:
        err = self.stderr.decode(errors="replace").strip() if self.stderr else ""
        last = err.splitlines()[-1] if err else "(no output)"
        cmd = " ".join(str(a) for a in self.cmd[1:])
        text = f"gazctl {cmd} exited with status {self.returncode}: {last}"
        if err and err != last:
            text += f"\n--- gazctl's stderr ---\n{err}"
        return text


# -- journal specs ----------------------------------------------------------------


def journal_spec_yaml(name: str, *, replication: int = 1,
                      content_type: str | None = "application/x-ndjson",
                      labels: Mapping[str, str | Sequence[str]] | None = None,
                      fragment_length: int = 1 << 20,
                      stores: Sequence[str] = ("file:///",),
                      compression: str = "NONE",
                      refresh_interval: str = "10s",
                      flush_interval: str | None = None,
                      revision: int | None = None) -> str:
    """A JournalSpec in the YAML that ``gazctl journals apply`` reads.

    ``content_type`` becomes the ``content-type`` label. The defaults suit a
    local cluster: fragments of 1 MiB kept uncompressed in the brokers'
    ``file:///`` store (under ``GazetteCluster.fragment_root``). A fragment
    is persisted when it is closed: when it reaches ``fragment_length``, or
    ``flush_interval`` (a Go duration, at least ``1m``) after it began.
    Gazette bounds ``fragment_length`` to [1 KiB, 16 GiB]. ``revision``: None
    creates the journal (``apply`` fails if it exists), -1 creates or
    replaces it whatever its current revision.
    """
    pairs: list[tuple[str, str | None]] = []
    if content_type is not None:
        pairs.append(("content-type", content_type))
    for key, value in (labels or {}).items():
        if isinstance(value, str):
            pairs.append((key, value))
        else:
            pairs.extend((key, v) for v in value)
    q = json.dumps  # a JSON string is a YAML string
    lines = [f"name: {q(name)}", f"replication: {replication}"]
    if revision is not None:
        lines.append(f"revision: {revision}")
    if pairs:
        lines.append("labels:")
        for key, label_value in pairs:
            lines.append(f"  - name: {q(key)}")
            if label_value:
                lines.append(f"    value: {q(label_value)}")
    lines += ["fragment:", f"  length: {fragment_length}",
              f"  compression_codec: {compression}",
              f"  refresh_interval: {refresh_interval}"]
    if stores:
        lines.append("  stores:")
        lines += [f"    - {q(s)}" for s in stores]
    if flush_interval:
        lines.append(f"  flush_interval: {flush_interval}")
    return "\n".join(lines) + "\n"


def journal_route(listing: bytes, name: str) -> tuple[int | None, list[str]]:
    """From the output of ``gazctl journals list -l name=NAME -o json``: the
    brokers (by suffix) serving journal ``name``, and which of them is its
    primary (an index into them; None while unassigned). ``ClusterError``
    if there is no such journal."""
    journals = json.loads(listing).get("journals") or []
    if not journals:
        raise ClusterError(f"no journal {name}")
    route = journals[0].get("route") or {}
    suffixes = [str(m.get("suffix", "")) for m in route.get("members") or []]
    primary = route.get("primary", -1)
    return (primary if 0 <= primary < len(suffixes) else None), suffixes


def run_gazctl(gazctl: Path, address: str, args: Sequence[str], *, input: bytes | None,
               check: bool, timeout: float | None,
               env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``gazctl args...`` against the broker at ``address`` (through
    ``BROKER_ADDRESS``, with ``env`` added: a secured cluster's client
    options), capturing its output. With ``check``, a non-zero exit raises
    ``GazctlError``; past ``timeout`` seconds, ``ClusterError``."""
    full = child_env(["BROKER_"])
    full["BROKER_ADDRESS"] = address
    full.update(env or {})
    argv = [str(gazctl), *args]
    try:
        r = subprocess.run(argv, input=input, env=full, capture_output=True, timeout=timeout,
                           stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"gazctl {' '.join(args)} did not finish within {timeout:g}s "
                           f"(BROKER_ADDRESS={address})") from None
    if check and r.returncode != 0:
        raise GazctlError(r.returncode, argv, r.stdout, r.stderr)
    return r
