"""Scenario files for the fake NVML backend: loading and strict validation (docs/scenarios.md).

Standard library only, so the supervisor (and ``--check-config``) can reject a bad scenario before
anything starts, without importing ``pynvml``. Every error names the file, the place and what was
expected.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any, NoReturn

from exporter.nvml import errors

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
_TOP_KEYS = {
    "description",
    "driver_version",
    "nvml_version",
    "kernel_module_version",
    "cuda_driver_version",
    "missing_functions",
    "gpus",
    "faults",
    "events",
    "comment",
}
# Per-link functions: a link index at or past the GPU's link count answers INVALID_ARGUMENT,
# as real drivers do (nvml-notes §3.9).
_PER_LINK = {
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetNvLinkVersion",
    "nvmlDeviceGetNvLinkRemotePciInfo",
    "nvmlDeviceGetNvLinkCapability",
}
_PER_LINK_FIELDS = set(range(32, 60)) | set(range(96, 120)) | {138, 139, 140, 141} | set(range(146, 167))


class ScenarioError(ValueError):
    """The scenario file is not valid; the message names the file, the place and the expectation."""


_SPEC_KEYS = {
    "cycle": {"cycle", "step_s"},
    "ramp": {"ramp", "per_s"},
    "sequence": {"sequence"},
    "error": {"error"},
    "integral": {"integral", "scale", "initial"},
    "struct": {"struct", "records"},
    "churn": {"churn"},
    "per_process": {"per_process"},
}
_RESERVED = {
    "cycle",
    "step_s",
    "ramp",
    "per_s",
    "sequence",
    "error",
    "until_s",
    "value",
    "integral",
    "scale",
    "initial",
    "struct",
    "records",
    "churn",
    "per_process",
}
# Process-list layouts the fake can misread records with (fake.STRUCT_LAYOUTS; docs/scenarios.md).
STRUCT_LAYOUTS = ("r535_v3", "swapped")
_CHURN_KEYS = {"first_pid", "per_s", "lifetime_s", "used_bytes", "count"}
_UTIL_KEYS = {"smUtil", "memUtil", "encUtil", "decUtil"}
_VALUE_KEY = re.compile(r"^nvml[A-Za-z0-9_]+(:[^:]+)?$")
_FIELD_KEY = re.compile(r"^\d+(:\d+)?$")


def _fail(path: str, where: str, expected: str) -> NoReturn:
    raise ScenarioError(f"scenario {path}: {where}: expected {expected}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def load_scenario(path: str) -> dict[str, Any]:
    """Read and validate a scenario file.

    Returns:
        The scenario as parsed JSON.

    Raises:
        ScenarioError: unreadable, larger than :data:`MAX_BYTES`, not UTF-8, not JSON (NaN and
            Infinity included), nested deeper than :data:`MAX_DEPTH`, or not a valid scenario; the
            message says where and what was expected.
    """
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(f"scenario {path}: cannot read: {exc.strerror or exc}") from exc
    if len(raw) > MAX_BYTES:
        raise ScenarioError(f"scenario {path}: larger than {MAX_BYTES >> 20} MiB; a scenario is a few KiB to a few MiB")
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
    validate(path, data)
    return data  # type: ignore[no-any-return]


MAX_BYTES = 16 << 20  # the largest shipped scenario (8 GPUs) is 66 KB; memory is bounded by this
MAX_DEPTH = 32  # the deepest real spec (a struct in a cycle in a sequence) is under 10


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


def validate(path: str, data: Any) -> None:
    """Check a parsed scenario; raises ScenarioError on the first problem."""
    if not isinstance(data, dict):
        _fail(path, "top level", "a JSON object")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        _fail(path, f"unknown top-level keys {sorted(unknown)}", f"only {sorted(_TOP_KEYS)}")
    for key in ("driver_version", "nvml_version", "kernel_module_version"):
        if key not in data:
            continue
        if isinstance(data[key], dict):  # a version that changes over time: {"sequence": [...]} etc.
            _check_spec(path, data[key], key)
        elif not isinstance(data[key], str):
            _fail(path, key, 'a string such as "580.159.04", or a value spec such as {"sequence": [...]}')
    if "cuda_driver_version" in data and not _is_int(data["cuda_driver_version"]):
        _fail(path, "cuda_driver_version", "an integer such as 13000")
    missing = data.get("missing_functions", [])
    if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
        _fail(path, "missing_functions", "a list of pynvml function names")
    gpus = data.get("gpus")
    if not isinstance(gpus, list):
        _fail(path, "gpus", "a list of GPU objects")
    seen: dict[str, int] = {}
    for i, gpu in enumerate(gpus):
        _check_gpu(path, i, gpu)
        if gpu["uuid"] in seen:
            _fail(path, f"gpus[{i}].uuid", f"a UUID not already used by gpus[{seen[gpu['uuid']]}]")
        seen[gpu["uuid"]] = i
    faults = data.get("faults", [])
    if not isinstance(faults, list):
        _fail(path, "faults", "a list of fault objects")
    for i, fault in enumerate(faults):
        _check_fault(path, i, fault)
    events = data.get("events", [])
    if not isinstance(events, list):
        _fail(path, "events", "a list of event objects")
    for i, event in enumerate(events):
        if not isinstance(event, dict) or event.get("event_type") not in EVENT_TYPES:
            _fail(path, f"events[{i}].event_type", f"one of {sorted(EVENT_TYPES)}")
        if not _is_number(event.get("at_s")) or not _is_int(event.get("gpu")):
            _fail(path, f"events[{i}]", "numbers at_s and gpu")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_gpu(path: str, i: int, gpu: Any) -> None:
    if not isinstance(gpu, dict):
        _fail(path, f"gpus[{i}]", "an object")
    bad = set(gpu) - _GPU_KEYS
    if bad:
        _fail(path, f"gpus[{i}] unknown keys {sorted(bad)}", f"only {sorted(_GPU_KEYS)}")
    uuid = gpu.get("uuid")
    if not isinstance(uuid, str) or not uuid or not uuid.isprintable() or len(uuid) > 96:
        _fail(path, f"gpus[{i}].uuid", "a printable string of at most 96 characters such as GPU-xxxxxxxx-…")
    for key in ("name", "serial", "pci_bus_id"):
        if key in gpu and not isinstance(gpu[key], str):
            _fail(path, f"gpus[{i}].{key}", "a string")
    for key in ("minor_number", "architecture", "nvlink_link_count"):
        if key in gpu and (not _is_int(gpu[key]) or gpu[key] < 0):
            _fail(path, f"gpus[{i}].{key}", "a non-negative integer")
    if "default_field_error" in gpu:
        _check_error(path, f"gpus[{i}].default_field_error", gpu["default_field_error"])
    if "mig" in gpu:
        _check_mig(path, f"gpus[{i}].mig", gpu["mig"])
        taken = sorted(_MIG_CALLS & set(gpu.get("values", {})))
        if taken:
            _fail(path, f"gpus[{i}].values {taken}", "these calls under gpus[].mig only (the GPU has a mig object)")
    for key, pattern, what in (
        ("values", _VALUE_KEY, "pynvml function names"),
        ("fields", _FIELD_KEY, '"fieldId" or "fieldId:scopeId"'),
    ):
        table = gpu.get(key, {})
        if not isinstance(table, dict):
            _fail(path, f"gpus[{i}].{key}", "an object")
        for name, spec in table.items():
            if not pattern.match(name):
                _fail(path, f"gpus[{i}].{key} key {name!r}", f"keys of the form {what}")
            _check_spec(path, spec, f"gpus[{i}].{key}[{name!r}]")


# -- MIG (docs/scenarios.md, "MIG"; exporter/nvml/fake_mig.py) ------------------------------------

_MIG_KEYS = {"mode", "max_devices", "profiles", "layouts", "comment"}
_MIG_PROFILE_KEYS = {"name", "index", "sliceCount", "instanceCount", "multiprocessorCount", "memorySizeMB"}
_MIG_INSTANCE_KEYS = {"index", "gpu_instance_id", "compute_instance_id", "profile_id", "uuid", "placement", "values"}
_MIG_CALLS = {"nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount"}


def _check_mig(path: str, where: str, mig: Any) -> None:
    """A GPU's ``mig`` object: mode, max_devices, profiles by id, layouts of instances over time."""
    if not isinstance(mig, dict):
        _fail(path, where, "an object with mode, max_devices, profiles, layouts")
    bad = set(mig) - _MIG_KEYS
    if bad:
        _fail(path, f"{where} unknown keys {sorted(bad)}", f"only {sorted(_MIG_KEYS)}")
    mode = mig.get("mode", [1, 1])
    if isinstance(mode, dict):
        _check_spec(path, mode, f"{where}.mode")
    elif not (isinstance(mode, list) and len(mode) == 2 and all(m in (0, 1) for m in mode)):
        _fail(path, f"{where}.mode", "[current, pending] with 0 (disabled) or 1 (enabled), or a value spec")
    if "max_devices" in mig and (not _is_int(mig["max_devices"]) or not 0 < mig["max_devices"] <= 64):
        _fail(path, f"{where}.max_devices", "an integer from 1 to 64")
    profiles = mig.get("profiles", {})
    if not isinstance(profiles, dict):
        _fail(path, f"{where}.profiles", 'an object: profile id ("19") -> {name, index, sliceCount, memorySizeMB}')
    for key, p in profiles.items():
        if not key.isdigit() or not isinstance(p, dict) or not set(p) <= _MIG_PROFILE_KEYS:
            _fail(
                path,
                f"{where}.profiles[{key!r}]",
                f"a profile id in digits -> an object with keys from {sorted(_MIG_PROFILE_KEYS)}",
            )
        if "name" in p and (not isinstance(p["name"], str) or not p["name"].isprintable()):
            _fail(path, f"{where}.profiles[{key!r}].name", 'printable text such as "MIG 1g.18gb"')
        for k in _MIG_PROFILE_KEYS - {"name"}:
            if k in p and (not _is_int(p[k]) or p[k] < 0):
                _fail(path, f"{where}.profiles[{key!r}].{k}", "a non-negative integer")
    layouts = mig.get("layouts", [])
    if not isinstance(layouts, list):
        _fail(path, f"{where}.layouts", "a list of {until_s, instances}")
    for j, layout in enumerate(layouts):
        if not isinstance(layout, dict) or not set(layout) <= {"until_s", "instances", "comment"}:
            _fail(path, f"{where}.layouts[{j}]", "an object with instances (and until_s)")
        if "until_s" in layout and not _is_number(layout["until_s"]):
            _fail(path, f"{where}.layouts[{j}].until_s", "a number of seconds")
        _check_mig_instances(path, f"{where}.layouts[{j}].instances", layout.get("instances", []))


def _check_mig_instances(path: str, where: str, instances: Any) -> None:
    if not isinstance(instances, list):
        _fail(path, where, "a list of MIG device objects")
    seen: dict[Any, int] = {}
    for k, inst in enumerate(instances):
        at = f"{where}[{k}]"
        if not isinstance(inst, dict) or not set(inst) <= _MIG_INSTANCE_KEYS:
            _fail(path, at, f"an object with keys from {sorted(_MIG_INSTANCE_KEYS)}")
        for key in ("gpu_instance_id", "compute_instance_id", "profile_id", "index"):
            if key in inst and (not _is_int(inst[key]) or not 0 <= inst[key] < 64):
                _fail(path, f"{at}.{key}", "an integer from 0 to 63")
        for key in ("gpu_instance_id", "compute_instance_id", "uuid"):
            if key not in inst:
                _fail(path, at, f"a {key}")
        uuid = inst["uuid"]
        if not isinstance(uuid, str) or not uuid.startswith("MIG-") or not uuid.isprintable() or len(uuid) > 96:
            _fail(path, f"{at}.uuid", "a printable MIG UUID of at most 96 characters such as MIG-xxxxxxxx-…")
        for what, ident in (
            ("index", inst.get("index", k)),
            ("gpu/compute instance", (inst["gpu_instance_id"], inst["compute_instance_id"])),
            ("uuid", uuid),
        ):
            if (what, ident) in seen:
                _fail(path, f"{at}.{what}", f"a {what} not already used by {where}[{seen[(what, ident)]}]")
            seen[(what, ident)] = k
        placement = inst.get("placement", {"start": 0, "size": 1})
        if (
            not isinstance(placement, dict)
            or set(placement) != {"start", "size"}
            or not all(_is_int(v) and v >= 0 for v in placement.values())
        ):
            _fail(path, f"{at}.placement", "{start, size}: non-negative integers")
        values = inst.get("values", {})
        if not isinstance(values, dict):
            _fail(path, f"{at}.values", "an object")
        for name, spec in values.items():
            if not _VALUE_KEY.match(name) and not name.startswith("nvmlGpmMetricsGet:"):
                _fail(path, f"{at}.values key {name!r}", "keys of the form pynvml function names")
            _check_spec(path, spec, f"{at}.values[{name!r}]")


def _check_error(path: str, where: str, value: Any) -> None:
    try:
        errors.parse_code(value)
    except (ValueError, AttributeError) as exc:
        _fail(path, where, f"an NVML error name or code ({exc})")


def _check_fault(path: str, i: int, fault: Any) -> None:
    if not isinstance(fault, dict):
        _fail(path, f"faults[{i}]", "an object")
    bad = set(fault) - _FAULT_KEYS
    if bad:
        _fail(path, f"faults[{i}] unknown keys {sorted(bad)}", f"only {sorted(_FAULT_KEYS)}")
    if fault.get("action") not in _ACTIONS:
        _fail(path, f"faults[{i}].action={fault.get('action')!r}", f"one of {sorted(_ACTIONS)}")
    if fault["action"] == "error":
        _check_error(path, f"faults[{i}].error", fault.get("error", ""))
    for key in ("from_s", "until_s", "seconds"):
        if key in fault and not _is_number(fault[key]):
            _fail(path, f"faults[{i}].{key}", "a number of seconds")
    for key in ("calls", "fields"):
        if key in fault and (not isinstance(fault[key], list) or not all(_is_int(c) for c in fault[key])):
            _fail(path, f"faults[{i}].{key}", "a list of integers")
    for key in ("gpu", "after_calls", "code"):
        if key in fault and not _is_int(fault[key]):
            _fail(path, f"faults[{i}].{key}", "an integer")


def _check_spec(path: str, spec: Any, where: str) -> None:
    if isinstance(spec, list):
        for j, v in enumerate(spec):
            _check_spec(path, v, f"{where}[{j}]")
        return
    if isinstance(spec, str) and not spec.isprintable():
        _fail(path, where, "printable text (no control characters)")
    if not isinstance(spec, dict):
        return
    kind = next((k for k in _SPEC_KEYS if k in spec), None)
    if kind is None:  # a struct: attribute -> value; catch typos of the spec keys
        for key, value in spec.items():
            close = difflib.get_close_matches(key, sorted(_RESERVED), n=1, cutoff=0.75)
            if close:
                _fail(path, f"{where} key {key!r}", f"{close[0]!r} (a value spec) or a struct attribute name")
            if not key.isidentifier():
                _fail(path, f"{where} key {key!r}", "a struct attribute name (an identifier)")
            _check_spec(path, value, f"{where}.{key}")
        return
    extra = set(spec) - _SPEC_KEYS[kind]
    if extra:
        _fail(path, f"{where} unknown keys {sorted(extra)}", f"only {sorted(_SPEC_KEYS[kind])} with {kind}")
    if kind == "error":
        _check_error(path, where, spec["error"])
    elif kind == "cycle":
        if not isinstance(spec["cycle"], list) or not spec["cycle"]:
            _fail(path, where, "cycle to be a non-empty list")
        if not _is_number(spec.get("step_s")) or spec["step_s"] <= 0:
            _fail(path, where, "step_s > 0 with cycle")
        _check_spec(path, spec["cycle"], f"{where}.cycle")
    elif kind == "ramp":
        if not _is_number(spec["ramp"]) or not _is_number(spec.get("per_s")):
            _fail(path, where, "numbers ramp and per_s")
    elif kind == "integral":
        inner = spec["integral"]
        if (
            not isinstance(inner, dict)
            or set(inner) != {"cycle", "step_s"}
            or not isinstance(inner["cycle"], list)
            or not inner["cycle"]
            or not all(_is_number(v) for v in inner["cycle"])
            or not _is_number(inner["step_s"])
            or inner["step_s"] <= 0
        ):
            _fail(path, f"{where}.integral", "a cycle of numbers: {cycle: [...], step_s > 0}")
        for key in ("scale", "initial"):
            if key in spec and not _is_number(spec[key]):
                _fail(path, f"{where}.{key}", "a number")
    elif kind == "struct":
        _check_struct(path, spec, where)
    elif kind == "churn":
        _check_churn(path, spec["churn"], f"{where}.churn")
    elif kind == "per_process":
        util = spec["per_process"]
        if not isinstance(util, dict) or not set(util) <= _UTIL_KEYS:
            _fail(path, f"{where}.per_process", f"an object with keys from {sorted(_UTIL_KEYS)}")
        for key, value in util.items():
            _check_spec(path, value, f"{where}.per_process.{key}")
    else:
        seq = spec["sequence"]
        if not isinstance(seq, list) or not all(isinstance(e, dict) and set(e) <= {"until_s", "value"} for e in seq):
            _fail(path, where, "sequence to be a list of {until_s, value}")
        for j, entry in enumerate(seq):
            if "until_s" in entry and not _is_number(entry["until_s"]):
                _fail(path, f"{where}.sequence[{j}].until_s", "a number of seconds")
            _check_spec(path, entry.get("value"), f"{where}.sequence[{j}].value")


def _check_struct(path: str, spec: dict[str, Any], where: str) -> None:
    if spec["struct"] not in STRUCT_LAYOUTS:
        _fail(path, f"{where}.struct={spec['struct']!r}", f"one of {list(STRUCT_LAYOUTS)}")
    records = spec.get("records")
    if not isinstance(records, list):
        _fail(path, f"{where}.records", "a list of process records")
    for j, rec in enumerate(records):
        if not isinstance(rec, dict) or not _is_int(rec.get("pid")):
            _fail(path, f"{where}.records[{j}]", "an object with an integer pid")
        for key in ("usedGpuMemory", "gpuInstanceId", "computeInstanceId"):
            if key in rec and rec[key] is not None and (not _is_int(rec[key]) or rec[key] < 0):
                _fail(path, f"{where}.records[{j}].{key}", "a non-negative integer or null")


def _check_churn(path: str, churn: Any, where: str) -> None:
    if not isinstance(churn, dict) or not {"first_pid", "per_s", "lifetime_s"} <= set(churn) <= _CHURN_KEYS:
        _fail(path, where, "an object with first_pid, per_s, lifetime_s (and optionally used_bytes, count)")
    if not _is_int(churn["first_pid"]) or churn["first_pid"] <= 0:
        _fail(path, f"{where}.first_pid", "a positive integer")
    for key in ("per_s", "lifetime_s"):
        if not _is_number(churn[key]) or churn[key] <= 0:
            _fail(path, f"{where}.{key}", "a positive number")
    if churn.get("used_bytes") is not None and (not _is_int(churn["used_bytes"]) or churn["used_bytes"] < 0):
        _fail(path, f"{where}.used_bytes", "a non-negative integer or null")
    if "count" in churn and (not _is_int(churn["count"]) or churn["count"] <= 0):
        _fail(path, f"{where}.count", "a positive integer")
