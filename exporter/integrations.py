"""Supervisor-side concerns that are not NVML: stuck signature, kernel log, pod attribution.

:func:`attach` wires each enabled concern into the supervisor (snapshot hooks and family hooks)
and returns the coroutines to run beside it.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from exporter.config import Config
from exporter.supervisor import Supervisor


def attach(supervisor: Supervisor, config: Config) -> list[Coroutine[Any, Any, None]]:
    """Wire the optional concerns; returns background coroutines."""
    return []
