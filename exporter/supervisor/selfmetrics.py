"""The exporter's own metrics (no ``gpu``/``uuid``), in the node_exporter pattern.

Whether NVML is up, versions, the age and cost of the last sample, per-feature success, duration
and effective state, NVML errors and calls, worker restarts and crashes, what each process
imported (the self-check), and the ``process_*`` series of both processes
(:mod:`exporter.supervisor.procmetrics`). Built fresh from the :class:`~exporter.supervisor.served.ServedState` on every
rendering; extensions add their own exporter-level families after these.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from exporter import __version__
from exporter.common import fileio
from exporter.common.metric import MetricDef, single
from exporter.supervisor import procmetrics

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric
    from exporter.supervisor.served import ServedState


def _m(name: str, help: str, labels: tuple[str, ...] = ()) -> MetricDef:
    return MetricDef(name, help, labels, per_gpu=False)


UP = _m("nvgpu_up", "1 if NVML is initialised and the last sample is younger than the stale bound")
BUILD_INFO = _m(
    "nvgpu_build_info",
    "Versions in use (kernel_module_version: /proc/driver/nvidia/version, next to the userspace NVML); "
    "value is always 1",
    ("version", "nvidia_ml_py_version", "nvml_version", "driver_version", "kernel_module_version", "python_version"),
)
NVML_LIBRARY_INFO = _m(
    "nvgpu_nvml_library_info",
    "The libnvidia-ml.so the worker mapped (/proc/self/maps): path, origin (host: bind-mounted from the host; "
    "image: part of the container image; unknown; none), its version (file name, else nvmlSystemGetNVMLVersion), "
    "NVML's version, the kernel module's (/proc/driver/nvidia/version) and the check's state (ok, image_library, "
    "driver_upgraded, library_missing, unknown); value is always 1",
    ("path", "origin", "library_version", "nvml_version", "kernel_module_version", "state"),
)
INIT_FAILURES = _m(
    "nvgpu_nvml_init_failures_total",
    "NVML initialisations that failed (and samples that found NVML unusable), by NVML error",
    ("error",),
)
DRIVER_RELOAD_REQUIRED = _m(
    "nvgpu_driver_reload_required",
    "1 while NVML answers LIB_RM_VERSION_MISMATCH on the host's library (or the host's library was replaced under "
    "the running worker): the userspace driver differs from the loaded kernel module; only a driver reload or a "
    "reboot cures it (0 when the library is the image's own: fix the image)",
)
SUPERVISOR_ERRORS = _m(
    "nvgpu_supervisor_errors_total",
    "Exceptions in the supervisor's own work, contained and retried, by component",
    ("component",),
)
FILE_READ_FAILURES = _m(
    "nvgpu_file_read_failures_total",
    "Reads of a file a setting names that failed and kept the previous state, by file (web_config: the web "
    "config or a certificate, key or CA it names; state_file; kmsg_cursor; kernel_log) and reason "
    "(not_regular: a FIFO, directory or device node; too_large; timeout: no answer in time, a hung mount; error)",
    ("file", "reason"),
)
LAST_SAMPLE = _m("nvgpu_last_sample_timestamp_seconds", "Unix time of the last NVML sample")
LAST_SAMPLE_AGE = _m(
    "nvgpu_last_sample_age_seconds",
    "Seconds since the last NVML sample arrived, on the exporter's monotonic clock when the exposition was "
    "rendered (every sample, and every 10 s while none arrives): unlike time() - "
    "nvgpu_last_sample_timestamp_seconds, not skewed by a node clock that differs from Prometheus's",
)
SAMPLE_DURATION = _m("nvgpu_sample_duration_seconds", "Wall time of the last NVML sample")
FEATURE_SUCCESS = _m("nvgpu_feature_success", "1 if the feature's last sample succeeded on every GPU", ("feature",))
FEATURE_DURATION = _m(
    "nvgpu_feature_duration_seconds", "Time spent in the feature during the last sample", ("feature",)
)
FEATURE_ENABLED = _m(
    "nvgpu_feature_enabled",
    "1 if the feature is enabled; reason says why it is in that state "
    "(default, env, known_issue, quarantined, unsupported)",
    ("feature", "reason"),
)
NVML_ERRORS = _m(
    "nvgpu_nvml_errors_total", "NVML errors that omitted a sample, by feature and NVML error", ("feature", "error")
)
NVML_CALLS = _m("nvgpu_nvml_calls_total", "NVML calls made by workers since the exporter started")
WORKER_RESTARTS = _m(
    "nvgpu_worker_restarts_total",
    "Worker restarts by reason (crash: a fault signal of its own, SIGSEGV/SIGBUS/SIGABRT/SIGILL/SIGFPE; "
    "hang: missed its deadline; killed: a signal from outside, SIGKILL/SIGTERM; oom: killed by the OOM killer; "
    "exit: exited; nvml_error: NVML unusable; quarantine: replaced to switch a newly quarantined feature off)",
    ("reason",),
)
WORKER_CRASHES = _m(
    "nvgpu_worker_crashes_total",
    "Worker crashes and hangs by the feature and NVML function in flight",
    ("feature", "function"),
)
LAST_EXIT_SIGNAL = _m("nvgpu_worker_last_exit_signal", "Signal that ended the last worker (0: none or not a signal)")
LAST_EXIT_CODE = _m("nvgpu_worker_last_exit_code", "Exit code of the last worker that exited")
WORKER_START = _m("nvgpu_worker_start_time_seconds", "Unix time the current worker started")
WORKER_STUCK = _m(
    "nvgpu_worker_stuck", "1 if a worker is in uninterruptible sleep or respawning stopped after repeated hangs"
)
MODULE_INFO = _m(
    "nvgpu_module_info",
    "Modules each process imported: file, __version__, distribution; value is always 1",
    ("process", "module", "version", "distribution", "distribution_version", "path"),
)
SELFCHECK_FAILURES = _m("nvgpu_selfcheck_failures", "Failed self-check rules per process (0 = healthy)", ("process",))
METRICS = (
    UP,
    BUILD_INFO,
    LAST_SAMPLE,
    LAST_SAMPLE_AGE,
    SAMPLE_DURATION,
    FEATURE_SUCCESS,
    FEATURE_DURATION,
    FEATURE_ENABLED,
    NVML_ERRORS,
    NVML_CALLS,
    WORKER_RESTARTS,
    WORKER_CRASHES,
    LAST_EXIT_SIGNAL,
    LAST_EXIT_CODE,
    WORKER_START,
    WORKER_STUCK,
    MODULE_INFO,
    SELFCHECK_FAILURES,
    NVML_LIBRARY_INFO,
    INIT_FAILURES,
    DRIVER_RELOAD_REQUIRED,
    SUPERVISOR_ERRORS,
    FILE_READ_FAILURES,
)
RESTART_REASONS = ("crash", "hang", "killed", "oom", "exit", "nvml_error", "quarantine")


def families(state: ServedState, render_failed: Collection[str]) -> list[Metric]:
    """Self-metrics of ``state``; ``render_failed`` features report success 0."""
    snap = state.fresh_snapshot()
    last = state.last
    sysinfo = state.system
    out = [
        single(UP, 1 if snap is not None and state.nvml_up else 0),
        single(
            BUILD_INFO,
            1,
            (
                __version__,
                sysinfo.nvidia_ml_py_version,
                sysinfo.nvml_version,
                sysinfo.driver_version,
                state.nvml.kernel_module_version,
                state.python_version,
            ),
        ),
    ]
    if last is not None:
        out += [single(LAST_SAMPLE, last.ts), single(SAMPLE_DURATION, last.duration_s)]
        out.append(single(LAST_SAMPLE_AGE, state.sample_age()))
    success, duration = FEATURE_SUCCESS.family(), FEATURE_DURATION.family()
    if snap is not None:
        for feature, stat in sorted(snap.features.items()):
            failed = feature in render_failed or feature in snap.undecodable
            success.add_labels([feature], 0 if failed else int(stat.success))
            duration.add_labels([feature], stat.duration_s)
    out += [success.always(), duration.always()]
    enabled = FEATURE_ENABLED.family()
    for feature, st in sorted(state.feature_states().items()):
        enabled.add_labels([feature, st.reason.value], 1 if st.enabled else 0)
    out.append(enabled.always())
    errors = NVML_ERRORS.family()
    for (feature, name), count in sorted(state.nvml_errors().items()):
        errors.add_labels([feature, name], count)
    out += [errors.always(), single(NVML_CALLS, state.nvml_calls())]
    out += _worker(state)
    out += _selfcheck(state)
    out += _nvml_health(state)
    out += procmetrics.families(state.worker.pid)
    return out


def _nvml_health(state: ServedState) -> list[Metric]:
    failures = INIT_FAILURES.family()
    for error, count in sorted(state.nvml.init_failures.items()):
        failures.add_labels([error], count)
    components = SUPERVISOR_ERRORS.family()
    for component, count in sorted(state.component_errors.items()):
        components.add_labels([component], count)
    files = FILE_READ_FAILURES.family()
    for (file, reason), count in sorted(fileio.FAILURES.items()):
        files.add_labels([file, reason], count)
    return [
        failures.always(),
        single(DRIVER_RELOAD_REQUIRED, 1 if state.driver_reload_required() else 0),
        components.always(),
        files.always(),
    ]


def _worker(state: ServedState) -> list[Metric]:
    w = state.worker
    restarts = WORKER_RESTARTS.family()
    for reason in RESTART_REASONS:
        restarts.add_labels([reason], w.restarts.get(reason, 0))
    crashes = WORKER_CRASHES.family()
    for (feature, function), count in sorted(w.crashes.items()):
        crashes.add_labels([feature, function], count)
    out = [
        restarts.always(),
        crashes.always(),
        single(LAST_EXIT_SIGNAL, w.last_exit_signal),
        single(LAST_EXIT_CODE, w.last_exit_code),
    ]
    if w.started_at is not None:
        out.append(single(WORKER_START, w.started_at))
    out.append(single(WORKER_STUCK, 1 if w.stuck else 0))
    return out


def _selfcheck(state: ServedState) -> list[Metric]:
    info, failures = MODULE_INFO.family(), SELFCHECK_FAILURES.family()
    for process, res in sorted(state.selfchecks.items()):
        for m in res.reports:
            info.add_labels(
                [process, m.module, m.version or "", m.distribution, m.distribution_version or "", m.path or ""], 1
            )
        failures.add_labels([process], len(res.problems))
    native = NVML_LIBRARY_INFO.family()
    lib = state.native
    if lib is not None:
        native.add_labels(
            [
                lib.realpath or lib.path,
                lib.origin,
                lib.library_version,
                lib.nvml_version,
                lib.kernel_module_version,
                lib.state,
            ],
            1,
        )
    return [info.always(), failures.always(), native.always()]
