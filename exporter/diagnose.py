"""``nvgpu-exporter diagnose``: one archive with the incident evidence of this node, changing nothing.

An operator paged at night runs one command on the node (or in the exporter's pod) and attaches
one file to the ticket. It holds, each listed in ``MANIFEST.json`` (and ``MANIFEST.md``) with what
was collected, what was not, and why:

- ``record/``: the incident record of the node and of every GPU (JSON and Markdown, the runbook's
  fields), from the running exporter's ``/api/v1/incidents/``; when the exporter does not answer
  (or ``--offline``), built from its files (the timeline beside the state file) the same way;
- ``exporter/``: the timeline, the verdicts, the exposition, ``/readyz`` and ``/healthz``, the
  state file, the effective settings;
- ``logs/``: the end of each log file given with ``--log-file`` (secrets redacted, below);
- ``commands/``: the output of the runbook's read-only commands (``nvidia-smi`` queries,
  ``nvidia-smi pmon`` for five samples, the kernel log's NVIDIA lines of this boot from
  ``journalctl -k -b 0``, or ``dmesg`` without a journal), each with a hard timeout and all within
  a total budget (:mod:`exporter.diagrun`: a command that hangs is stopped, one that ignores
  SIGTERM is killed with its process group, one that is missing is skipped with that reason).

It never resets, kills (other than its own commands), or changes anything: the commands only read
(``tests/test_diagnose.py`` holds the list), the exporter is only asked over HTTP, files are only
read (never following a link at the name, never blocking on a FIFO). It holds no secrets: the web
config file (passwords, bcrypt hashes, key paths) is never read, and every line of the logs and
command output that carries an ``Authorization`` header, a password, a bcrypt hash, a token or a
PEM private key is replaced by ``[REDACTED]`` (and counted in the manifest).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import stat
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

from exporter import __version__, diagrun

TOTAL_BUDGET_S = 90.0
COMMAND_TIMEOUT_S = 20.0
HTTP_TIMEOUT_S = 5.0
LOG_TAIL_BYTES = 4 << 20
FILE_DEADLINE_S = 10.0  # a file read that takes longer is abandoned (a hung mount)
HTTP_MAX_BYTES = 16 << 20
GPUS_MAX = 64
SECRET = re.compile(
    r"(authorization\s*[:=]|password|passwd|secret|token|api[_-]?key|\$2[abxy]?\$\d\d\$|-----BEGIN [A-Z ]*PRIVATE KEY)",
    re.IGNORECASE,
)
PEM = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL)
NVIDIA_LINE = re.compile(rb"nvrm|xid|nvidia", re.IGNORECASE)


@dataclass
class Item:
    """One entry of the manifest.

    Attributes:
        name: what it is.
        path: where it lies in the archive ("" when nothing was written).
        status: ``collected``, ``skipped``, ``failed``, ``timed_out`` or ``partial``.
        detail: why, in words.
        seconds: how long it took.
        bytes: its size in the archive.
        command: the command line, for a command.
        exit_code: its exit status, for a command that ended.
        redacted: lines replaced by ``[REDACTED]``.
    """

    name: str
    path: str
    status: str
    detail: str = ""
    seconds: float = 0.0
    bytes: int = 0
    command: list[str] | None = None
    exit_code: int | None = None
    redacted: int = 0


@dataclass
class Options:
    """What ``diagnose`` was asked for (the command line)."""

    url: str
    output: str
    state_file: str
    logs: list[str] = field(default_factory=list)
    offline: bool = False
    total_s: float = TOTAL_BUDGET_S
    command_timeout_s: float = COMMAND_TIMEOUT_S
    node: str = ""
    settings: list[str] = field(default_factory=list)
    window_s: float = 3600.0


class Collection:
    """The archive's files, in memory until written, and the manifest."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.files: dict[str, bytes] = {}
        self.items: list[Item] = []

    def add(self, name: str, path: str, data: bytes, detail: str = "", **more: Any) -> Item:
        """Keep ``data`` at ``path``, redacted; returns its manifest entry."""
        clean, redacted = redact(data)
        self.files[path] = clean
        item = Item(name, path, more.pop("status", "collected"), detail, bytes=len(clean), redacted=redacted, **more)
        self.items.append(item)
        return item

    def miss(self, name: str, status: str, detail: str, **more: Any) -> Item:
        """Record what was not collected, and why."""
        item = Item(name, "", status, detail, **more)
        self.items.append(item)
        return item


def redact(data: bytes) -> tuple[bytes, int]:
    """``data`` with PEM private keys and every line that looks like a secret replaced by
    ``[REDACTED]``; and how many were."""
    count = 0

    def pem(_m: re.Match[bytes]) -> bytes:
        nonlocal count
        count += 1
        return b"[REDACTED]"

    data = PEM.sub(pem, data)
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if SECRET.search(line.decode("utf-8", "replace")):
            lines[i] = b"[REDACTED]"
            count += 1
    return b"\n".join(lines), count


def _get(url: str, timeout_s: float) -> tuple[int, bytes]:
    """(status, body) of a GET; raises OSError when there is no answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - the local exporter's URL
            return int(response.status), response.read(HTTP_MAX_BYTES)
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(65536)


def collect_live(opts: Options, out: Collection, deadline: float) -> bool:
    """Ask the running exporter; False (and why in the manifest) when it does not answer."""
    base = opts.url.rstrip("/")
    try:
        status, body = _get(base + "/api/v1/verdicts", min(HTTP_TIMEOUT_S, max(deadline - time.monotonic(), 0.1)))
    except (OSError, ValueError) as exc:
        out.miss("the running exporter", "failed", f"{base} does not answer ({exc}): the records come from its files")
        return False
    if status != 200:
        why = "it asks for authentication (web config)" if status in (401, 403) else f"HTTP {status}"
        out.miss("the running exporter", "failed", f"{base}/api/v1/verdicts: {why}: the records come from its files")
        return False
    out.add("verdicts", "exporter/verdicts.json", body, base + "/api/v1/verdicts")
    try:
        gpus = [g for g in json.loads(body).get("gpus", []) if isinstance(g, dict) and g.get("uuid")][:GPUS_MAX]
    except (ValueError, AttributeError):
        gpus = []
    paths = [
        ("timeline", "/api/v1/timeline?limit=20000", "exporter/timeline.json"),
        ("exposition", "/metrics", "exporter/metrics.txt"),
        ("readiness", "/readyz", "exporter/readyz.txt"),
        ("liveness", "/healthz", "exporter/healthz.txt"),
        ("node record", "/api/v1/incidents/node", "record/node.json"),
        ("node record (Markdown)", "/api/v1/incidents/node?format=markdown", "record/node.md"),
    ]
    for g in gpus:
        stem = f"record/gpu-{g.get('gpu')}-{g.get('uuid')}"
        paths.append((f"GPU {g.get('gpu')} record", f"/api/v1/incidents/{g.get('uuid')}", stem + ".json"))
        paths.append(
            (
                f"GPU {g.get('gpu')} record (Markdown)",
                f"/api/v1/incidents/{g.get('uuid')}?format=markdown",
                stem + ".md",
            )
        )
    for name, path, where in paths:
        left = deadline - time.monotonic()
        if left <= 0:
            out.miss(name, "skipped", "the total time budget is spent")
            continue
        start = time.monotonic()
        try:
            status, body = _get(base + path, min(HTTP_TIMEOUT_S, left))
        except (OSError, ValueError) as exc:
            out.miss(name, "failed", f"{base}{path}: {exc}", seconds=time.monotonic() - start)
            continue
        # /readyz and /healthz answer 503 with the reason: that is evidence too
        kept = status == 200 or path in ("/readyz", "/healthz")
        if kept:
            out.add(name, where, body, f"{base}{path} (HTTP {status})", seconds=time.monotonic() - start)
        else:
            out.miss(name, "failed", f"{base}{path}: HTTP {status}", seconds=time.monotonic() - start)
    return True


def collect_files(opts: Options, out: Collection) -> None:
    """The exporter's own files: the state file and the timeline, and (offline) the records built
    from them."""
    from exporter.supervisor.timelinefile import path_beside, read_bounded

    if not opts.state_file:
        out.miss("state file", "skipped", "NVGPU_STATE_FILE is empty: quarantines and the timeline live in memory only")
        return
    for name, path, where in (
        ("state file", opts.state_file, "exporter/state.json"),
        ("timeline file", path_beside(opts.state_file), "exporter/timeline-file.json"),
    ):
        try:
            out.add(name, where, read_bounded(path, 16 << 20), path)
        except FileNotFoundError:
            out.miss(name, "skipped", f"{path} does not exist (nothing written yet, or another path)")
        except (OSError, ValueError) as exc:
            out.miss(name, "failed", f"{path}: {exc}")


def records_from_files(opts: Options, out: Collection) -> list[dict[str, Any]]:
    """Build the records from the timeline file (the exporter is down); returns the GPU records."""
    from exporter.supervisor import incident
    from exporter.supervisor.incidentmd import markdown
    from exporter.supervisor.recovery import RecoveryTracker
    from exporter.supervisor.timeline import Timeline
    from exporter.supervisor.timelinefile import path_beside

    path = path_beside(opts.state_file)
    if not path:
        out.miss("records", "skipped", "no state file, so no timeline file: no record can be built offline")
        return []
    timeline = Timeline(path)
    timeline.path = ""  # read only: a record built offline never writes the exporter's file
    if timeline.load_error:
        out.miss("records", "failed", f"timeline file {path}: {timeline.load_error}")
        return []
    recovery = RecoveryTracker(timeline, opts.window_s)
    now = incident.now_from_files(timeline, opts.node)
    gpus = []
    targets = [("node", "node", "record/node")]
    targets += [(g.uuid, f"GPU {g.index}", f"record/gpu-{g.index}-{g.uuid}") for g in now.gpus[:GPUS_MAX]]
    for target, name, stem in targets:
        rec = incident.record(now, timeline, recovery, target, opts.window_s)
        body = json.dumps(rec, indent=1, sort_keys=True).encode()
        out.add(f"{name} record (from files)", stem + ".json", body, f"built from {path}")
        out.add(f"{name} record (Markdown, from files)", stem + ".md", markdown(rec).encode(), f"built from {path}")
        if target != "node":
            gpus.append(rec)
    return gpus


def collect_logs(opts: Options, out: Collection) -> None:
    """The end of each ``--log-file`` (regular files only, read without blocking, on a thread within
    :data:`FILE_DEADLINE_S`: a log on a hung mount is abandoned, never waited on), redacted."""
    from exporter.common import fileio

    if not opts.logs:
        out.miss("exporter logs", "skipped", "no --log-file given (kubectl logs <exporter pod> prints them)")
    for n, path in enumerate(opts.logs):
        try:
            data, size = fileio.default_runner().call(_tail, path, deadline_s=FILE_DEADLINE_S)
        except fileio.TimedOut:
            out.miss(f"log {path}", "timed_out", f"no answer within {FILE_DEADLINE_S:g} s (a hung mount?)")
            continue
        except ValueError as exc:
            out.miss(f"log {path}", "skipped", str(exc))
            continue
        except OSError as exc:
            out.miss(f"log {path}", "failed", exc.strerror or str(exc))
            continue
        cut = size > LOG_TAIL_BYTES
        out.add(
            f"log {path}",
            f"logs/{n}-{os.path.basename(path) or 'log'}",
            data,
            f"the last {len(data)} of {size} bytes" if cut else path,
            status="partial" if cut else "collected",
        )


def _tail(path: str) -> tuple[bytes, int]:
    """The last :data:`LOG_TAIL_BYTES` of the regular file ``path`` and its size.

    Raises:
        OSError: it cannot be opened or read.
        ValueError: it is not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not _regular(st.st_mode):
            raise ValueError("not a regular file")
        fh.seek(max(st.st_size - LOG_TAIL_BYTES, 0))
        return fh.read(LOG_TAIL_BYTES), st.st_size


def _regular(mode: int) -> bool:
    return stat.S_ISREG(mode)


def plan(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The commands to run, most telling first: the kernel log, each GPU's that is not ok, then the
    node's (no command twice)."""
    from exporter.supervisor import runbook

    node = runbook.node_commands()
    chosen = [c for c in node if c["name"].startswith("kernel-log")]
    for g in gpus:
        sig = g.get("signature", {})
        ident = g.get("affected", {}).get("gpu", {})
        if sig.get("verdict") not in ("ok", "unknown") or g.get("status") not in ("none", "recovered"):
            for cmd in runbook.gpu_commands(str(ident.get("index", "")), str(ident.get("pci_bus_id", ""))):
                if cmd["name"] in ("nvidia-smi-q", "query-gpu"):
                    cmd["name"] += f"-gpu{ident.get('index')}"
                    chosen.append(cmd)
    chosen += [c for c in node if not c["name"].startswith("kernel-log")]
    seen: set[tuple[str, ...]] = set()
    out = []
    for cmd in chosen:
        if tuple(cmd["argv"]) not in seen:
            seen.add(tuple(cmd["argv"]))
            out.append(cmd)
    return out


def run_commands(commands: list[dict[str, Any]], opts: Options, out: Collection, deadline: float) -> None:
    """Run each command bounded (its time, less what stopping it may take, within what is left of the
    budget); the kernel log from dmesg only when journalctl gave no NVIDIA line; after one
    ``nvidia-smi`` ran out of time, no other (the driver does not answer: each would wait as long)."""
    journal_ok = False
    hung: set[str] = set()
    for cmd in commands:
        if cmd["name"] == "kernel-log-dmesg" and journal_ok:
            out.miss(cmd["name"], "skipped", "journalctl -k -b 0 gave the NVIDIA lines", command=cmd["argv"])
            continue
        if cmd["argv"][0] in hung:
            why = f"an earlier {cmd['argv'][0]} did not answer in its time (the driver may be hung)"
            out.miss(cmd["name"], "skipped", why, command=cmd["argv"])
            continue
        left = deadline - time.monotonic() - 2 * diagrun.GRACE_S
        res = diagrun.run(cmd["argv"], min(opts.command_timeout_s, left))
        if res.status == "timed_out":
            hung.add(cmd["argv"][0])
        body = res.output
        if cmd.get("filter") and res.status == "ok":
            lines = body.split(b"\n")
            kept = [line for line in lines if NVIDIA_LINE.search(line)]
            body = b"\n".join(kept) + (b"\n" if kept else b"")
            journal_ok = journal_ok or (cmd["name"] == "kernel-log-journalctl" and bool(kept))
            detail = f"{res.detail}; {len(kept)} NVIDIA lines of {len(lines)}"
        else:
            detail = res.detail
        where = f"commands/{cmd['name']}.txt"
        status = {"ok": "collected", "failed": "failed", "timed_out": "timed_out"}.get(res.status, res.status)
        if res.status in ("skipped", "error"):
            out.miss(cmd["name"], "skipped" if res.status == "skipped" else "failed", res.detail, command=cmd["argv"])
        else:
            head = f"$ {cmd['shell']}\n# {detail}\n".encode()
            out.add(
                cmd["name"],
                where,
                head + body,
                detail,
                status=status,
                seconds=round(res.seconds, 3),
                command=cmd["argv"],
                exit_code=res.exit_code,
            )


def manifest(opts: Options, out: Collection, started: float) -> dict[str, Any]:
    """What was collected, what was not and why, and what diagnose never does."""
    return {
        "schema_version": 1,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "exporter_version": __version__,
        "node": opts.node,
        "url": opts.url,
        "offline": opts.offline,
        "seconds": round(time.monotonic() - started, 3),
        "budget_seconds": opts.total_s,
        "command_timeout_seconds": opts.command_timeout_s,
        "items": [asdict(i) for i in out.items],
        "not_collected": [f"{i.name}: {i.status}: {i.detail}" for i in out.items if i.status not in ("collected",)],
        "never": "diagnose resets nothing, kills nothing but its own commands, changes no file or setting; the "
        "web config file is never read; lines that look like secrets are [REDACTED]",
    }


def _manifest_md(m: dict[str, Any]) -> bytes:
    rows = [
        f"| {i['name']} | {i['status']} | {i['path'] or '-'} | {str(i['detail']).replace('|', '/')} |"
        for i in m["items"]
    ]
    text = [
        f"# nvgpu-exporter diagnose, node {m['node']}, {m['created_at']}",
        "",
        f"{len([i for i in m['items'] if i['status'] == 'collected'])} items collected, "
        f"{len(m['not_collected'])} not (or in part), in {m['seconds']} s. {m['never']}.",
        "",
        "| item | status | file | detail |",
        "|---|---|---|---|",
        *rows,
    ]
    return ("\n".join(text) + "\n").encode()


def write(out: Collection, path: str) -> None:
    """The archive, written atomically (a temporary file in the same directory, then renamed)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".nvgpu-diagnose-", suffix=".tar.gz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for name, data in out.files.items():
                info = tarfile.TarInfo(f"{out.root}/{name}")
                info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
                tar.addfile(info, io.BytesIO(data))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def diagnose(opts: Options) -> tuple[str, dict[str, Any]]:
    """Collect everything (see the module docstring) and write the archive; returns (path, manifest).

    Raises:
        OSError: the archive cannot be written.
    """
    started = time.monotonic()
    deadline = started + opts.total_s
    opts.node = opts.node or socket.gethostname()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    root = f"nvgpu-diagnose-{re.sub(r'[^A-Za-z0-9._-]', '_', opts.node)}-{stamp}"
    out = Collection(root)
    live = False if opts.offline else collect_live(opts, out, deadline)
    if opts.offline:
        out.miss("the running exporter", "skipped", "--offline: the records come from its files")
    collect_files(opts, out)
    if live:
        gpus = [json.loads(out.files[p]) for p in out.files if p.startswith("record/gpu-") and p.endswith(".json")]
    else:
        gpus = records_from_files(opts, out)
    out.add("effective settings", "exporter/settings.txt", ("\n".join(opts.settings) + "\n").encode())
    collect_logs(opts, out)
    run_commands(plan(gpus), opts, out, deadline)
    m = manifest(opts, out, started)
    out.files["MANIFEST.json"] = json.dumps(m, indent=1).encode()
    out.files["MANIFEST.md"] = _manifest_md(m)
    path = opts.output or f"{root}.tar.gz"
    write(out, path)
    return path, m
