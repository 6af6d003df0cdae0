"""Two tiers of tests, chosen automatically.

A test is marked ``integration`` when it starts another process (the real exporter of
``exporter_proc.Exporter``, a real Prometheus of ``prometheus_proc``, any ``subprocess``, the
worker self-check) or is marked ``slow`` or ``hardware``. Everything else is the fast tier:
``python -m pytest -m "not integration"``. The full suite runs both.

The marking reads the names each test's code uses (its own code, its fixtures', and the helpers
in ``tests/`` it reaches), so a new test lands in the right tier without a decorator. A test the
reading misses but that starts a process anyway fails with a message saying so: the fast tier
never holds a hidden subprocess.
"""

from __future__ import annotations

import inspect
import os
import platform
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

# Names whose use means "starts another process". Attribute names count too (``subprocess.run``
# reads the name ``subprocess``), so a module alias or a product helper that always spawns is
# listed by the name a test uses.
STARTS_A_PROCESS = frozenset(
    {
        "Exporter",  # tests/exporter_proc.py: the real supervisor and worker
        "running_prometheus",  # tests/prometheus_proc.py: a real Prometheus
        "subprocess",  # any child process (promtool, openssl, chromium, python -c ...)
        "run_worker_check",  # exporter.common.selfcheck: a real worker interpreter
    }
)
_MARKED = ("slow", "hardware")


def _functions(obj: Any) -> Iterator[types.FunctionType]:
    """The plain functions behind a test, a fixture, a helper function or a helper class."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        yield from (f for f in (obj.fget, obj.fset, obj.fdel) if isinstance(f, types.FunctionType))
    elif isinstance(obj, type):
        for member in vars(obj).values():
            yield from _functions(member)
    elif callable(obj):
        obj = getattr(obj, "__func__", obj)  # a bound method
        inner = getattr(getattr(obj, "hypothesis", None), "inner_test", None)  # @given wraps the test
        obj = inspect.unwrap(inner if inner is not None else obj)
        if isinstance(obj, types.FunctionType):
            yield obj


def _codes(fn: types.FunctionType) -> Iterator[types.CodeType]:
    """A function's code and the code of every function and lambda nested in it."""
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        yield code
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def _is_test_helper(obj: Any) -> bool:
    """Defined in a module under tests/ (where the reading follows calls)."""
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    return path is not None and Path(path).resolve().is_relative_to(TESTS)


def _helpers(found: Any) -> list[Any]:
    """What a global name leads to in tests/: a function or class (through ``functools`` wrappers
    such as ``lru_cache``), or those held in a module-level dict, list or tuple (a table of renderers)."""
    values = (
        list(found.values())
        if isinstance(found, dict)
        else list(found)
        if isinstance(found, (list, tuple))
        else [found]
    )
    out = []
    for value in values:
        value = inspect.unwrap(value) if callable(value) else value
        if (inspect.isfunction(value) or inspect.isclass(value)) and _is_test_helper(value):
            out.append(value)
    return out


def _spawning_name(roots: list[Any], cls: type | None) -> str | None:
    """The first name of ``STARTS_A_PROCESS`` that ``roots`` or the tests/ helpers they reach use
    (module-level functions and classes of tests/, and members of the test's class ``cls``)."""
    members = dict(vars(cls)) if cls is not None else {}
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        for fn in _functions(obj):
            for code in _codes(fn):
                hit = STARTS_A_PROCESS.intersection(code.co_names)
                if hit:
                    return min(hit)
                for name in code.co_names:
                    if name in members:
                        todo.append(members[name])
                    else:
                        todo.extend(_helpers(fn.__globals__.get(name)))
    return None


def integration_reason(item: pytest.Item) -> str | None:
    """Why ``item`` belongs to the integration tier, or None for the fast tier."""
    if item.get_closest_marker("integration") is not None:
        return "marked integration"
    for mark in _MARKED:
        if item.get_closest_marker(mark) is not None:
            return f"marked {mark}"
    if item.path.is_relative_to(TESTS / "hardware"):  # its conftest marks them hardware after this hook
        return "under tests/hardware"
    if item.path.name == "test_golden.py" and os.environ.get("UPDATE_GOLDEN", "") not in ("", "0"):
        return "UPDATE_GOLDEN re-captures the fixtures from the real worker"
    if not isinstance(item, pytest.Function):
        return None
    roots: list[Any] = [item.obj]
    for hook in ("setup_class", "setup_method", "teardown_method", "teardown_class"):
        if item.cls is not None and hook in vars(item.cls):
            roots.append(vars(item.cls)[hook])
    for defs in item._fixtureinfo.name2fixturedefs.values():
        roots.extend(d.func for d in defs)
    name = _spawning_name(roots, item.cls)
    return None if name is None else f"uses {name}"


@pytest.hookimpl(tryfirst=True)  # before the -m selection reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        reason = integration_reason(item)
        if reason is not None and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration(reason=reason))


# The runtime check: a fast-tier test that starts a process anyway fails.

_CURRENT: list[pytest.Item] = []


def _refuse_in_fast_tier(what: str) -> None:
    if _CURRENT and _CURRENT[-1].get_closest_marker("integration") is None:
        raise AssertionError(
            f"{_CURRENT[-1].nodeid} is in the fast tier but starts a process ({what}); "
            "add the name it calls to STARTS_A_PROCESS in tests/conftest.py, or mark it @pytest.mark.integration"
        )


def _guarded(original: Callable[..., Any], what: str) -> Callable[..., Any]:
    def guard(*args: Any, **kwargs: Any) -> Any:
        _refuse_in_fast_tier(what)
        return original(*args, **kwargs)

    return guard


def pytest_configure(config: pytest.Config) -> None:
    platform.processor()  # runs `uname -p` once and caches it: not a test's process
    popen_execute: Any = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def execute_child(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> Any:
        _refuse_in_fast_tier(f"subprocess {str(args)[:120]}")
        return popen_execute(self, args, *rest, **kwargs)

    subprocess.Popen._execute_child = execute_child  # type: ignore[attr-defined]
    for name in ("fork", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            setattr(os, name, _guarded(getattr(os, name), f"os.{name}"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _CURRENT.append(item)
    try:
        yield
    finally:
        _CURRENT.pop()
