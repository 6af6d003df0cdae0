"""Startup guard that keeps nvitop from querying NVLink throughput through NVML.

Why: on H20 nodes with the 580 driver branch, nvitop-exporter crash-looped (exit 139, glibc
``double free or corruption``) inside the NVLink throughput field-value query
(``nvmlDeviceGetFieldValues`` with ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``). A native crash
cannot be caught in Python, so the only safe move is not to make the call.

How: ``nvitop_nvlink_guard.pth`` in site-packages runs ``import nvitop_nvlink_guard;
nvitop_nvlink_guard.install()`` at interpreter start. :func:`install` only reads one environment
variable and puts a small finder on ``sys.meta_path``; nvitop itself is *not* imported. When some
code later imports ``nvitop.api.device`` (``import nvitop`` does), the finder wraps that module's
loader and, right after the module body has run, replaces the NVLink throughput methods of
``Device`` (and of any subclass that redefines them) with functions that return what nvitop
returns for a GPU without NVLink: ``[]`` for per-link lists, ``ThroughputInfo(tx=NA, rx=NA)`` for
aggregates, ``NA`` for scalars. NVML is never called for them.

Switch: ``NVITOP_NVLINK_THROUGHPUT_GUARD``

- unset or empty, or ``on``: guard active (the default);
- ``off``: nothing is patched, nvitop's original methods run;
- anything else: a warning on stderr, and the guard stays **on** (safety first).

Values are compared after stripping whitespace, case-insensitively; ``0``, ``false``, ``no`` and
friends are deliberately *not* accepted. One line goes to stderr when the guard patches nvitop (or,
with ``off``, when nvitop is imported unguarded), so the state shows up in ``kubectl logs``.

This module imports only ``os`` and ``sys`` at interpreter start; ``functools`` is imported when
nvitop is. It is written for Python 3.8+ (nvitop's floor).
"""

from __future__ import annotations

import os
import sys

# Not typing.TYPE_CHECKING: this module is imported by every interpreter start, keep it to os/sys.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

ENV_VAR = "NVITOP_NVLINK_THROUGHPUT_GUARD"
"""Environment variable that switches the guard: ``on`` (default) or ``off``."""

TARGET_MODULE = "nvitop.api.device"
"""The module that defines ``nvitop.Device``; patched right after it is executed."""

GUARD_MARKER = "__nvitop_nvlink_guard__"
"""Attribute set on every guard function; ``verify.py`` looks for it."""

_PREFIX = "nvitop-nvlink-guard"

# Method name -> kind of "not available" value that nvitop returns for a GPU without NVLink
# (nvitop 1.7.2 ``nvitop/api/device.py``: ``nvlink_throughput()`` returns ``[]`` when the link
# count is 0, and every other NVLink throughput method derives its value from that list).
#   "list"       -> []
#   "throughput" -> ThroughputInfo(tx=NA, rx=NA)
#   "na"         -> NA
GUARDED_METHODS: dict[str, str] = {
    # The one method that issues the NVML field-value query (TX and RX counters for every link).
    "nvlink_throughput": "list",
    # Derived from nvlink_throughput(); nvitop-exporter 1.7.2 calls the four aggregate ones and
    # the two per-link lists in PrometheusExporter.update_device(). They are patched as well so
    # that the guard does not depend on nvitop's internal call graph staying as it is.
    "nvlink_total_throughput": "throughput",
    "nvlink_mean_throughput": "throughput",
    "nvlink_tx_throughput": "list",
    "nvlink_rx_throughput": "list",
    "nvlink_total_tx_throughput": "na",
    "nvlink_total_rx_throughput": "na",
    "nvlink_mean_tx_throughput": "na",
    "nvlink_mean_rx_throughput": "na",
    # Human-readable variants (nvitop's TUI); same rule.
    "nvlink_tx_throughput_human": "list",
    "nvlink_rx_throughput_human": "list",
    "nvlink_total_tx_throughput_human": "na",
    "nvlink_total_rx_throughput_human": "na",
    "nvlink_mean_tx_throughput_human": "na",
    "nvlink_mean_rx_throughput_human": "na",
}
"""Every NVLink *throughput* entry point of ``nvitop.Device``. ``nvlink_link_count()`` (a single
``NVML_FI_DEV_NVLINK_LINK_COUNT`` field, not the throughput query) is left alone."""


class GuardState:
    """What the guard decided and did in this process (one instance: :data:`STATE`).

    Attributes:
        env_value: the raw value of :data:`ENV_VAR`, or ``None`` when unset.
        enabled: whether the guard is configured on (``False`` only for ``off``).
        invalid: ``True`` when the variable held something other than on/off.
        installed: whether :func:`install` has run (hook on ``sys.meta_path``, or nvitop was
            already imported and handled directly).
        patched: ``"Class.method"`` names replaced so far.
        error: why patching failed, when it did; the guard is then *not* active.
    """

    def __init__(self) -> None:
        """Start with nothing decided."""
        self.env_value: str | None = None
        self.enabled: bool = True
        self.invalid: bool = False
        self.installed: bool = False
        self.patched: list[str] = []
        self.error: str | None = None

    @property
    def active(self) -> bool:
        """True once ``Device.nvlink_throughput`` has been replaced by the guard."""
        return "Device.nvlink_throughput" in self.patched


STATE = GuardState()


def _stderr(message: str) -> None:
    """Write one line to stderr; never raise (stderr may be closed in odd embeddings)."""
    try:
        sys.stderr.write(f"{_PREFIX}: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - logging must not break the interpreter
        pass


def parse_setting(value: str | None) -> tuple[bool, bool]:
    """Interpret a value of :data:`ENV_VAR`.

    Args:
        value: the raw environment value, ``None`` when unset.

    Returns:
        ``(enabled, invalid)``. Unset, empty and ``on`` give ``(True, False)``; ``off`` gives
        ``(False, False)``; anything else gives ``(True, True)``: an unrecognised value keeps the
        guard on.
    """
    if value is None:
        return True, False
    normalized = value.strip().lower()
    if normalized in ("", "on"):
        return True, False
    if normalized == "off":
        return False, False
    return True, True


def _not_available(kind: str, module: Any) -> Any:
    """Build a fresh "not available" value of ``kind`` from nvitop's ``NA`` / ``ThroughputInfo``."""
    if kind == "list":
        return []
    if kind == "throughput":
        return module.ThroughputInfo(tx=module.NA, rx=module.NA)
    return module.NA


def _make_guard(name: str, kind: str, original: Callable[..., Any], module: Any) -> Any:
    """Return a replacement for ``original`` that answers "not available" without NVML."""
    import functools

    @functools.wraps(original)
    def guard(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _not_available(kind, module)

    setattr(guard, GUARD_MARKER, True)
    guard.__doc__ = (
        f"NVLink throughput guard ({ENV_VAR}=on): returns what nvitop returns for a GPU without "
        f"NVLink and never calls NVML. The original {name}() is in ``__wrapped__``."
    )
    return guard


def patch_module(module: Any) -> list[str]:
    """Replace the NVLink throughput methods in an imported ``nvitop.api.device`` module.

    Patches ``module.Device`` and every ``Device`` subclass defined in the module that defines one
    of :data:`GUARDED_METHODS` itself. Idempotent: already guarded methods are left alone.

    Args:
        module: the executed ``nvitop.api.device`` module.

    Returns:
        ``"Class.method"`` names patched by this call.

    Raises:
        AttributeError: ``module`` has no ``Device`` class or it has no ``nvlink_throughput``
            (an nvitop this guard was not written for).
    """
    device_cls = module.Device
    if not callable(getattr(device_cls, "nvlink_throughput", None)):
        raise AttributeError(f"{module.__name__}.Device has no nvlink_throughput()")
    classes = [device_cls] + [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and obj is not device_cls and issubclass(obj, device_cls)
    ]
    done: list[str] = []
    for cls in classes:
        for name, kind in GUARDED_METHODS.items():
            original = cls.__dict__.get(name)
            if original is None or getattr(original, GUARD_MARKER, False):
                continue
            setattr(cls, name, _make_guard(name, kind, original, module))
            done.append(f"{cls.__name__}.{name}")
    return done


def _on_device_module_loaded(module: Any) -> None:
    """Patch right after ``nvitop.api.device`` ran; report the outcome on stderr, never raise."""
    if not STATE.enabled:
        _stderr(f"off: {ENV_VAR}={STATE.env_value!r}, nvitop's NVLink throughput methods query NVML")
        return
    try:
        patched = patch_module(module)
    except Exception as exc:  # noqa: BLE001 - an import must not fail because of the guard
        STATE.error = f"{type(exc).__name__}: {exc}"
        _stderr(
            f"WARNING: guard NOT active, could not patch {module.__name__}: {STATE.error}. "
            "NVLink throughput queries will reach NVML."
        )
        return
    STATE.patched.extend(patched)
    _stderr(
        f"active: NVLink throughput methods of nvitop {_nvitop_version()} "
        f"({getattr(module, '__file__', '?')}) return N/A without calling NVML "
        f"({len(STATE.patched)} methods patched; {ENV_VAR}=off restores them)"
    )


def _nvitop_version() -> str:
    """Return ``nvitop.__version__`` while ``nvitop`` is still being imported, or ``"?"``."""
    try:
        import importlib

        # nvitop/version.py only assigns constants (for release builds); nvitop/__init__.py
        # imports it after nvitop.api, so it may not be loaded yet.
        return str(importlib.import_module("nvitop.version").__version__)
    except Exception:  # noqa: BLE001 - only used for the log line
        return "?"


class _PatchingLoader:
    """Delegating loader that runs the real loader, then patches the module."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _on_device_module_loaded(module)

    def __getattr__(self, name: str) -> Any:
        # get_data, get_filename, get_source, is_package, ... keep working.
        return getattr(self._loader, name)


class _DeviceModuleFinder:
    """``sys.meta_path`` entry that only reacts to :data:`TARGET_MODULE`."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _DeviceModuleFinder):
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is None or not hasattr(spec.loader, "exec_module"):
                _stderr(f"WARNING: guard NOT active, cannot hook the loader of {fullname}")
                return spec
            spec.loader = _PatchingLoader(spec.loader)
            return spec
        return None

    def invalidate_caches(self) -> None:
        """Nothing cached here."""


def install(environ: Any = None) -> GuardState:
    """Read :data:`ENV_VAR` and hook the import of nvitop (patching it unless the value is off).

    Called by the ``.pth`` line at interpreter start. Does not import nvitop: if
    ``nvitop.api.device`` is already imported (``install()`` called late), it is handled now;
    otherwise a finder is put at the front of ``sys.meta_path``. With ``off`` the finder only
    logs one line when nvitop is imported and changes nothing. Calling it twice is harmless
    (the setting read first stays in force).

    Args:
        environ: mapping to read the variable from; ``os.environ`` by default.

    Returns:
        :data:`STATE`, updated.
    """
    if STATE.installed:
        return STATE
    env = os.environ if environ is None else environ
    STATE.env_value = env.get(ENV_VAR)
    STATE.enabled, STATE.invalid = parse_setting(STATE.env_value)
    if STATE.invalid:
        # Printed now (every Python process) rather than on nvitop import: a typo in a manifest
        # should be seen even if it is only read in a `kubectl exec` shell.
        _stderr(f"WARNING: {ENV_VAR}={STATE.env_value!r} is not one of 'on', 'off'; keeping the guard ON")
    STATE.installed = True
    loaded = sys.modules.get(TARGET_MODULE)
    if loaded is not None:
        _on_device_module_loaded(loaded)
    else:
        sys.meta_path.insert(0, _DeviceModuleFinder())
    return STATE


def is_guarded(method: Any) -> bool:
    """Tell whether ``method`` (e.g. ``nvitop.Device.nvlink_throughput``) is a guard function."""
    return bool(getattr(method, GUARD_MARKER, False))
