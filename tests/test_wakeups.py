"""Nothing in the supervisor polls on a fixed period: the worker's watch, the probe loop and the
kernel log wake on what they wait for, and every hang deadline stays as strict.

- ``WorkerProcess.run`` waits for the worker's exit, its deadline (a timer armed for the deadline
  itself) or :meth:`WorkerProcess.wake` (the caller's ``stopping()`` may have turned true); the
  hello brings the sample deadline forward when it is sooner than the init deadline.
- ``Prober`` sleeps until the earliest probe is due or :meth:`Prober.poke`.
- ``KernelXid`` waits for ``/dev/kmsg`` to be readable; a device that cannot be polled is read on
  the timer.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from exporter.common import protocol
from exporter.config import Config
from exporter.supervisor.accounting import Accountant
from exporter.supervisor.gpuhealth import GpuRecord
from exporter.supervisor.kernel_xid import KernelXid
from exporter.supervisor.policy import RestartPolicy
from exporter.supervisor.probes import Prober
from exporter.supervisor.quarantine import QuarantineStore
from exporter.supervisor.served import ServedState
from exporter.supervisor.workerproc import WorkerProcess


class NoCrumbs:
    def in_flight(self) -> list[Any]:
        return []


async def stand_in(worker: WorkerProcess, lines: list[tuple[float, bytes]] = ()) -> asyncio.StreamReader:  # type: ignore[assignment]
    """A child that only sleeps in the worker's place; ``lines`` are fed to its message stream
    after the given delays, then the stream ends."""
    worker.proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import time; time.sleep(60)",
        stdin=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    worker.spawned_mono = time.monotonic()
    reader = asyncio.StreamReader()

    async def feed() -> None:
        for delay, line in lines:
            await asyncio.sleep(delay)  # the stand-in's lines arrive this much apart: the delay is the point
            reader.feed_data(line)

    asyncio.ensure_future(feed())
    return reader


def worker(deadlines: tuple[float, float], seen: list[Any] | None = None) -> WorkerProcess:
    return WorkerProcess({}, NoCrumbs(), (seen if seen is not None else []).append, deadlines)  # type: ignore[arg-type]


async def test_the_watch_ends_on_wake_once_stopping() -> None:
    w = worker((60.0, 60.0))
    stopping = [False]
    task = asyncio.ensure_future(w.run(await stand_in(w), lambda: stopping[0], 0.2))
    await asyncio.sleep(0.2)  # time for the watch to start and wait
    w.wake()  # stopping() still false: nothing happens
    await asyncio.sleep(0.2)  # time in which nothing may happen: the watch must still be waiting
    assert not task.done()
    stopping[0] = True
    w.wake()
    out = await asyncio.wait_for(task, 20.0)
    assert out.reason == "stopped" and out.reaped


async def test_a_missed_sample_deadline_kills_the_worker() -> None:
    w = worker((60.0, 0.5))
    w.hello, w.last_message_mono = True, time.monotonic()
    out = await asyncio.wait_for(w.run(await stand_in(w), lambda: False, 0.2), 20.0)
    assert out.reason == "hang" and w.killed_for_hang


async def test_the_hello_brings_the_sample_deadline_forward() -> None:
    """Init deadline 60 s, sample deadline 0.5 s: the worker that says hello and then nothing is
    killed for missing the sample deadline, not left until the init deadline."""
    seen: list[Any] = []
    w = worker((60.0, 0.5), seen)
    hello = protocol.encode("hello", pid=1, system={}, gpus=[], feature_states={})
    out = await asyncio.wait_for(w.run(await stand_in(w, [(0.3, hello)]), lambda: False, 0.2), 20.0)
    assert [type(m).__name__ for m in seen] == ["Hello"]
    assert out.reason == "hang"
    assert time.monotonic() - w.last_message_mono >= 0.5  # killed only once the deadline had passed


@pytest.fixture
def prober() -> Iterator[Prober]:
    config = Config(state_file="")
    quarantine = QuarantineStore("", 3, 600.0, 86400.0)
    state = ServedState(config, quarantine, [])
    accountant = Accountant(config, state, quarantine, RestartPolicy(1.0, 60.0, 30.0, ()))
    stopped = [False]
    p = Prober(
        config, state, quarantine, accountant, time.time(), lambda _pid: None, lambda _i: None, lambda: stopped[0]
    )
    yield p
    stopped[0] = True
    p.close()


async def test_the_probe_loop_sleeps_until_poked(prober: Prober) -> None:
    task = asyncio.ensure_future(prober._sleep())
    await asyncio.sleep(0.2)  # time for the loop to start waiting
    prober.poke()  # nothing scheduled: the schedule did not change, no wake
    await asyncio.sleep(0.1)  # time in which the poke must not end the wait
    assert not task.done()
    rec = prober.state.health.gpus[0] = GpuRecord(0, "GPU-0")
    rec.next_probe = prober.state.health.clock() - 1.0  # due
    prober.poke()
    await asyncio.wait_for(task, 5.0)


async def test_the_probe_loop_wakes_for_a_due_probe_by_itself(prober: Prober) -> None:
    rec = prober.state.health.gpus[0] = GpuRecord(0, "GPU-0")
    rec.next_probe = prober.state.health.clock() + 0.3
    await asyncio.wait_for(prober._sleep(), 10.0)
    assert prober.state.health.due_probe() is rec


async def test_a_kernel_log_that_cannot_be_polled_is_read_on_the_timer(tmp_path: Any) -> None:
    """/dev/null is a character device without poll support (epoll refuses it with EPERM)."""
    ext = KernelXid(Config(state_file="", kmsg_path=os.devnull))
    ext.reader._devices = None  # the reader takes /dev/kmsg only: let it open the stand-in
    ext.reader.open()
    try:
        await asyncio.wait_for(ext._readable(), 5.0)
        assert ext._pollable is False
    finally:
        ext.reader.close()
