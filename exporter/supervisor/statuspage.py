"""Server-rendered status page at ``/``: GPUs, features, worker, self-check, versions, links.

For operators who port-forward to one exporter pod when something looks odd. Plain HTML and CSS,
no script. It reads only the served state (:class:`exporter.supervisor.served.ServedState`: the fresh snapshot, feature
states, counters), so it never waits on NVML: a hung or crashing
worker leaves the page as fast as ``/metrics``. Each section is rendered on its own; a section
that fails says so and the rest of the page still renders.
"""

from __future__ import annotations

import html
import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from exporter import __version__
from exporter.common.collectors import identity, memory, power, temperature, utilization
from exporter.common.snapshot import GpuSample
from exporter.supervisor.quarantine import clear_command
from exporter.supervisor.stuck import StuckDetector
from guards.features import Reason

if TYPE_CHECKING:
    from exporter.supervisor.served import ServedState

log = logging.getLogger(__name__)

CSS = """
:root{--bad:#b42318;--bad-bg:#fde8e7;--warn:#8a5a00;--warn-bg:#fff4d6;--ok:#176b2c;--ok-bg:#e6f4ea;--muted:#667085;--line:#d0d5dd}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2939;background:#f9fafb}
header{background:#101828;color:#fff;padding:.8em 1.5em;display:flex;flex-wrap:wrap;gap:.4em 1.5em;align-items:baseline}
header h1{font-size:1.25em;margin:0}header a{color:#9ecbff}header .meta{color:#d0d5dd}
main{padding:.5em 1.5em 2em}
h2{font-size:1.05em;margin:1.4em 0 .4em}
table{border-collapse:collapse;background:#fff;border:1px solid var(--line);margin:.2em 0 .6em}
td,th{border-bottom:1px solid var(--line);padding:.3em .7em;text-align:left;vertical-align:top}
th{background:#f2f4f7;font-weight:600;white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.bad td{background:var(--bad-bg)}tr.warn td{background:var(--warn-bg)}tr.off td{color:var(--muted)}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace}
.badge{display:inline-block;padding:0 .5em;border-radius:.6em;font-size:.85em;font-weight:600;white-space:nowrap}
.badge.ok{background:var(--ok-bg);color:var(--ok)}.badge.bad{background:var(--bad);color:#fff}
.badge.warn{background:var(--warn-bg);color:var(--warn);border:1px solid #f5d18a}
.badge.off{background:#eaecf0;color:var(--muted)}
.alert{border-left:4px solid var(--bad);background:var(--bad-bg);padding:.5em .9em;margin:.8em 0}
.alert.warn{border-color:#f5b400;background:var(--warn-bg)}
.small{font-size:.85em;color:var(--muted)}
.cols{display:grid;grid-template-columns:repeat(auto-fit,minmax(34em,1fr));gap:0 2em;align-items:start}
dl{display:grid;grid-template-columns:max-content auto;gap:.15em 1em;margin:.2em 0}dt{font-weight:600}dd{margin:0}
header>*{min-width:0;max-width:100%}#ready .badge{white-space:normal}
table{max-width:100%}#gpus{width:100%}#gpus th{white-space:normal}
td{overflow-wrap:anywhere}td.num{overflow-wrap:normal}
code.command{display:inline-block;overflow-wrap:anywhere}
"""

GIB = 2**30


def _e(value: Any) -> str:
    """HTML-escaped text that always encodes (a lone surrogate from a driver string becomes \\udXXX)."""
    text = html.escape("" if value is None else str(value))
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _badge(text: str, kind: str) -> str:
    return f'<span class="badge {kind}">{_e(text)}</span>'


def _utc(ts: float | None, fmt: str = "%Y-%m-%d %H:%M:%SZ") -> str:
    return time.strftime(fmt, time.gmtime(ts)) if ts else "-"


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} ({number})"
    except ValueError:
        return str(number)


def _xid_info(xid: int) -> tuple[str, str, str]:
    """(class, severity, meaning) from the Xid catalog; blanks if the catalog cannot be read."""
    try:
        from exporter.supervisor.xid import classify

        info = classify(xid)
        return info.xid_class, info.severity, info.meaning
    except Exception:  # noqa: BLE001 - a broken catalog must not take the page down
        log.debug("Xid catalog unavailable", exc_info=True)
        return "", "", ""


# -- sections ---------------------------------------------------------------------------------


def _gpu_cells(g: GpuSample) -> tuple[str, str, str, str, str, str]:
    """(name, bus id, utilization, memory, temperature, power) of one GPU's readings."""
    ident, util, mem = g.reading(identity.Reading), g.reading(utilization.Reading), g.reading(memory.Reading)
    temp, power_r = g.reading(temperature.Reading), g.reading(power.Reading)
    util_s = f"{util.gpu_percent} %" if util and util.gpu_percent is not None else "-"
    used, total = (mem.used_bytes, mem.total_bytes) if mem else (None, None)
    mem_s = (
        f"{used / GIB:.1f} / {total / GIB:.1f} GiB ({100 * used / total:.0f} %)" if used is not None and total else "-"
    )
    temp_s = f"{temp.gpu_celsius} °C" if temp and temp.gpu_celsius is not None else "-"
    if temp and temp.memory_celsius is not None:
        temp_s += f" (HBM {temp.memory_celsius} °C)"
    power_s = "-"
    if power_r and power_r.usage_mw is not None:
        power_s = f"{power_r.usage_mw / 1000:.0f} W"
        if power_r.limit_mw:
            power_s += f" / {power_r.limit_mw / 1000:.0f} W"
    name = (ident.name if ident else None) or "-"
    bus = (ident.pci_bus_id if ident else None) or ""
    return name, bus, util_s, mem_s, temp_s, power_s


def _xid_cell(state: ServedState, uuid: str) -> str:
    latest = state.xids.latest(uuid) if uuid else None
    if latest is None:
        return "-"
    xid, count, total_xids = latest
    cls, severity, meaning = _xid_info(xid)
    kind = {"critical": "bad", "warning": "warn"}.get(severity, "off")
    who = [f"Xid {r.xid} by {r.who} at {_utc(r.ts, '%H:%M:%SZ')}" for r in reversed(state.xids.recent(uuid)) if r.who]
    return (
        f"{_badge(f'Xid {xid}', kind)} {_e(cls)}{f' / {_e(severity)}' if severity else ''} at "
        f'{_e(_utc(count.last_ts, "%H:%M:%SZ"))}<br><span class="small">{_e(meaning)}'
        f"{f' ({total_xids} Xids in total)' if total_xids > 1 else ''}</span>"
        + (f'<br><span class="small xid-processes">{"<br>".join(_e(w) for w in who)}</span>' if who else "")
    )


_STATE_BADGES = {
    "up": ("up", "ok"),
    "unknown": ("no fresh sample", "warn"),
    "lost": ("LOST", "bad"),
    "hung": ("HUNG", "bad"),
    "crashed": ("CRASHED", "bad"),
    "denied": ("DENIED to the exporter's pod", "warn"),
}


def _gpus(state: ServedState) -> str:
    snap = state.last
    fresh = {g.key for g in state.fresh_gpus()}
    stuck_ext = state.extension(StuckDetector)
    if state.fresh_snapshot() is None:
        note = (
            f'<div class="alert">No fresh NVML sample: GPU values are not shown (see <a href="/readyz">/readyz</a>: '
            f"{_e(state.ready()[1])}).</div>"
        )
    else:
        note = f'<p class="small">Sample taken {_e(_age(time.time() - snap.ts))} ago.</p>' if snap else ""
    by_key = {g.key: g for g in snap.gpus if g.state != "removed"} if snap else {}
    for known in state.health.gpus.values():
        by_key.setdefault(known.key, GpuSample(known.index, known.uuid, "unknown", bus_id=known.bus_id))
    rows = []
    for key, g in sorted(by_key.items(), key=lambda item: (item[1].index, item[0])):
        index = g.index
        rec = state.health.gpus.get(key)
        current = state.health.state_of(rec, state.fresh_snapshot() is not None) if rec else "unknown"
        uuid = g.uuid
        stuck = bool(uuid) and stuck_ext is not None and stuck_ext.suspected(uuid)
        text, kind = _STATE_BADGES.get(current, (current, "warn"))
        badge = _badge(text, kind)
        verdict = state.verdicts.current.get(uuid or f"index:{index}")
        if verdict is not None and verdict.verdict != "ok":
            vkind = "bad" if verdict.verdict in ("reset_gpu", "reboot_node") else "warn"
            cause = f"{_e(verdict.domain)}: {_e(verdict.cause)}"
            badge += f'<br>{_badge(verdict.verdict, vkind)} <span class="small verdict">{cause}</span>'
        detail = (rec.detail if rec and current != "up" else "") or ""
        if rec and rec.next_probe is not None:
            detail += f" (probe in {_age(rec.next_probe - time.monotonic())})"
        if rec and rec.unsupported:
            detail += f" unsupported here: {', '.join(rec.unsupported)}"
        shown = (
            g
            if key in fresh
            else GpuSample(g.index, g.uuid, g.state, {k: v for k, v in g.readings.items() if k == "identity"})
        )
        name, bus, util_s, mem_s, temp_s, power_s = _gpu_cells(shown)
        stuck_s = (
            _badge("STUCK", "bad") + '<br><span class="small">busy, no memory, no processes</span>'
            if stuck
            else _badge("no", "ok")
        )
        cls_row = "bad" if current in ("lost", "hung", "crashed") or stuck else ""
        rows.append(
            f'<tr class="{cls_row}" data-uuid="{_e(uuid)}" data-state="{_e(current)}"><td class="num">{_e(index)}</td>'
            f"<td><code>{_e(uuid)}</code></td>"
            f'<td>{_e(name)}<br><span class="small">{_e(bus)}</span></td>'
            f'<td>{badge}<br><span class="small">{_e(detail.strip())}</span></td>'
            f'<td class="num">{_e(util_s)}</td><td class="num">{_e(mem_s)}</td>'
            f'<td class="num">{_e(temp_s)}</td><td class="num">{_e(power_s)}</td>'
            f"<td>{stuck_s}</td><td>{_xid_cell(state, uuid)}</td></tr>"
        )
    if not rows:
        rows.append('<tr><td colspan="10">no GPUs known yet</td></tr>')
    return (
        note
        + '<table id="gpus"><tr><th>gpu</th><th>UUID</th><th>model / PCI bus id</th><th>state</th><th>utilization</th>'
        "<th>memory used / total</th><th>temperature</th><th>power / limit</th><th>stuck signature</th>"
        "<th>last Xid</th></tr>" + "".join(rows) + "</table>"
    )


def _features(state: ServedState) -> str:
    rows = []
    for name, st in sorted(state.feature_states().items()):
        reason = st.reason.value
        if reason == "quarantined":
            cls, badge = "bad", _badge("QUARANTINED", "bad")
        elif st.enabled:
            cls, badge = "", _badge("on", "ok")
        elif reason in ("known_issue", "unsupported"):
            cls, badge = (
                "warn" if reason == "known_issue" else "off",
                _badge("off", "warn" if reason == "known_issue" else "off"),
            )
        else:
            cls, badge = "off", _badge("off", "off")
        rows.append(
            f'<tr class="{cls}" data-feature="{_e(name)}" data-reason="{_e(reason)}"><td><code>{_e(name)}</code></td>'
            f"<td>{badge}</td><td>{_e(reason)}</td><td>{_e(st.detail)}</td></tr>"
        )
    return (
        '<table id="features"><tr><th>feature</th><th>state</th><th>reason</th><th>detail</th></tr>'
        + "".join(rows)
        + "</table>"
    )


def _quarantine_banner(state: ServedState) -> str:
    quarantined = {k: v for k, v in state.feature_states().items() if v.reason is Reason.QUARANTINED}
    if not quarantined:
        return ""
    path = state.config.state_file
    items = "".join(
        f'<li><code>{_e(k)}</code>: {_e(v.detail)}<br><code class="command">'
        f"{_e(clear_command(path, k) if path else 'NVGPU_STATE_FILE is empty: a restart retries it')}</code></li>"
        for k, v in sorted(quarantined.items())
    )
    return (
        f'<div class="alert" id="quarantine-alert"><b>{len(quarantined)} feature{"s" if len(quarantined) > 1 else ""} '
        f"quarantined</b> after worker crashes; every other metric continues. To retry one, clear it and "
        f"restart the exporter:<ul>{items}</ul></div>"
    )


def _driver_banner(state: ServedState) -> str:
    """LIB_RM_VERSION_MISMATCH: only a driver reload or a reboot cures it, and the page says so first."""
    if not state.nvml.driver_reload_required:
        return ""
    return (
        '<div class="alert" id="driver-reload-alert"><b>NVIDIA driver reload required</b>: the NVML library '
        f"({_e(state.system.nvml_version or 'userspace')}) does not match the loaded kernel module "
        f"({_e(state.nvml.kernel_module_version or 'unknown')}). Reload the driver or reboot the node; restarting "
        "the exporter does not help.</div>"
    )


def _worker(state: ServedState) -> str:
    now = time.time()
    w = state.worker
    if w.respawn_stopped:
        badge = _badge("respawning stopped (hung workers cannot be reaped)", "bad")
    elif w.stuck:
        badge = _badge("stuck in the driver (D state)", "bad")
    elif state.last_init_error:
        badge = _badge("NVML unavailable", "bad")
    elif state.fresh_snapshot() is not None:
        badge = _badge("sampling", "ok")
    else:
        badge = _badge("starting / no fresh sample", "warn")
    restarts = ", ".join(f"{k}: {v}" for k, v in sorted(w.restarts.items()) if v) or "none"
    crashes = (
        "<br>".join(f"<code>{_e(f)}</code> in <code>{_e(fn)}</code>: {n}" for (f, fn), n in sorted(w.crashes.items()))
        or "none"
    )
    uptime = f" (up {_age(now - w.started_at)})" if w.started_at else ""
    snap = state.last
    age = f"{_age(now - snap.ts)} ago" if snap and snap.ts else "none yet"
    sig = _signal_name(w.last_exit_signal) if w.last_exit_signal else "none"
    return (
        f'<table id="worker"><tr><th>state</th><td>{badge}</td></tr>'
        f"<tr><th>pid</th><td>{_e(w.pid or '-')}</td></tr>"
        f"<tr><th>started</th><td>{_e(_utc(w.started_at))}{_e(uptime)}</td></tr>"
        f"<tr><th>last sample</th><td>{_e(age)}</td></tr>"
        f'<tr class="{"warn" if restarts != "none" else ""}"><th>restarts</th><td>{_e(restarts)}</td></tr>'
        f'<tr class="{"bad" if w.crashes else ""}"><th>crashes by feature</th><td>{crashes}</td></tr>'
        f"<tr><th>last exit signal / code</th><td>{_e(sig)} / {_e(w.last_exit_code)}</td></tr>"
        f'<tr class="{"bad" if state.last_init_error else ""}"><th>NVML</th>'
        f"<td>{_e(state.last_init_error or 'initialised')}</td></tr>"
        "</table>"
    )


def _selfcheck(state: ServedState) -> str:
    rows = []
    checks = dict(state.selfchecks)
    for process in sorted({*checks, "supervisor", "worker"}):
        res = checks.get(process)
        if res is None:
            rows.append(
                f'<tr class="warn" data-process="{_e(process)}"><td>{_e(process)}</td>'
                f"<td>{_badge('not reported', 'warn')}</td>"
                "<td>-</td><td>no self-check result from this process yet</td></tr>"
            )
            continue
        problems = list(res.problems)
        mods = ", ".join(f"{m.module} {m.distribution_version or m.version or ''}".strip() for m in res.reports)
        rows.append(
            f'<tr class="{"bad" if problems else ""}" data-process="{_e(process)}"><td>{_e(process)}</td>'
            f"<td>{_badge('FAILED', 'bad') if problems else _badge('ok', 'ok')}</td>"
            f'<td class="small">{_e(mods) or "-"}</td><td>{"<br>".join(_e(p) for p in problems) or "-"}</td></tr>'
        )
    lib = state.native
    if lib is not None:
        kind = "bad" if lib.problem else "ok" if lib.state == "ok" else "warn"
        rows.append(
            f'<tr class="{"bad" if lib.problem else ""}" data-process="native" data-state="{_e(lib.state)}">'
            f"<td>libnvidia-ml</td><td>{_badge(lib.state, kind)}</td>"
            f'<td class="small"><code>{_e(lib.realpath or lib.path or "none")}</code> ({_e(lib.origin)}), '
            f"{_e(lib.library_version or '?')}; kernel module {_e(lib.kernel_module_version or 'none')}; "
            f"NVML {_e(lib.nvml_version or '?')}</td><td>{_e(lib.message or lib.evidence) or '-'}</td></tr>"
        )
    return (
        '<table id="selfcheck"><tr><th>process</th><th>result</th><th>modules imported</th><th>problems</th></tr>'
        + "".join(rows)
        + "</table>"
    )


def _build(state: ServedState) -> str:
    s = state.system
    items = [
        ("exporter", __version__),
        ("nvidia-ml-py", s.nvidia_ml_py_version),
        ("driver", s.driver_version),
        ("NVML", s.nvml_version),
        ("CUDA driver", s.cuda_driver_version),
        ("Python", state.python_version),
    ]
    return '<dl id="build">' + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v or '?')}</dd>" for k, v in items) + "</dl>"


def _section(title: str, render: Callable[[ServedState], str], state: ServedState, anchor: str) -> str:
    try:
        body = render(state)
    except Exception as exc:  # noqa: BLE001 - one broken section must not hide the others
        log.exception("status page section %r failed", title)
        body = f'<div class="alert">this section could not be rendered: {_e(type(exc).__name__)}: {_e(exc)}</div>'
    return f'<section id="{anchor}-section"><h2>{_e(title)}</h2>{body}</section>' if title else body


def render(state: ServedState) -> str:
    """The whole page as HTML text (reads in-memory state only)."""
    ready, why = state.ready()
    ready_badge = _badge("ready", "ok") if ready else _badge(f"not ready: {why}", "bad")
    metrics = _e(state.config.telemetry_path)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>nvgpu-exporter</title><style>{CSS}</style></head>
<body>
<header><h1>nvgpu-exporter {_e(__version__)}</h1>
<nav><a href="{metrics}">{metrics}</a> · <a href="/healthz">/healthz</a> · <a href="/readyz">/readyz</a></nav>
<span id="ready">{ready_badge}</span>
<span class="meta">driver {_e(state.system.driver_version or "?")}
 · page rendered {_e(_utc(time.time()))}</span></header>
<main>
{_section("", _driver_banner, state, "driver")}
{_section("", _quarantine_banner, state, "quarantine")}
{_section("GPUs", _gpus, state, "gpus")}
<div class="cols"><div>
{_section("Features", _features, state, "features")}
</div><div>
{_section("Worker", _worker, state, "worker")}
{_section("Self-check", _selfcheck, state, "selfcheck")}
{_section("Build", _build, state, "build")}
</div></div>
</main>
</body></html>
"""
