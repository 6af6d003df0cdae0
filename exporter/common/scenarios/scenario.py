"""Scenario files for the fake NVML backend: loading and strict validation (docs/scenarios.md).

Standard library only, so the supervisor (and ``--check-config``) can reject a bad scenario before
anything starts, without importing ``pynvml``. Every error names the file, the place and what was
expected. One walk does both jobs: :func:`validate` checks a scenario, :func:`compile_scenario`
returns the same object with each value spec built (:mod:`exporter.common.scenarios.spec`), which is what
the fake answers from.
"""

from __future__ import annotations

import json
import re
from typing import Any

from exporter.common import fileio
from exporter.common.scenarios import spec
from exporter.common.scenarios.spec import SpecError, check_error, fail, is_int, is_number

EVENT_TYPES: dict[str, int] = {
    "SingleBitEccError": 0x1,
    "DoubleBitEccError": 0x2,
    "PState": 0x4,
    "XidCriticalError": 0x8,
    "Clock": 0x10,
    "PowerSourceChange": 0x80,
    "MigConfigChange": 0x100,
    "SingleBitEccErrorStorm": 0x200,
    "DramRetirementEvent": 0x400,
    "DramRetirementFailure": 0x800,
    "NonFatalPoisonError": 0x1000,
    "FatalPoisonError": 0x2000,
    "GpuUnavailableError": 0x4000,
    "GpuRecoveryAction": 0x8000,
}

_TOP_KEYS = {
    "description",
    "driver_version",
    "nvml_version",
    "kernel_module_version",
    "cuda_driver_version",
    "native_library",
    "missing_functions",
    "gpus",
    "enumeration",
    "faults",
    "events",
    "comment",
}
_VERSION_KEYS = ("driver_version", "nvml_version", "kernel_module_version")  # a string or a value spec
_GPU_KEYS = {
    "name",
    "uuid",
    "serial",
    "pci_bus_id",
    "minor_number",
    "architecture",
    "values",
    "fields",
    "default_field_error",
    "nvlink_link_count",
    "mig",
    "comment",
}
_FAULT_KEYS = {
    "function",
    "gpu",
    "fields",
    "from_s",
    "until_s",
    "calls",
    "after_calls",
    "action",
    "error",
    "seconds",
    "ignore_sigterm",
    "exclusive",
    "code",
    "comment",
}
_ACTIONS = {"error", "segfault", "abort", "hang", "delay", "exit"}
_VALUE_KEY = re.compile(r"^nvml[A-Za-z0-9_]+(:[^:]+)?$")
_FIELD_KEY = re.compile(r"^\d+(:\d+)?$")

MAX_BYTES = 16 << 20  # the largest shipped scenario (8 GPUs) is 66 KB; memory is bounded by this
MAX_DEPTH = 32  # the deepest real spec (a struct in a cycle in a sequence) is under 10


class ScenarioError(ValueError):
    """The scenario file is not valid; the message names the file, the place and the expectation."""


def load_scenario(path: str) -> dict[str, Any]:
    """Read and validate a scenario file.

    Returns:
        The scenario as parsed JSON.

    Raises:
        ScenarioError: unreadable, larger than :data:`MAX_BYTES`, not UTF-8, not JSON (NaN and
            Infinity included), nested deeper than :data:`MAX_DEPTH`, or not a valid scenario; the
            message says where and what was expected.
    """
    data = _read(path)
    validate(path, data)
    return data  # type: ignore[no-any-return]


def load_compiled(path: str) -> dict[str, Any]:
    """Read a scenario file and compile it (:func:`compile_scenario`); raises as :func:`load_scenario`."""
    return compile_scenario(path, _read(path))


def validate(path: str, data: Any) -> None:
    """Check a parsed scenario; raises ScenarioError on the first problem."""
    compile_scenario(path, data)


def compile_scenario(path: str, data: Any) -> dict[str, Any]:
    """A parsed scenario, checked, with every value spec built.

    Returns:
        The scenario's shape with a :class:`~exporter.common.scenarios.spec.Spec` wherever a value spec
        stands: the three versions (when given), each GPU's ``values`` and ``fields`` (always
        present), ``mig.mode`` (when given) and each MIG instance's ``values`` (always present).
        ``data`` itself is not changed.

    Raises:
        ScenarioError: the first problem, naming ``path`` and the place.
    """
    try:
        return _scenario(data)
    except SpecError as exc:
        raise ScenarioError(f"scenario {path}: {exc.where}: expected {exc.expected}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _read(path: str) -> Any:
    try:  # without blocking on a FIFO, a regular file only, within a deadline (a hung mount)
        raw = fileio.read_file(path, MAX_BYTES)
    except fileio.FileRefused as exc:
        if exc.reason == "too_large":
            raise ScenarioError(
                f"scenario {path}: larger than {MAX_BYTES >> 20} MiB; a scenario is a few KiB to a few MiB"
            ) from None
        raise ScenarioError(f"scenario {path}: cannot read: {exc.detail}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"scenario {path}: not UTF-8 text (byte {exc.start})") from exc
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ScenarioError(f"scenario {path}: nested too deeply (expected at most {MAX_DEPTH} levels)") from None
    except ValueError as exc:
        raise ScenarioError(f"scenario {path}: not valid JSON: {exc}") from exc
    if _depth(data) > MAX_DEPTH:  # _depth stops counting one level past the bound
        raise ScenarioError(f"scenario {path}: nested more than {MAX_DEPTH} levels deep; expected at most {MAX_DEPTH}")
    return data


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion (a hostile file cannot exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            return level
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, level + 1) for child in children)
    return deepest


def _scenario(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        fail("top level", "a JSON object")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        fail(f"unknown top-level keys {sorted(unknown)}", f"only {sorted(_TOP_KEYS)}")
    out = {**data, **_versions(data)}
    if "native_library" in data:
        out["native_library"] = _native_library(data["native_library"])
    if "cuda_driver_version" in data and not is_int(data["cuda_driver_version"]):
        fail("cuda_driver_version", "an integer such as 13000")
    missing = data.get("missing_functions", [])
    if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
        fail("missing_functions", "a list of pynvml function names")
    out["gpus"] = _gpus(data.get("gpus"))
    out["enumeration"] = _enumeration(data.get("enumeration"), len(out["gpus"]))
    faults = data.get("faults", [])
    if not isinstance(faults, list):
        fail("faults", "a list of fault objects")
    for i, fault in enumerate(faults):
        _fault(i, fault)
    events = data.get("events", [])
    if not isinstance(events, list):
        fail("events", "a list of event objects")
    for i, event in enumerate(events):
        _event(i, event)
    return out


def _versions(data: dict[str, Any]) -> dict[str, spec.Spec]:
    """The versions the scenario gives: a string, or a value spec (a version that changes over time)."""
    out: dict[str, spec.Spec] = {}
    for key in _VERSION_KEYS:
        if key not in data:
            continue
        if isinstance(data[key], dict):
            out[key] = spec.parse(data[key], key)
        elif isinstance(data[key], str):
            out[key] = spec.Literal(data[key])
        else:
            fail(key, 'a string such as "580.159.04", or a value spec such as {"sequence": [...]}')
    return out


_NATIVE_KEYS = {"path": str, "origin": str, "deleted": bool, "host_libraries": list}
NATIVE_ORIGINS = ("host", "image", "none")


def _native_library(raw: Any) -> spec.Spec:
    """The ``libnvidia-ml.so`` the fake worker presents as mapped (docs/scenarios.md): an object
    ``{path, origin, deleted, host_libraries}`` or a ``{"sequence": [...]}`` of such objects."""
    entries = raw.get("sequence") if isinstance(raw, dict) and "sequence" in raw else None
    values = [e.get("value") if isinstance(e, dict) else None for e in entries] if isinstance(entries, list) else [raw]
    for j, value in enumerate(values):
        where = "native_library" if entries is None else f"native_library.sequence[{j}].value"
        if not isinstance(value, dict) or not set(value) <= set(_NATIVE_KEYS):
            fail(where, f"an object with keys among {sorted(_NATIVE_KEYS)}")
        for key, kind in _NATIVE_KEYS.items():
            if key in value and not isinstance(value[key], kind):
                fail(f"{where}.{key}", f"a {kind.__name__}")
        if value.get("origin", "host") not in NATIVE_ORIGINS:
            fail(f"{where}.origin", f"one of {list(NATIVE_ORIGINS)}")
        if not all(isinstance(h, str) for h in value.get("host_libraries", [])):
            fail(f"{where}.host_libraries", "a list of paths")
    return spec.parse(raw, "native_library")


def _gpus(gpus: Any) -> list[dict[str, Any]]:
    if not isinstance(gpus, list):
        fail("gpus", "a list of GPU objects")
    out = []
    seen: dict[str, int] = {}
    for i, gpu in enumerate(gpus):
        out.append(_gpu(i, gpu))
        if gpu["uuid"] in seen:
            fail(f"gpus[{i}].uuid", f"a UUID not already used by gpus[{seen[gpu['uuid']]}]")
        seen[gpu["uuid"]] = i
    return out


def _enumeration(raw: Any, count: int) -> list[dict[str, Any]]:
    """Which of the scenario's GPUs NVML enumerates, in index order, over time (docs/scenarios.md,
    "Enumeration over time"): phases ``{until_s, gpus, reset}``, the first whose ``until_s`` lies above
    scenario time holding (the last one past them all). Without the key every GPU, in file order."""
    if raw is None:
        return [{"gpus": tuple(range(count)), "reset": ()}]
    shape = "a non-empty list of {until_s, gpus, reset} phases"
    if not isinstance(raw, list) or not raw:
        fail("enumeration", shape)
    out: list[dict[str, Any]] = []
    previous = float("-inf")
    for j, phase in enumerate(raw):
        where = f"enumeration[{j}]"
        if not isinstance(phase, dict) or "gpus" not in phase or not set(phase) <= _PHASE_KEYS:
            fail(where, f"an object with gpus and keys from {sorted(_PHASE_KEYS)}")
        until = phase.get("until_s")
        if until is None and j != len(raw) - 1:
            fail(f"{where}.until_s", "a number of seconds on every phase but the last")
        if until is not None and (not is_number(until) or until <= previous):
            fail(f"{where}.until_s", f"a number of seconds above the previous phase's ({previous:g})")
        previous = until if until is not None else previous
        gpus, reset = phase["gpus"], phase.get("reset", [])
        for key, items in (("gpus", gpus), ("reset", reset)):
            if not isinstance(items, list) or not all(is_int(g) and 0 <= g < count for g in items):
                fail(f"{where}.{key}", f"a list of positions in gpus (integers from 0 to {count - 1})")
        if len(set(gpus)) != len(gpus):
            fail(f"{where}.gpus", "each GPU at most once (a GPU has one index)")
        if not set(reset) <= set(gpus):
            fail(f"{where}.reset", "GPUs this phase enumerates (a GPU comes back from a reset)")
        out.append({"until_s": until, "gpus": tuple(gpus), "reset": tuple(reset)})
    return out


_PHASE_KEYS = frozenset({"until_s", "gpus", "reset", "comment"})


def _event(i: int, event: Any) -> None:
    if not isinstance(event, dict) or event.get("event_type") not in EVENT_TYPES:
        fail(f"events[{i}].event_type", f"one of {sorted(EVENT_TYPES)}")
    if not is_number(event.get("at_s")) or not is_int(event.get("gpu")):
        fail(f"events[{i}]", "numbers at_s and gpu")


def _gpu(i: int, gpu: Any) -> dict[str, Any]:
    if not isinstance(gpu, dict):
        fail(f"gpus[{i}]", "an object")
    bad = set(gpu) - _GPU_KEYS
    if bad:
        fail(f"gpus[{i}] unknown keys {sorted(bad)}", f"only {sorted(_GPU_KEYS)}")
    uuid = gpu.get("uuid")
    if not isinstance(uuid, str) or not uuid or not uuid.isprintable() or len(uuid) > 96:
        fail(f"gpus[{i}].uuid", "a printable string of at most 96 characters such as GPU-xxxxxxxx-…")
    for key in ("name", "serial", "pci_bus_id"):
        if key in gpu and not isinstance(gpu[key], str):
            fail(f"gpus[{i}].{key}", "a string")
    for key in ("minor_number", "architecture", "nvlink_link_count"):
        if key in gpu and (not is_int(gpu[key]) or gpu[key] < 0):
            fail(f"gpus[{i}].{key}", "a non-negative integer")
    if "default_field_error" in gpu:
        check_error(gpu["default_field_error"], f"gpus[{i}].default_field_error")
    out = dict(gpu)
    if "mig" in gpu:
        out["mig"] = _mig(f"gpus[{i}].mig", gpu["mig"])
        taken = sorted(_MIG_CALLS & set(gpu.get("values", {})))
        if taken:
            fail(f"gpus[{i}].values {taken}", "these calls under gpus[].mig only (the GPU has a mig object)")
    for key, pattern, what in (
        ("values", _VALUE_KEY, "pynvml function names"),
        ("fields", _FIELD_KEY, '"fieldId" or "fieldId:scopeId"'),
    ):
        table = gpu.get(key, {})
        if not isinstance(table, dict):
            fail(f"gpus[{i}].{key}", "an object")
        out[key] = {}
        for name, value in table.items():
            if not pattern.match(name):
                fail(f"gpus[{i}].{key} key {name!r}", f"keys of the form {what}")
            out[key][name] = spec.parse(value, f"gpus[{i}].{key}[{name!r}]")
    return out


def _fault(i: int, fault: Any) -> None:
    if not isinstance(fault, dict):
        fail(f"faults[{i}]", "an object")
    bad = set(fault) - _FAULT_KEYS
    if bad:
        fail(f"faults[{i}] unknown keys {sorted(bad)}", f"only {sorted(_FAULT_KEYS)}")
    if fault.get("action") not in _ACTIONS:
        fail(f"faults[{i}].action={fault.get('action')!r}", f"one of {sorted(_ACTIONS)}")
    if fault["action"] == "error":
        check_error(fault.get("error", ""), f"faults[{i}].error")
    for key in ("from_s", "until_s", "seconds"):
        if key in fault and not is_number(fault[key]):
            fail(f"faults[{i}].{key}", "a number of seconds")
    for key in ("calls", "fields"):
        if key in fault and (not isinstance(fault[key], list) or not all(is_int(c) for c in fault[key])):
            fail(f"faults[{i}].{key}", "a list of integers")
    for key in ("gpu", "after_calls", "code"):
        if key in fault and not is_int(fault[key]):
            fail(f"faults[{i}].{key}", "an integer")


# -- MIG (docs/scenarios.md, "MIG"; the model: exporter/worker/fakenvml/mig_model.py) -----------------------

_MIG_KEYS = {"mode", "max_devices", "profiles", "layouts", "comment"}
_MIG_PROFILE_KEYS = {"name", "index", "sliceCount", "instanceCount", "multiprocessorCount", "memorySizeMB"}
_MIG_INSTANCE_KEYS = {"index", "gpu_instance_id", "compute_instance_id", "profile_id", "uuid", "placement", "values"}
_MIG_CALLS = {"nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount"}


def _mig(where: str, mig: Any) -> dict[str, Any]:
    """A GPU's ``mig`` object: mode, max_devices, profiles by id, layouts of instances over time."""
    if not isinstance(mig, dict):
        fail(where, "an object with mode, max_devices, profiles, layouts")
    bad = set(mig) - _MIG_KEYS
    if bad:
        fail(f"{where} unknown keys {sorted(bad)}", f"only {sorted(_MIG_KEYS)}")
    out = dict(mig)
    mode = mig.get("mode", [1, 1])
    if isinstance(mode, dict):
        out["mode"] = spec.parse(mode, f"{where}.mode")
    elif not (isinstance(mode, list) and len(mode) == 2 and all(m in (0, 1) for m in mode)):
        fail(f"{where}.mode", "[current, pending] with 0 (disabled) or 1 (enabled), or a value spec")
    elif "mode" in mig:
        out["mode"] = spec.parse(mode, f"{where}.mode")
    if "max_devices" in mig and (not is_int(mig["max_devices"]) or not 0 < mig["max_devices"] <= 64):
        fail(f"{where}.max_devices", "an integer from 1 to 64")
    _mig_profiles(where, mig.get("profiles", {}))
    layouts = mig.get("layouts", [])
    if not isinstance(layouts, list):
        fail(f"{where}.layouts", "a list of {until_s, instances}")
    out["layouts"] = []
    for j, layout in enumerate(layouts):
        if not isinstance(layout, dict) or not set(layout) <= {"until_s", "instances", "comment"}:
            fail(f"{where}.layouts[{j}]", "an object with instances (and until_s)")
        if "until_s" in layout and not is_number(layout["until_s"]):
            fail(f"{where}.layouts[{j}].until_s", "a number of seconds")
        instances = _mig_instances(f"{where}.layouts[{j}].instances", layout.get("instances", []))
        out["layouts"].append({**layout, "instances": instances})
    return out


def _mig_profiles(where: str, profiles: Any) -> None:
    if not isinstance(profiles, dict):
        fail(f"{where}.profiles", 'an object: profile id ("19") -> {name, index, sliceCount, memorySizeMB}')
    for key, p in profiles.items():
        if not key.isdigit() or not isinstance(p, dict) or not set(p) <= _MIG_PROFILE_KEYS:
            fail(
                f"{where}.profiles[{key!r}]",
                f"a profile id in digits -> an object with keys from {sorted(_MIG_PROFILE_KEYS)}",
            )
        if "name" in p and (not isinstance(p["name"], str) or not p["name"].isprintable()):
            fail(f"{where}.profiles[{key!r}].name", 'printable text such as "MIG 1g.18gb"')
        for k in _MIG_PROFILE_KEYS - {"name"}:
            if k in p and (not is_int(p[k]) or p[k] < 0):
                fail(f"{where}.profiles[{key!r}].{k}", "a non-negative integer")


def _mig_instances(where: str, instances: Any) -> list[dict[str, Any]]:
    if not isinstance(instances, list):
        fail(where, "a list of MIG device objects")
    out = []
    seen: dict[Any, int] = {}
    for k, inst in enumerate(instances):
        at = f"{where}[{k}]"
        if not isinstance(inst, dict) or not set(inst) <= _MIG_INSTANCE_KEYS:
            fail(at, f"an object with keys from {sorted(_MIG_INSTANCE_KEYS)}")
        for key in ("gpu_instance_id", "compute_instance_id", "profile_id", "index"):
            if key in inst and (not is_int(inst[key]) or not 0 <= inst[key] < 64):
                fail(f"{at}.{key}", "an integer from 0 to 63")
        for key in ("gpu_instance_id", "compute_instance_id", "uuid"):
            if key not in inst:
                fail(at, f"a {key}")
        uuid = inst["uuid"]
        if not isinstance(uuid, str) or not uuid.startswith("MIG-") or not uuid.isprintable() or len(uuid) > 96:
            fail(f"{at}.uuid", "a printable MIG UUID of at most 96 characters such as MIG-xxxxxxxx-…")
        for what, ident in (
            ("index", inst.get("index", k)),
            ("gpu/compute instance", (inst["gpu_instance_id"], inst["compute_instance_id"])),
            ("uuid", uuid),
        ):
            if (what, ident) in seen:
                fail(f"{at}.{what}", f"a {what} not already used by {where}[{seen[(what, ident)]}]")
            seen[(what, ident)] = k
        placement = inst.get("placement", {"start": 0, "size": 1})
        if (
            not isinstance(placement, dict)
            or set(placement) != {"start", "size"}
            or not all(is_int(v) and v >= 0 for v in placement.values())
        ):
            fail(f"{at}.placement", "{start, size}: non-negative integers")
        values = inst.get("values", {})
        if not isinstance(values, dict):
            fail(f"{at}.values", "an object")
        compiled = {}
        for name, value in values.items():
            if not _VALUE_KEY.match(name) and not name.startswith("nvmlGpmMetricsGet:"):
                fail(f"{at}.values key {name!r}", "keys of the form pynvml function names")
            compiled[name] = spec.parse(value, f"{at}.values[{name!r}]")
        out.append({**inst, "values": compiled})
    return out
