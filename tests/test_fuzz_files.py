"""Property tests (Hypothesis): any kind of file at any path a setting names, and a
stop signal at any moment.

- Every reader of an operator's file (the bounded reader itself, the web config and a key it names,
  the state file, the kernel-log cursor and the kernel log, a scenario), given a regular file, a
  FIFO, a device node, a symbolic-link loop, a directory, a huge file, an unreadable path, a
  socket, a dangling link or nothing, answers within a deadline with a value or its own clear
  error naming the path; never another exception, never a wait (a FIFO opened plainly would wait
  for a writer forever; the check runs each reader on a thread and fails after 20 s).
- A SIGTERM or SIGINT at a random moment while the exporter serves with hostile inputs (a FIFO
  state file, a FIFO kernel-log cursor, a bcrypt in progress) ends it with 0 within the shutdown
  timeout, and no worker outlives it.

Budgets as in tests/fuzzing.py (``ci``: derandomized; ``NVGPU_FUZZ_EXAMPLES`` raises the signal
property's, which starts a real exporter per example).
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from fuzzing import STOP_SIGNALS, bounded_memory, file_kinds, make_file_kind, signal_delays
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.common import fileio
from exporter.common.scenarios.scenario import ScenarioError, load_scenario
from exporter.supervisor.http.webmodel import WebConfigError
from exporter.supervisor.http.webtls import load_with_context
from exporter.supervisor.quarantine import QuarantineStore
from exporter.supervisor.xid.cursor import Cursor
from exporter.supervisor.xid.reader import KernelLogUnavailable, KmsgReader

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("NVGPU_FUZZ_EXAMPLES", "0") or 0)
CONTENT = st.one_of(st.binary(max_size=200), st.sampled_from([b"{}", b'{"version": 1}', b"basic_auth_users: {}\n"]))


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()`` on a daemon thread; fails the test when it has not answered within ``seconds``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"no answer within {seconds} s: it waits on the file"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def fresh_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="nvgpu-fuzz-files-"))


@given(kind=file_kinds, content=CONTENT, bound=st.integers(min_value=0, max_value=400))
def test_the_bounded_reader_reads_a_regular_file_or_refuses_it_at_once(kind: str, content: bytes, bound: int) -> None:
    directory = fresh_dir()
    try:
        path = make_file_kind(directory, kind, content)
        with bounded_memory():
            try:
                got = within(20, lambda: fileio.read_bytes(path, bound))
            except fileio.FileRefused as exc:
                assert exc.path == path and exc.reason in fileio.REASONS and exc.detail
                assert not (kind == "regular" and len(content) <= bound), exc
            else:
                assert kind == "regular" and got == content and len(content) <= bound
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _web_config(directory: Path, path: str) -> None:
    load_with_context(path)


def _web_config_key(directory: Path, path: str) -> None:
    shutil.copy(ROOT / "tests" / "fixtures" / "webconfig" / "README.md", directory / "cert.pem")
    web = directory / "web.yml"
    web.write_text(f"tls_server_config: {{cert_file: cert.pem, key_file: {path!r}}}\n")
    load_with_context(str(web))


def _state_file(directory: Path, path: str) -> None:
    store = QuarantineStore(path, threshold=1, window_s=60, ttl_s=60)
    store.record("fan", "nvmlDeviceGetFanSpeed_v2")  # written (regular) or refused: never waits


def _cursor(directory: Path, path: str) -> None:
    Cursor(path, "/dev/kmsg").load(device=True, boot_id=None, identity=None, size=0)


def _kernel_log(directory: Path, path: str) -> None:
    with KmsgReader(path, None, boot_id_path=None) as reader:
        reader.poll()


def _scenario(directory: Path, path: str) -> None:
    load_scenario(path)


LOADERS: dict[str, tuple[Callable[[Path, str], None], tuple[type[BaseException], ...]]] = {
    "web_config": (_web_config, (WebConfigError,)),
    "web_config_key": (_web_config_key, (WebConfigError,)),
    "state_file": (_state_file, ()),
    "kmsg_cursor": (_cursor, ()),
    "kernel_log": (_kernel_log, (KernelLogUnavailable,)),
    "scenario": (_scenario, (ScenarioError,)),
}


@given(loader=st.sampled_from(sorted(LOADERS)), kind=file_kinds, content=CONTENT)
def test_every_reader_answers_any_kind_of_file_with_a_value_or_a_clear_error(
    loader: str, kind: str, content: bytes
) -> None:
    """The state file and the cursor never raise (a bad file counts as empty, logged); the others
    raise only their own error, naming the path."""
    directory = fresh_dir()
    try:
        path = make_file_kind(directory, kind, content)
        fn, errors = LOADERS[loader]
        try:
            within(20, lambda: fn(directory, path))
        except errors as exc:
            assert path in str(exc) or os.path.abspath(path) in str(exc), exc
        if loader == "state_file" and kind in ("fifo", "device", "socket", "directory"):
            assert not os.path.isfile(path), "a node that is not a regular file is never replaced"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- a stop signal at any moment ---------------------------------------------------------------------


def _hostile_env(tmp: Path, setup: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    env.update(
        {
            "NVGPU_NVML_BACKEND": "fake:h200x1",
            "NVGPU_SAMPLE_INTERVAL_SECONDS": "0.5",
            "NVGPU_SHUTDOWN_TIMEOUT_SECONDS": "3",
            "NVGPU_STATE_FILE": str(tmp / "state.json"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if setup == "fifo_state_file":
        os.mkfifo(tmp / "state.json")
    elif setup == "fifo_kmsg_cursor":
        (tmp / "kern.log").write_text("")
        os.mkfifo(tmp / "cursor.json")
        env.update(
            NVGPU_FEATURE_KERNEL_XID="on",
            NVGPU_KMSG_PATH=str(tmp / "kern.log"),
            NVGPU_KMSG_CURSOR_FILE=str(tmp / "cursor.json"),
        )
    else:
        assert setup == "bcrypt_in_progress", setup
        from tls_material import bcrypt_hash

        (tmp / "web.yml").write_text(f"basic_auth_users:\n  prometheus: {bcrypt_hash()}\n")
        env["NVGPU_WEB_CONFIG_FILE"] = str(tmp / "web.yml")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@settings(max_examples=EXAMPLES or 3)
@given(
    setup=st.sampled_from(["fifo_state_file", "fifo_kmsg_cursor", "bcrypt_in_progress"]),
    signame=STOP_SIGNALS,
    delay=signal_delays,
)
def test_a_stop_signal_at_any_moment_ends_the_exporter_cleanly(setup: str, signame: str, delay: float) -> None:
    tmp = fresh_dir()
    try:
        env = _hostile_env(tmp, setup)
        port = _free_port()
        env["NVGPU_LISTEN_ADDRESS"] = f"127.0.0.1:{port}"
        entry = (
            [str(ROOT / "tests" / "faultinject.py"), "slow_bcrypt"]
            if setup == "bcrypt_in_progress"
            else ["-m", "exporter"]
        )
        with open(tmp / "log", "wb") as log:
            proc = subprocess.Popen([sys.executable, *entry], env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, (tmp / "log").read_text()[-2000:]
                    time.sleep(0.05)  # waiting for the port: polling, not a guess
            if setup == "bcrypt_in_progress":
                conn = socket.create_connection(("127.0.0.1", port), timeout=5)
                auth = base64.b64encode(b"prometheus:slow")
                conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic " + auth + b"\r\n\r\n")
            children = psutil.Process(proc.pid).children(recursive=True)
            time.sleep(delay)  # the point: the signal arrives at a random moment of serving
            proc.send_signal(getattr(signal, signame))
            assert proc.wait(timeout=3 + 5) == 0, (tmp / "log").read_text()[-2000:]
            assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
