"""Configuration: ``NVGPU_*`` environment variables and flags -> one frozen :class:`Config`.

:meth:`Config.from_env` is the one reader of the environment. Flags override variables. Parsing is
strict (``NVGPU_LOG_FORMAT=jsn`` is an error, not a default), durations are seconds with
``_SECONDS`` in the variable name, written as a number (``5``, ``0.5``) or as a Go duration the way
the Prometheus tools take them (``500ms``, ``1s``, ``2m``, ``1h30m``), and every problem is
reported together in one :class:`~exporter.settingvalues.ConfigError` before anything starts. The spellings of
exporter-toolkit and ``prometheus/common/promslog`` work as they do there: ``--log.level=warn``,
``--log.format=logfmt``, ``--web.listen-address`` given more than once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.common.workerconfig import ENV_VAR as WORKER_CONFIG_VAR
from exporter.settings import SETTINGS
from exporter.settingvalues import DEFAULT_PORT, ConfigError, format_address
from guards import features as gf


@dataclass(frozen=True)
class Config:
    """Everything the exporter needs, parsed and checked. See :data:`exporter.settings.SETTINGS` for meanings."""

    listen_addresses: tuple[tuple[str, int], ...] = (("", DEFAULT_PORT),)
    interval_s: float = 5.0
    stale_s: float = 15.0
    sample_deadline_s: float = 10.0
    init_deadline_s: float = 60.0
    log_level: str = "INFO"
    log_format: str = "text"
    nvml_backend: str = "nvml"
    state_file: str = ""
    quarantine_after: int = 3
    quarantine_window_s: float = 600.0
    quarantine_ttl_s: float = 86400.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    shutdown_timeout_s: float = 10.0
    selfcheck: str = "warn"
    kmsg_path: str = "/dev/kmsg"
    kmsg_cursor_file: str = ""
    pod_resources_socket: str = ""
    pod_labels: bool = False
    pod_refresh_s: float = 15.0
    dra_resourceslices: bool = False
    node_name: str = ""
    gpu_retry_s: float = 30.0
    gpu_retry_max_s: float = 600.0
    reprobe_s: float = 300.0
    enumerate_s: float = 60.0
    expected_gpus: int | None = None
    unhealthy_after_s: float = 600.0
    proc_path: str = "/proc"
    container_log_dir: str = "/var/log/containers"
    process_series_per_gpu: int = 16
    stuck_utilization: float = 0.99
    stuck_memory_bytes: int = 64 << 20
    stuck_sm_activity: float = 0.01
    stuck_after_s: float = 60.0
    recurrence_window_s: float = 3600.0
    web_config_file: str = ""
    telemetry_path: str = "/metrics"
    web_probes_without_auth: bool = True
    web_max_connections: int = 1024
    web_keepalive_s: float = 120.0
    web_header_timeout_s: float = 10.0
    feature_modes: Mapping[str, gf.Mode] = field(default_factory=dict)

    @property
    def listen_address(self) -> tuple[str, int]:
        """The first of :attr:`listen_addresses` (host, port)."""
        return self.listen_addresses[0]

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        flags: Mapping[str, str] | None = None,
        flag_names: Mapping[str, str] | None = None,
    ) -> Config:
        """Build the configuration.

        Args:
            environ: the process environment (only ``NVGPU_*`` keys are read).
            flags: command-line values by attribute name; they override the environment.
            flag_names: the spelling of each flag as given (an alias such as ``--listen-address``),
                so a problem names what the user typed; defaults to :attr:`Setting.flag`.

        Raises:
            ConfigError: with every problem found (unknown ``NVGPU_*`` variables included).
        """
        flags = flags or {}
        names = flag_names or {}
        problems: list[str] = []
        values: dict[str, Any] = {}
        for s in SETTINGS:
            source = names.get(s.attr, s.flag) if s.attr in flags else s.env
            text = flags.get(s.attr, environ.get(s.env, s.default))
            if text == "" and s.default == "":
                continue  # derived below
            try:
                values[s.attr] = s.parse(source, text)
            except ConfigError as exc:  # a setting that names a file with several problems
                problems.extend(exc.problems)
            except ValueError as exc:
                problems.append(str(exc))
        modes, feature_problems = gf.parse_feature_env(environ)
        problems.extend(feature_problems)
        known = {s.env for s in SETTINGS} | {
            "NVGPU_FAKE_EPOCH",
            WORKER_CONFIG_VAR,
            "NVGPU_WORKER_FD",
            "NVGPU_BREADCRUMB_FD",
        }
        for key in sorted(environ):
            if key.startswith("NVGPU_") and not key.upper().startswith(gf.ENV_PREFIX.rstrip("_")) and key not in known:
                import difflib

                close = difflib.get_close_matches(key, sorted(known - {"NVGPU_FAKE_EPOCH"}), n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                problems.append(f"{key}: unknown variable{hint}")
        if str(values.get("nvml_backend", "")).startswith("fake:"):
            # A fake GPU's pids are not this machine's: resolving them in its /proc would name and
            # attribute unrelated processes. Tests and demos point these at fake trees explicitly.
            for s in SETTINGS:
                if s.attr in ("proc_path", "container_log_dir") and s.env not in environ and s.attr not in flags:
                    values[s.attr] = ""
        interval = values.get("interval_s", 5.0)
        values.setdefault("stale_s", 3 * interval)
        values.setdefault("sample_deadline_s", max(10.0, 2 * interval))
        if "stale_s" in values and values["stale_s"] < interval:
            problems.append(
                f"NVGPU_STALE_AFTER_SECONDS={values['stale_s']}: must be at least the sample interval ({interval})"
            )
        if values.get("backoff_max_s", 60.0) < values.get("backoff_initial_s", 1.0):
            problems.append("NVGPU_RESTART_BACKOFF_MAX_SECONDS must be at least NVGPU_RESTART_BACKOFF_SECONDS")
        if values.get("dra_resourceslices") and not values.get("node_name"):
            problems.append(
                "NVGPU_DRA_RESOURCESLICES=true needs NVGPU_NODE_NAME (set it from the downward API: "
                "fieldRef spec.nodeName)"
            )
        if values.get("gpu_retry_max_s", 600.0) < values.get("gpu_retry_s", 30.0):
            problems.append("NVGPU_GPU_RETRY_MAX_SECONDS must be at least NVGPU_GPU_RETRY_SECONDS")
        if problems:
            raise ConfigError(problems)
        return cls(feature_modes=modes, **values)

    def describe(self) -> list[str]:
        """Effective settings, one ``VAR=value`` line each."""
        lines = []
        for s in SETTINGS:
            value = getattr(self, s.attr)
            if s.attr == "listen_addresses":
                value = ",".join(format_address(a) for a in value)
            elif isinstance(value, bool):
                value = str(value).lower()
            elif value is None:  # unset (NVGPU_EXPECTED_GPUS: unknown)
                value = ""
            lines.append(f"{s.env}={value}")
        lines.extend(f"{gf.env_var(k)}={v.value}" for k, v in self.feature_modes.items())
        return lines
