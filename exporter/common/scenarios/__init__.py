"""Scenarios shipped with the package, selectable by name: ``--nvml-backend fake:h200x2``.

The JSON files in this directory are package data (``pyproject.toml``), so the demo and the
no-GPU hint work after ``pip install .``, from a wheel and in the image, not only in a checkout.
``h200x1``, ``h200x2`` and ``h200x8`` are generated from measured H200 data by
``examples/scenarios/generate.py``, and so is ``h200x2-mig`` (GPU 0 in MIG mode with four GPU
instances); ``h200x2-nvlink-crash`` and ``h200x2-xid79`` add a crash and an Xid to ``h200x2``. The
same generator builds one scenario per other GPU generation and driver branch from documented
behaviour (``a100x2-r535``, ``l40sx2-r550``, ``h100x2-r550``, ``gh200x1-r570``, ``b200x2-r570``,
``gb200x2-r580``; docs/capabilities.md, "Scenario recipes"). The
format: ``docs/scenarios.md``. Standard library only (``Config`` resolves names before anything
else is imported).
"""

from __future__ import annotations

import re
from pathlib import Path

DIRECTORY = Path(__file__).resolve().parent
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def names() -> list[str]:
    """The shipped scenario names (file names without ``.json``), sorted."""
    return sorted(p.stem for p in DIRECTORY.glob("*.json"))


def is_name(text: str) -> bool:
    """True when ``text`` is meant as a scenario name rather than a path: no ``/`` and no ``.json``."""
    return "/" not in text and not text.endswith(".json") and bool(_NAME.fullmatch(text))


def path(name: str) -> Path:
    """The file of a shipped scenario.

    Args:
        name: a name from :func:`names`, e.g. ``"h200x2"``.

    Raises:
        KeyError: no shipped scenario has that name (the message lists the names).
    """
    if name not in names():
        raise KeyError(f"no shipped scenario named {name!r} (shipped: {', '.join(names())})")
    return DIRECTORY / f"{name}.json"
