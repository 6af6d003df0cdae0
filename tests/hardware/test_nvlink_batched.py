"""On real GPUs: NVLink error counters batched in one field-value call, and their cost.

Run on the H200 pair (also runs on one GPU, where the NVLink parts skip; PyTorch not needed; the
project installed with ``pip install --no-deps --no-build-isolation -e .``)::

    NVGPU_HW_OUT=$OUT/hw python3 -m pytest -q -p no:cacheprovider tests/hardware/test_nvlink_batched.py -rs

About a minute. ``NVGPU_HW_BACKEND=fake:<scenario>`` runs the same code on the fake backend (a
dry run without a GPU: ``python3 -m pytest --noconftest`` with ``tests`` on ``PYTHONPATH``, since
the hardware conftest skips everything without nvidia-smi). Writes
``$NVGPU_HW_OUT/nvlink_batched.json`` (when set) with, per GPU:

- ``per_call``: ``nvmlDeviceGetNvLinkErrorCounter`` for every link and counter 0-3 (replay,
  recovery, flit CRC, data CRC), read before and after the batched call, and the time of one sweep
  (median of 5 sweeps);
- ``batched``: one ``nvmlDeviceGetFieldValues`` call with fields 161, 162, 163 scoped per link,
  ``[code, value]`` per entry, and its time (median of 20 calls); the check: every entry SUCCESS
  and between the per-call values read just before and just after (equal when no errors happen);
- ``totals``: the all-lane total fields 38, 45, 52, 59 (answer codes; NOT_SUPPORTED on H200);
- ``bytes``: fields 138/139 with scope 0xFFFFFFFF (all links, what the exporter reads by default)
  against the per-link values summed, read before and after, and the time of each call;
- ``exporter``: the exporter's per-GPU totals (``nvgpu_nvlink_errors_total``) against the per-call
  sums, and the median over 10 samples of ``nvgpu_feature_duration_seconds`` for ``nvlink`` and
  ``nvlink_throughput`` at a 1 s interval (the cost of reading the batched counters every sample).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from exporter_proc import Exporter

ALL_LINKS = 0xFFFFFFFF
COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")
FIELDS = {"replay": 161, "recovery": 162, "crc_flit": 163}
TOTAL_FIELDS = (38, 45, 52, 59)  # NVML_FI_DEV_NVLINK_{CRC_FLIT,CRC_DATA,REPLAY,RECOVERY}_ERROR_COUNT_TOTAL
RESULT: dict[str, Any] = {}


def _record() -> None:
    out = os.environ.get("NVGPU_HW_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "nvlink_batched.json").write_text(json.dumps(RESULT, indent=1, default=str))


def _ms(fn: Callable[[], Any], n: int) -> tuple[float, Any]:
    times, last = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        last = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), last


BACKEND = os.environ.get("NVGPU_HW_BACKEND", "nvml")


@pytest.fixture(scope="module")
def nvml() -> Iterator[Any]:
    from exporter.worker.nvml.backend import load

    real = load(BACKEND)
    real.nvmlInit()
    RESULT.update(
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        driver=real.nvmlSystemGetDriverVersion(),
        nvidia_ml_py=metadata.version("nvidia-ml-py"),
        gpus={},
    )
    yield real
    real.nvmlShutdown()
    _record()


def _links(nvml: Any, handle: Any) -> list[int]:
    links = []
    for link in range(36):
        try:
            nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError:
            break
        links.append(link)
    return links


def _per_call(nvml: Any, handle: Any, links: list[int]) -> dict[str, int | str]:
    out: dict[str, int | str] = {}
    for link in links:
        for counter, name in enumerate(COUNTERS):
            try:
                out[f"{link}/{name}"] = int(nvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter))
            except nvml.NVMLError as exc:
                out[f"{link}/{name}"] = str(exc)
    return out


def _gpus(nvml: Any) -> list[tuple[int, Any, list[int]]]:
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        gpus.append((index, handle, _links(nvml, handle)))
    if not any(links for _, _, links in gpus):
        pytest.skip("no NVLink on this machine")
    return gpus


def _states(scrape: Any, index: str) -> dict[str, float | None]:
    """GPU ``index``'s nvgpu_device_state series (why it has no readings)."""
    return {s.labels["state"]: s.value for s in scrape.find("nvgpu_device_state", gpu=index)}


def test_batched_fields_equal_the_per_call_counters(nvml: Any) -> None:
    for index, handle, links in _gpus(nvml):
        if not links:
            continue
        pairs = [(fid, link) for link in links for fid in FIELDS.values()]
        before = _per_call(nvml, handle, links)
        batched = nvml.field_values(handle, pairs)
        after = _per_call(nvml, handle, links)
        sweep_ms, _ = _ms(lambda h=handle, ls=links: _per_call(nvml, h, ls), 5)
        batched_ms, _ = _ms(lambda h=handle, p=pairs: nvml.field_values(h, p), 20)
        totals = nvml.field_values(handle, [(fid, 0) for fid in TOTAL_FIELDS])
        gpu = RESULT["gpus"].setdefault(str(index), {})
        gpu["links"] = len(links)
        gpu["per_call"] = {"before": before, "after": after, "sweep_ms": sweep_ms, "calls": 4 * len(links)}
        gpu["batched"] = {
            "entries": {f"{e.field_id}/{e.scope_id}": [e.code, e.value] for e in batched},
            "call_ms": batched_ms,
            "entries_per_call": len(pairs),
        }
        gpu["totals"] = {str(e.field_id): [e.code, e.value] for e in totals}
        mismatches = []
        for entry in batched:
            name = next(n for n, fid in FIELDS.items() if fid == entry.field_id)
            key = f"{entry.scope_id}/{name}"
            lo, hi = before[key], after[key]
            if entry.code != 0 or not isinstance(lo, int) or not isinstance(hi, int) or not lo <= entry.value <= hi:
                mismatches.append((key, entry.code, entry.value, lo, hi))
        gpu["batched"]["mismatches"] = mismatches
        _record()
        assert not mismatches, mismatches
        assert batched_ms < sweep_ms, (batched_ms, sweep_ms)


def test_all_links_scope_equals_the_per_link_sum(nvml: Any) -> None:
    for index, handle, links in _gpus(nvml):
        if not links:
            continue
        per_link = [(fid, link) for link in links for fid in (138, 139)]
        scope = [(138, ALL_LINKS), (139, ALL_LINKS)]

        def sums(h: Any = handle, pairs: list[tuple[int, int]] = per_link) -> dict[int, int]:
            out = {138: 0, 139: 0}
            for e in nvml.field_values(h, pairs):
                assert e.code == 0, e
                out[e.field_id] += int(e.value)
            return out

        before = sums()
        entries = nvml.field_values(handle, scope)
        after = sums()
        per_link_ms, _ = _ms(lambda h=handle, p=per_link: nvml.field_values(h, p), 20)
        scope_ms, _ = _ms(lambda h=handle, p=scope: nvml.field_values(h, p), 20)
        got = {e.field_id: [e.code, e.value] for e in entries}
        RESULT["gpus"].setdefault(str(index), {})["bytes"] = {
            "per_link_sum_before_kib": before,
            "all_links_kib": got,
            "per_link_sum_after_kib": after,
            "per_link_call_ms": per_link_ms,
            "all_links_call_ms": scope_ms,
        }
        _record()
        for fid in (138, 139):
            code, value = got[fid]
            assert code == 0, (fid, code)
            # whole KiB per link: the driver's sum may round each link's bytes once, not 18 times
            slack = len(links)
            assert before[fid] - slack <= value <= after[fid] + slack, (fid, before[fid], value, after[fid])


def test_the_exporter_reads_the_same_totals_every_sample(nvml: Any, tmp_path: Path) -> None:
    gpus = _gpus(nvml)
    with Exporter(None, tmp_path, env={"NVGPU_NVML_BACKEND": BACKEND}, interval=1.0) as exp:
        exp.wait_for(
            lambda s: s.value("nvgpu_up") == 1.0 and len(s.find("nvgpu_nvlink_errors_total")) > 0,
            timeout=60,
            what="NVLink error totals",
        )
        durations: dict[str, list[float]] = {"nvlink": [], "nvlink_throughput": []}
        seen: set[float] = set()
        deadline = time.monotonic() + 30
        scrape = exp.scrape()
        while len(seen) < 10 and time.monotonic() < deadline:
            scrape = exp.scrape()
            ts = scrape.value("nvgpu_last_sample_timestamp_seconds") or 0.0
            if ts not in seen:
                seen.add(ts)
                for feature, values in durations.items():
                    value = scrape.value("nvgpu_feature_duration_seconds", feature=feature)
                    if value is not None:
                        values.append(value * 1000)
            time.sleep(0.3)
        rows = {}
        for index, handle, links in gpus:
            if not links:
                continue
            direct = _per_call(nvml, handle, links)
            exported = {
                s.labels["error_type"]: s.value for s in scrape.find("nvgpu_nvlink_errors_total", gpu=str(index))
            }
            summed = {
                name: sum(v for k, v in direct.items() if k.endswith("/" + name) and isinstance(v, int))
                for name in COUNTERS
            }
            rows[str(index)] = {"exported": exported, "per_call_sums": summed}
        RESULT["exporter"] = {
            "totals": rows,
            "feature_duration_ms_median": {f: statistics.median(v) if v else None for f, v in durations.items()},
            "feature_duration_ms_all_gpus": durations,
            "samples": len(seen),
        }
        _record()
        for index, row in rows.items():
            assert row["exported"], f"GPU {index} has no nvgpu_nvlink_errors_total: {_states(scrape, index)}"
            for name in ("replay", "recovery", "crc_flit"):
                assert row["exported"][name] <= row["per_call_sums"][name], row  # read a moment earlier
            # data CRC is read every 30 s: at most what the driver counts now
            assert row["exported"]["crc_data"] <= row["per_call_sums"]["crc_data"], row
        assert exp.terminate() == 0
