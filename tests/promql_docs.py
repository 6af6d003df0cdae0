"""The PromQL a page of docs/ shows in its ```promql blocks, for the tests that check those
expressions (test_deploy.py against Prometheus, test_rollout_queries.py against the goldens)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path


def promql_blocks(doc: Path) -> list[str]:
    """Expressions in ```promql blocks: one per line, indented lines continue the previous one."""
    exprs: list[str] = []
    for block in re.findall(r"```promql\n(.*?)```", doc.read_text(encoding="utf-8"), re.S):
        for line in textwrap.dedent(block).splitlines():
            code = re.sub(r"\s+#.*$", "", line).rstrip()
            if not code.strip() or code.lstrip().startswith("#"):
                continue
            if code[0].isspace() and exprs:
                exprs[-1] += " " + code.strip()
            else:
                exprs.append(code)
    return exprs
