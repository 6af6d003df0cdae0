"""docs/layout.md names every module under exporter/ and guards/ (and nothing that is gone)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = (ROOT / "docs" / "layout.md").read_text()


def modules() -> set[str]:
    return {
        str(p.relative_to(ROOT))
        for base in ("exporter", "guards")
        for p in (ROOT / base).rglob("*.py")
        if "_pb2" not in p.name
    }


def mentioned() -> set[str]:
    """Module paths the page names. Each section ``## <package>/ …`` has a code block listing
    files; a ``dir/`` line opens a subdirectory for the lines indented below it."""
    found: set[str] = set()
    for package, body in re.findall(r"^## (\w+)/[^\n]*\n+```\n(.*?)```", LAYOUT, flags=re.S | re.M):
        dirs: dict[int, str] = {}
        for line in body.splitlines():
            indent = len(line) - len(line.lstrip())
            dirs = {level: d for level, d in dirs.items() if level < indent}
            for token in line.split():
                if token.endswith("/") and re.fullmatch(r"[\w/]+", token):
                    dirs[indent] = token
                elif re.fullmatch(r"[\w/]+\.py", token):
                    prefix = "".join(d for level, d in sorted(dirs.items()) if level < indent)
                    found.add(f"{package}/{prefix}{token}")
                else:
                    break  # the description starts
    return found


def test_every_module_is_in_the_layout() -> None:
    missing = modules() - mentioned()
    assert not missing, f"add to docs/layout.md: {sorted(missing)}"


def test_the_layout_names_no_module_that_is_gone() -> None:
    gone = mentioned() - modules()
    assert not gone, f"docs/layout.md names modules that do not exist: {sorted(gone)}"
