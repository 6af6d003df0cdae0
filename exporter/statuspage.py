"""Server-rendered status page at ``/``: GPUs, features, worker, self-check, links. Never waits on NVML."""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING, Any

from exporter import __version__

if TYPE_CHECKING:
    from exporter.supervisor import Supervisor

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f3f3f3}.bad{background:#fde2e2;font-weight:bold}.warn{background:#fff4d6}.ok{color:#176b2c}
code{background:#f3f3f3;padding:0 .2em}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _gpu_rows(sup: Supervisor) -> list[str]:
    snap = sup.fresh_snapshot()
    if snap is None:
        return ['<tr><td colspan="10">no fresh sample (see <a href="/readyz">/readyz</a>)</td></tr>']
    rows = []
    stuck = sup.stuck_state
    for g in snap["gpus"]:
        r = g["readings"]
        ident = r.get("identity", {})
        util = r.get("utilization", {})
        mem = r.get("memory", {})
        temp = r.get("temperature", {})
        power = r.get("power", {})
        last_xid = max(((x, ts) for (gi, u, x), (c, ts) in sup.xids.items() if u == g["uuid"]), key=lambda p: p[1], default=None)
        util_s = f"{util['gpu_percent']} %" if util.get("gpu_percent") is not None else "-"
        mem_s = (f"{mem['used_bytes'] / 2**30:.1f} / {mem['total_bytes'] / 2**30:.1f} GiB"
                 if mem.get("used_bytes") is not None and mem.get("total_bytes") else "-")
        temp_s = f"{temp['gpu_celsius']} °C" if temp.get("gpu_celsius") is not None else "-"
        power_s = f"{power['usage_mw'] / 1000:.0f} W" if power.get("usage_mw") is not None else "-"
        is_stuck = stuck(g["uuid"])
        xid_s = f"Xid {last_xid[0]} at {time.strftime('%H:%M:%S', time.gmtime(last_xid[1]))}Z" if last_xid else "-"
        cls = ' class="bad"' if not g["up"] or is_stuck else ""
        rows.append(
            f"<tr{cls}><td>{_e(g['index'])}</td><td><code>{_e(g['uuid'])}</code></td><td>{_e(ident.get('name'))}</td>"
            f"<td>{_e(ident.get('pci_bus_id'))}</td><td>{'up' if g['up'] else 'LOST'}</td><td>{_e(util_s)}</td>"
            f"<td>{_e(mem_s)}</td><td>{_e(temp_s)}</td><td>{_e(power_s)}</td>"
            f"<td>{'STUCK' if is_stuck else 'no'}</td><td>{_e(xid_s)}</td></tr>"
        )
    return rows


def render(sup: Supervisor) -> str:
    """The whole page as HTML text."""
    ready, why = sup.ready()
    features = []
    for name, st in sorted(sup.feature_states().items()):
        cls = "bad" if st["reason"] == "quarantined" else ("warn" if not st["enabled"] else "")
        features.append(f'<tr class="{cls}"><td>{_e(name)}</td><td>{"on" if st["enabled"] else "off"}</td>'
                        f'<td>{_e(st["reason"])}</td><td>{_e(st.get("detail", ""))}</td></tr>')
    checks = []
    for process, res in sorted(sup.selfchecks.items()):
        problems = res.get("problems", [])
        cls = "bad" if problems else "ok"
        checks.append(f'<tr><td>{_e(process)}</td><td class="{cls}">{"FAILED" if problems else "ok"}</td>'
                      f'<td>{"<br>".join(_e(p) for p in problems) or "-"}</td></tr>')
    restarts = ", ".join(f"{k}: {v}" for k, v in sorted(sup.restarts.items())) or "none"
    system = sup.system
    started = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(sup.worker_started_at)) if sup.worker_started_at else "-"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>nvgpu-exporter</title><style>{CSS}</style></head>
<body>
<h1>nvgpu-exporter {_e(__version__)}</h1>
<p><a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> · <a href="/readyz">/readyz</a>
 · ready: <b class="{'ok' if ready else 'bad'}">{'yes' if ready else 'no'}</b> ({_e(why)})</p>
<h2>GPUs</h2>
<table id="gpus"><tr><th>gpu</th><th>UUID</th><th>model</th><th>PCI bus id</th><th>state</th><th>utilization</th><th>memory</th>
<th>temperature</th><th>power</th><th>stuck signature</th><th>last Xid</th></tr>
{''.join(_gpu_rows(sup))}</table>
<h2>Features</h2>
<table id="features"><tr><th>feature</th><th>state</th><th>reason</th><th>detail</th></tr>{''.join(features)}</table>
<h2>Worker</h2>
<table id="worker"><tr><th>pid</th><td>{_e(sup.worker_pid)}</td></tr><tr><th>started</th><td>{_e(started)}</td></tr>
<tr><th>restarts</th><td>{_e(restarts)}</td></tr><tr><th>last exit signal / code</th><td>{sup.last_exit_signal} / {sup.last_exit_code}</td></tr>
<tr><th>stuck</th><td class="{'bad' if sup.worker_stuck else ''}">{'yes' if sup.worker_stuck else 'no'}</td></tr>
<tr><th>NVML</th><td>{_e(sup.last_init_error or 'ok')}</td></tr></table>
<h2>Self-check</h2>
<table id="selfcheck"><tr><th>process</th><th>result</th><th>problems</th></tr>{''.join(checks)}</table>
<h2>Build</h2>
<p>exporter {_e(__version__)} · driver {_e(system.get('driver_version', '?'))} · NVML {_e(system.get('nvml_version', '?'))}
 · CUDA driver {_e(system.get('cuda_driver_version', '?'))} · nvidia-ml-py {_e(system.get('nvidia_ml_py_version', '?'))}
 · Python {_e(sup.python_version)}</p>
</body></html>
"""
