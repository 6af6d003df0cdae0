"""Generate the Grafana dashboards in this directory from code.

    python dashboards/generate.py           # rewrite gpu-fleet.json and exporter-health.json
    python dashboards/generate.py --check   # exit 1 if the committed JSON differs from a fresh build

Built with Grafana's own `grafana-foundation-sdk` (Python 3.11+, pinned in
``dashboards/requirements.txt``: the SDK's version is a build timestamp, and each build may change
the JSON it writes). It writes the current dashboard schema (``schemaVersion`` 41, the classic JSON
model Grafana 11 and 12 import). Every panel and variable uses the ``datasource`` variable
(``${datasource}``), never a data source UID, so the files import into any Grafana.

Only metric names from docs/metrics.md are used (tests/test_dashboards.py checks), and every panel
query is sent to a real Prometheus scraping the real exporter (tests/test_prometheus_e2e.py).
The Xid class regexes come from exporter/supervisor/xid/catalog.json, so a catalog change shows up here as
a diff that the test asks you to regenerate.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    dashboard,
    prometheus,
    stat,
    statetimeline,
    table,
    timeseries,
)
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm
from grafana_foundation_sdk.models.common import DataSourceRef

from exporter.supervisor.xid import CLASSES, UNKNOWN_CLASS, codes_of_class, promql_regex

HERE = Path(__file__).resolve().parent
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
TAGS = ["nvgpu-exporter", "nvidia", "gpu"]

# Label matchers. cluster and node are target labels that only some set-ups add (the scrape
# config in deploy/prometheus adds `node`); the variables' "All" value is `.*`, which also
# matches a series without the label, so the dashboards work with and without them.
FLEET = 'cluster=~"$cluster", node=~"$node", instance=~"$instance"'
GPU = FLEET + ', uuid=~"$gpu"'
HEALTH = 'job=~"$job", cluster=~"$cluster", node=~"$node", instance=~"$instance"'
GPU_LEGEND = "{{instance}} GPU {{gpu}}"
TARGET_BY = "cluster, node, instance"
GPU_BY = TARGET_BY + ", gpu, uuid"


# -- small helpers over the SDK builders ------------------------------------------------------


def _query(
    expr: str, ref: str, legend: str | None = None, *, instant: bool = False, table: bool = False
) -> prometheus.Dataquery:
    """One Prometheus target: a range query, or an instant one (``table``: one frame with a row per series)."""
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend is not None:
        q = q.legend_format(legend)
    if instant:
        q = q.instant().format(pm.PromQueryFormat.TABLE if table else pm.PromQueryFormat.TIME_SERIES)
    else:
        q = q.range()
    return q


def _targets(
    panel: Any, queries: Sequence[tuple[str, str | None]], *, instant: bool = False, table: bool = False
) -> Any:
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, chr(ord("A") + i), legend, instant=instant, table=table))
    return panel


def _thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    return (
        dashboard.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=v, color=c) for v, c in steps])
    )


def _mapping(options: dict[str, tuple[str, str]]) -> list[dm.ValueMapping]:
    return [
        dm.ValueMap(
            options={
                k: dm.ValueMappingResult(text=t, color=c, index=i) for i, (k, (t, c)) in enumerate(options.items())
            }
        )
    ]


def timeseries_panel(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str | None]],
    unit: str,
    *,
    w: int = 12,
    h: int = 8,
    stacked: bool = False,
    bars: bool = False,
    min_val: float | None = 0,
    max_val: float | None = None,
    mappings: list[dm.ValueMapping] | None = None,
) -> timeseries.Panel:
    p = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(w)
        .height(h)
        .legend(
            common.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.TABLE)
            .placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
        .fill_opacity(10 if not bars else 80)
        .line_width(1)
        .show_points(cm.VisibilityMode.NEVER)
    )
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    if stacked:
        p = p.stacking(common.StackingConfig().mode(cm.StackingMode.NORMAL))
    if bars:
        p = p.draw_style(cm.GraphDrawStyle.BARS)
    if mappings:
        p = p.mappings(mappings)
    return _targets(p, queries)


def stat_panel(
    title: str,
    description: str,
    expr: str,
    unit: str,
    thresholds: dashboard.ThresholdsConfig,
    *,
    w: int = 4,
    h: int = 4,
    mappings: list[dm.ValueMapping] | None = None,
) -> stat.Panel:
    p = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(w)
        .height(h)
        .thresholds(thresholds)
        .color_mode(cm.BigValueColorMode.BACKGROUND)
        .graph_mode(cm.BigValueGraphMode.AREA)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if mappings:
        p = p.mappings(mappings)
    return _targets(p, [(expr, None)])


def table_panel(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str | None]],
    *,
    w: int = 12,
    h: int = 8,
    hide: Sequence[str] = (),
    rename: dict[str, str] | None = None,
    unit: str | None = None,
    overrides: Sequence[tuple[str, list[dm.DynamicConfigValue]]] = (),
    thresholds: dashboard.ThresholdsConfig | None = None,
    color_column: str | None = None,
    mappings: list[dm.ValueMapping] | None = None,
) -> table.Panel:
    """An instant-query table; several queries are merged on their common labels."""
    p = table.Panel().title(title).description(description).datasource(DS).span(w).height(h).filterable(True)
    if unit:
        p = p.unit(unit)
    if thresholds is not None:
        p = p.thresholds(thresholds)
    if mappings:
        p = p.mappings(mappings)
    if len(queries) > 1:
        p = p.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
    excluded = {name: True for name in ("Time", "__name__", "job", *hide)}
    p = p.with_transformation(
        dm.DataTransformerConfig(
            id_val="organize", options={"excludeByName": excluded, "renameByName": dict(rename or {})}
        )
    )
    for name, props in overrides:
        p = p.override_by_name(name, props)
    if color_column:
        p = p.override_by_name(
            color_column, [dm.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"})]
        )
    return _targets(p, queries, instant=True, table=True)


def bargauge_panel(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str | None]],
    unit: str,
    thresholds: dashboard.ThresholdsConfig,
    *,
    w: int = 12,
    h: int = 8,
    mappings: list[dm.ValueMapping] | None = None,
) -> bargauge.Panel:
    p = (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(w)
        .height(h)
        .min(0)
        .thresholds(thresholds)
        .orientation(cm.VizOrientation.HORIZONTAL)
        .display_mode(cm.BarGaugeDisplayMode.GRADIENT)
        .show_unfilled(True)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if mappings:
        p = p.mappings(mappings)
    return _targets(p, queries, instant=True)


def state_timeline_panel(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str | None]],
    mappings: list[dm.ValueMapping],
    thresholds: dashboard.ThresholdsConfig,
    *,
    w: int = 12,
    h: int = 8,
) -> statetimeline.Panel:
    p = (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .span(w)
        .height(h)
        .mappings(mappings)
        .thresholds(thresholds)
        .show_value(cm.VisibilityMode.NEVER)
        .merge_values(True)
        .fill_opacity(80)
        .line_width(0)
        .color_scheme(dashboard.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
    )
    return _targets(p, queries)


def variable(
    name: str, label: str, query: str, *, all_value: str | None = ".*", description: str = ""
) -> dashboard.QueryVariable:
    v = (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query(query)
        .multi(True)
        .include_all(True)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
    )
    if all_value is not None:
        v = v.all_value(all_value)
    if description:
        v = v.description(description)
    return v


def datasource_variable() -> dashboard.DatasourceVariable:
    return (
        dashboard.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .description("The Prometheus that scrapes nvgpu-exporter")
    )


def xid_classified(inner: str) -> str:
    """``inner`` (series with an ``xid`` label) with a ``class`` label from the Xid catalog.

    Every series first gets class ``unknown``; then one label_replace per catalog class overwrites
    it for that class's codes (PromQL anchors the regex at both ends).
    """
    expr = f'label_replace({inner}, "class", "{UNKNOWN_CLASS}", "xid", ".*")'
    for cls in CLASSES:
        codes = codes_of_class(cls)
        if cls == UNKNOWN_CLASS or not codes:
            continue
        expr = f'label_replace(\n  {expr},\n  "class", "{cls}", "xid", "{promql_regex(codes)}"\n)'
    return expr


# -- event panels: "none" while scraped and quiet, No data while not scraped ------------------------
#
# An event panel counts things that happen or states nothing should be in (Xids, worker restarts
# and crashes, quarantines, lost or stuck GPUs, error counters). Most of its series exist only once
# something happened, so "healthy, nothing happened" and "not scraped" both came back empty and both
# read "No data". Grafana's noValue cannot tell them apart either: it replaces any empty result.
# So the query itself answers 0 while the exporter is scraped and nothing happened (`... or on ()
# <series the exporter always has> * 0`), and a value mapping writes that 0 as "none". The guard
# series (nvgpu_up, nvgpu_device_up) get a staleness marker on the first failed scrape, so the 0
# goes with them and the panel says No data. Measurements (temperature, power, utilization, ...) and
# inventory keep their plain behaviour: No data only when there is no data.
NONE_TEXT = "none"
QUIET = ' "none": scraped, nothing happened; No data: not scraped.'
"""The sentence every event panel's description ends with."""
NONE = _mapping({"0": (NONE_TEXT, "green")})
"""Shows an event panel's 0 as "none": scraped, nothing happened."""


def quiet_zero(expr: str, guard: str, **labels: str) -> str:
    """``expr``, or a 0 while the exporter is scraped and ``expr`` has no series.

    Args:
        expr: the panel's query.
        guard: series the exporter has on every successful scrape (``nvgpu_up``,
            ``nvgpu_device_up``), aggregated to the panel's grouping; stale, hence absent, as soon as
            a scrape fails or the target goes.
        labels: labels for the 0 series, e.g. the legend's label set to "none".

    Returns:
        ``(expr) or on () (<guard> * 0)``: ``on ()`` keeps the 0 out while ``expr`` has any series.
    """
    zero = f"{guard} * 0"
    for name, value in labels.items():
        zero = f'label_replace({zero}, "{name}", "{value}", "", "")'
    return f"({expr})\nor on () ({zero})"


def _ids(d: dict[str, Any]) -> dict[str, Any]:
    """Give every panel (rows included) a stable id in layout order."""
    for i, panel in enumerate(d["panels"], start=1):
        panel["id"] = i
    return d


def to_json(builder: cogbuilder.Builder[Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    return _ids(data)


def _base(uid: str, title: str, description: str) -> dashboard.Dashboard:
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .timepicker(dashboard.TimePicker().refresh_intervals(["10s", "30s", "1m", "5m", "15m"]))
    )


def _link(title: str, uid: str) -> dashboard.DashboardLink:
    return (
        dashboard.DashboardLink(title)
        .type(dm.DashboardLinkType.LINK)
        .url(f"/d/{uid}?${{__url_time_range}}&${{__all_variables}}")
        .icon("dashboard")
        .keep_time(True)
        .include_vars(False)
        .target_blank(False)
        .as_dropdown(False)
    )


FLEET_UID = "nvgpu-fleet"
HEALTH_UID = "nvgpu-exporter-health"
OK_RED = _thresholds((None, "green"), (1, "red"))
ALWAYS_BLUE = _thresholds((None, "blue"))
ALWAYS_GREEN = _thresholds((None, "green"))
SOLID = dashboard.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS)


# -- GPU fleet -------------------------------------------------------------------------------


def gpu_fleet() -> dict[str, Any]:
    d = (
        _base(
            FLEET_UID,
            "NVIDIA GPU fleet (nvgpu-exporter)",
            "Cluster -> node -> GPU drill-down from nvgpu-exporter metrics (docs/metrics.md). GPUs are named by UUID; "
            "`gpu` is the NVML index on that node, not the index a container sees.",
        )
        .link(_link("Exporter health", HEALTH_UID))
        .with_variable(datasource_variable())
        .with_variable(
            variable(
                "cluster",
                "Cluster",
                "label_values(nvgpu_up, cluster)",
                description="Target label `cluster`, if your Prometheus adds one (All = `.*` also matches none)",
            )
        )
        .with_variable(
            variable(
                "node",
                "Node",
                'label_values(nvgpu_up{cluster=~"$cluster"}, node)',
                description="Target label `node` (deploy/prometheus/scrape-config.yaml adds it; All also matches none)",
            )
        )
        .with_variable(
            variable("instance", "Instance", 'label_values(nvgpu_up{cluster=~"$cluster", node=~"$node"}, instance)')
        )
        .with_variable(variable("gpu", "GPU (UUID)", f"label_values(nvgpu_gpu_info{{{FLEET}}}, uuid)"))
    )

    d = _fleet(d)
    d = (
        d.with_row(dashboard.Row("Overview"))
        .with_panel(
            stat_panel(
                "GPUs",
                "GPUs reported by the selected exporters (nvgpu_device_up series).",
                f"count(nvgpu_device_up{{{GPU}}})",
                "none",
                ALWAYS_BLUE,
            )
        )
        .with_panel(
            stat_panel(
                "GPUs lost, hung or crashed",
                "GPUs with a fault of their own (nvgpu_device_state lost, hung or crashed): left out "
                "of sampling and probed, the others unaffected. A worker that is not sampling at all "
                "(state unknown) is not counted here." + QUIET,
                quiet_zero(
                    f'sum(nvgpu_device_state{{{GPU}, state=~"lost|hung|crashed"}})', f"sum(nvgpu_device_up{{{GPU}}})"
                ),
                "none",
                OK_RED,
                mappings=NONE,
            )
        )
        .with_panel(
            stat_panel(
                "GPUs with the stuck signature",
                "Busy, nothing running (no SM active by GPM, or no memory used), no processes for "
                "NVGPU_STUCK_AFTER_SECONDS (nvgpu_stuck_context_suspected). See the table below and docs/runbook.md."
                + QUIET,
                quiet_zero(f"sum(nvgpu_stuck_context_suspected{{{GPU}}})", f"sum(nvgpu_device_up{{{GPU}}})"),
                "none",
                OK_RED,
                mappings=NONE,
            )
        )
        .with_panel(
            stat_panel(
                "Mean GPU utilization",
                "Mean of nvgpu_gpu_utilization_ratio over the selected GPUs. GPUs in MIG mode have no "
                "device-wide utilization and are not in this mean: see the MIG instances row.",
                f"avg(nvgpu_gpu_utilization_ratio{{{GPU}}})",
                "percentunit",
                ALWAYS_BLUE,
            )
        )
        .with_panel(
            stat_panel(
                "Power draw",
                "Sum of nvgpu_power_usage_watts over the selected GPUs.",
                f"sum(nvgpu_power_usage_watts{{{GPU}}})",
                "watt",
                ALWAYS_BLUE,
            )
        )
        .with_panel(
            stat_panel(
                "Exporters without fresh data",
                "Selected exporters whose nvgpu_up is 0 (NVML not initialised or "
                "the last sample is stale). The Exporter health dashboard says why." + QUIET,
                f"sum(1 - nvgpu_up{{{FLEET}}})",
                "none",
                OK_RED,
                mappings=NONE,
            )
        )
        .with_panel(
            table_panel(
                "GPU inventory",
                "nvgpu_gpu_info: one row per GPU.",
                [(f"nvgpu_gpu_info{{{GPU}}}", None)],
                w=24,
                h=6,
                hide=("Value",),
                rename={"name": "model", "gpu": "index"},
            )
        )
    )

    d = (
        d.with_row(dashboard.Row("Utilization and memory"))
        .with_panel(
            timeseries_panel(
                "GPU utilization",
                "Share of time a kernel ran (nvmlDeviceGetUtilizationRates().gpu). Absent for GPUs in MIG mode "
                "(NVML does not support it there): their GPU instances' GPM activity is in the MIG instances row.",
                [(f"nvgpu_gpu_utilization_ratio{{{GPU}}}", GPU_LEGEND)],
                "percentunit",
                max_val=1,
            )
        )
        .with_panel(
            timeseries_panel(
                "Memory used / total",
                "Framebuffer memory used (v2: excluding driver-reserved) and total (nvmlDeviceGetMemoryInfo).",
                [
                    (f"nvgpu_memory_used_bytes{{{GPU}}}", GPU_LEGEND + " used"),
                    (f"nvgpu_memory_total_bytes{{{GPU}}}", GPU_LEGEND + " total"),
                ],
                "bytes",
            )
        )
        .with_panel(
            timeseries_panel(
                "Memory copy utilization",
                "Share of the driver's sample period the memory controller was reading or writing device memory "
                "(nvmlDeviceGetUtilizationRates().memory; dcgm-exporter's memory copy utilization). Not memory "
                "used / total: see 'Memory used / total'. GPM's DRAM bandwidth (Profiling row) says how much of "
                "the bandwidth was used.",
                [(f"nvgpu_memory_copy_utilization_ratio{{{GPU}}}", GPU_LEGEND)],
                "percentunit",
                max_val=1,
            )
        )
        .with_panel(
            timeseries_panel(
                "Compute processes",
                "Compute processes NVML lists (0 without hostPID: see docs).",
                [(f"nvgpu_compute_processes{{{GPU}}}", GPU_LEGEND)],
                "none",
            )
        )
    )

    d = _mig_instances(d)

    d = (
        d.with_row(dashboard.Row("Power, energy and temperature"))
        .with_panel(
            timeseries_panel(
                "Power draw and limit",
                "nvgpu_power_usage_watts and the enforced limit.",
                [
                    (f"nvgpu_power_usage_watts{{{GPU}}}", GPU_LEGEND),
                    (f"nvgpu_power_limit_watts{{{GPU}}}", GPU_LEGEND + " limit"),
                ],
                "watt",
            )
        )
        .with_panel(
            timeseries_panel(
                "Average power from the energy counter",
                "rate() of nvgpu_energy_consumption_joules_total: the mean power between samples, which the "
                "instantaneous power reading can miss.",
                [(f"rate(nvgpu_energy_consumption_joules_total{{{GPU}}}[$__rate_interval])", GPU_LEGEND)],
                "watt",
            )
        )
        .with_panel(
            bargauge_panel(
                "Energy in the time range",
                "increase() of nvgpu_energy_consumption_joules_total over the dashboard's time range, in kWh.",
                [(f"increase(nvgpu_energy_consumption_joules_total{{{GPU}}}[$__range]) / 3600000", GPU_LEGEND)],
                "kwatth",
                ALWAYS_BLUE,
            )
        )
        .with_panel(
            timeseries_panel(
                "Temperatures",
                "GPU core and HBM temperature.",
                [
                    (f"nvgpu_gpu_temperature_celsius{{{GPU}}}", GPU_LEGEND + " core"),
                    (f"nvgpu_memory_temperature_celsius{{{GPU}}}", GPU_LEGEND + " memory"),
                ],
                "celsius",
                min_val=None,
            )
        )
        .with_panel(
            timeseries_panel(
                "Power by scope",
                "Each scope is its own metric family (never a label the exporter mixes): the GPU alone "
                "(nvgpu_power_usage_watts), its HBM (nvgpu_memory_power_usage_watts, where NVML reports it) and "
                "the whole Grace module (nvgpu_module_power_usage_watts, Grace Hopper / Blackwell only). The "
                "scope label here is the dashboard's. The energy counter's scope is not reported by NVML.",
                [
                    (
                        f'label_replace(nvgpu_power_usage_watts{{{GPU}}}, "scope", "gpu", "", "")'
                        f' or label_replace(nvgpu_memory_power_usage_watts{{{GPU}}}, "scope", "memory", "", "")'
                        f' or label_replace(nvgpu_module_power_usage_watts{{{GPU}}}, "scope", "module", "", "")',
                        GPU_LEGEND + " {{scope}}",
                    )
                ],
                "watt",
                w=24,
            )
        )
    )

    d = (
        d.with_row(dashboard.Row("Clocks and throttling"))
        .with_panel(
            timeseries_panel(
                "Clocks",
                "Current clocks per domain (nvmlDeviceGetClockInfo).",
                [(f"nvgpu_clock_hertz{{{GPU}}}", GPU_LEGEND + " {{clock}}")],
                "hertz",
            )
        )
        .with_panel(
            timeseries_panel(
                "SM clock as a share of its maximum",
                "nvgpu_clock_hertz / nvgpu_clock_max_hertz for the SM "
                "clock: below 1 under load means a clock event reason (next panels) holds it down.",
                [(f'nvgpu_clock_hertz{{{GPU}, clock="sm"}} / nvgpu_clock_max_hertz{{{GPU}, clock="sm"}}', GPU_LEGEND)],
                "percentunit",
                max_val=1,
            )
        )
        .with_panel(
            timeseries_panel(
                "GPUs held down per clock event reason",
                "Count of GPUs whose clocks a clock event (throttle) reason held down at any time in the interval "
                "(rate() of nvgpu_clock_event_reason_seconds_total above 0: the driver's own time counters, so "
                "a short brake between two samples is not missed). sw_power_cap under load means the power limit "
                "is reached; *_thermal_* and hw_* need attention; total_base_clocks is any reason below base "
                "clocks." + QUIET,
                [
                    (
                        quiet_zero(
                            "count by (reason) "
                            f"(rate(nvgpu_clock_event_reason_seconds_total{{{GPU}}}[$__rate_interval]) > 0)",
                            f"sum(nvgpu_device_up{{{GPU}}})",
                            reason=NONE_TEXT,
                        ),
                        "{{reason}}",
                    )
                ],
                "none",
                stacked=True,
                bars=True,
                mappings=NONE,
            )
        )
        .with_panel(
            state_timeline_panel(
                "Throttle reasons per GPU",
                "One row per GPU and reason, coloured while the reason held the clocks down in the interval "
                "(from the time counters, so nothing aliases). The point-sample flags "
                "(nvgpu_clock_event_reason_active) need NVGPU_FEATURE_DETAILS=on; the next panel has the share "
                "of time.",
                [
                    (
                        f"rate(nvgpu_clock_event_reason_seconds_total{{{GPU}}}[$__rate_interval]) > bool 0",
                        GPU_LEGEND + " {{reason}}",
                    )
                ],
                _mapping({"0": ("", "transparent"), "1": ("held down", "orange")}),
                _thresholds((None, "transparent"), (1, "orange")),
            )
        )
        .with_panel(
            timeseries_panel(
                "Share of time per clock event reason",
                "rate() of nvgpu_clock_event_reason_seconds_total: the share of time the clocks were held down by "
                "each reason, from the driver's own time counters (exact whatever the sample interval). "
                "total_base_clocks is the time below base clocks for any reason; low_utilization, "
                "total_app_clocks, sync_boost, board_limit and reliability need NVGPU_FEATURE_DETAILS=on. "
                "Reasons overlap: do not add them.",
                [
                    (
                        f"rate(nvgpu_clock_event_reason_seconds_total{{{GPU}}}[$__rate_interval])",
                        GPU_LEGEND + " {{reason}}",
                    )
                ],
                "percentunit",
                w=24,
                max_val=1,
            )
        )
    )

    xid_table = xid_classified(f"max by ({GPU_BY}, xid) (nvgpu_xid_errors_total{{{GPU}}})")
    xid_last = xid_classified(f"max by ({GPU_BY}, xid) (nvgpu_xid_last_timestamp_seconds{{{GPU}}}) * 1000")
    d = (
        d.with_row(dashboard.Row("ECC, row remapping and Xid"))
        .with_panel(
            table_panel(
                "ECC error counters",
                "Per GPU and error type: since the driver loaded (nvgpu_ecc_volatile_errors_total; a GPU reset "
                "clears it; uncorrected > 0 is critical) and over the board's life (nvgpu_ecc_aggregate_errors_total, "
                "which includes the former: never add the two; read with NVGPU_FEATURE_DETAILS=on, else this "
                "column stays empty: nvidia-smi -q -d ECC on the node has it)." + QUIET,
                [
                    (f"max by ({GPU_BY}, error_type) (nvgpu_ecc_volatile_errors_total{{{GPU}}})", None),
                    (f"max by ({GPU_BY}, error_type) (nvgpu_ecc_aggregate_errors_total{{{GPU}}})", None),
                ],
                w=8,
                hide=("cluster",),
                rename={"Value #A": "since driver load", "Value #B": "lifetime"},
                thresholds=OK_RED,
                color_column="since driver load",
                mappings=NONE,
            )
        )
        .with_panel(
            timeseries_panel(
                "ECC errors (volatile counter increase)",
                "increase() of the volatile ECC counters (nvgpu_ecc_volatile_errors_total)." + QUIET,
                [
                    (
                        quiet_zero(
                            f"sum by ({GPU_BY}, error_type) "
                            f"(increase(nvgpu_ecc_volatile_errors_total{{{GPU}}}[$__rate_interval]))",
                            f"max by ({GPU_BY}) (nvgpu_device_up{{{GPU}}})",
                            error_type=NONE_TEXT,
                        ),
                        GPU_LEGEND + " {{error_type}}",
                    )
                ],
                "none",
                w=8,
                bars=True,
                mappings=NONE,
            )
        )
        .with_panel(
            timeseries_panel(
                "Row remapping and recovery action",
                "Remapped rows by cause, a pending remap (reset the GPU to apply), a failed remap (RMA) and the "
                "driver's recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset).",
                [
                    (f"nvgpu_remapped_rows{{{GPU}}}", GPU_LEGEND + " remapped {{cause}}"),
                    (f"nvgpu_remapped_rows_pending{{{GPU}}}", GPU_LEGEND + " pending"),
                    (f"nvgpu_remapped_rows_failure{{{GPU}}}", GPU_LEGEND + " failure"),
                    (f"nvgpu_recovery_action{{{GPU}}}", GPU_LEGEND + " recovery action"),
                ],
                "none",
                w=8,
            )
        )
        .with_panel(
            bargauge_panel(
                "Xid errors by class",
                "nvgpu_xid_errors_total summed by the class exporter/supervisor/xid/catalog.json gives "
                "each code (application, driver, memory, nvlink, ...), counted since each exporter started." + QUIET,
                [
                    (
                        quiet_zero(
                            f"sum by (class) ({xid_classified(f'nvgpu_xid_errors_total{{{GPU}}}')})",
                            f"sum(nvgpu_device_up{{{GPU}}})",
                            **{"class": NONE_TEXT},
                        ),
                        "{{class}}",
                    )
                ],
                "none",
                _thresholds((None, "orange")),
                w=8,
                mappings=NONE,
            )
        )
        .with_panel(
            table_panel(
                "Xid errors by GPU and code",
                "Per GPU and Xid code: count since the exporter started, the catalog "
                "class, and the time of the last one. Xid 43 on a GPU that also shows the stuck signature means "
                "the context was never cleaned up (docs/runbook.md). A GPU without Xids has one row, count none."
                + QUIET,
                [(quiet_zero(xid_table, f"max by ({GPU_BY}) (nvgpu_device_up{{{GPU}}})"), None), (xid_last, None)],
                w=16,
                hide=("cluster",),
                rename={"Value #A": "count", "Value #B": "last"},
                overrides=[("last", [dm.DynamicConfigValue(id_val="unit", value="dateTimeAsIso")])],
                mappings=NONE,
            )
        )
    )

    d = (
        d.with_row(dashboard.Row("Profiling (GPM)"))
        .with_panel(
            timeseries_panel(
                "SM activity and utilization",
                "GPM SM activity (nvgpu_gpm_sm_activity_ratio: the share of SMs busy over the last sample interval) "
                "next to GPU utilization (the share of time any kernel ran). A kernel on one SM reads 100 % "
                "utilization and about 1 % SM activity; a wedged GPU reads 100 % utilization and 0 SM activity. "
                "Hopper and newer; absent elsewhere.",
                [
                    (f"nvgpu_gpm_sm_activity_ratio{{{GPU}}}", GPU_LEGEND + " SM activity"),
                    (f"nvgpu_gpu_utilization_ratio{{{GPU}}}", GPU_LEGEND + " utilization"),
                ],
                "percentunit",
                max_val=1,
            )
        )
        .with_panel(
            timeseries_panel(
                "Tensor pipe activity",
                "nvgpu_gpm_tensor_activity_ratio: the share of the last sample interval the SMs' tensor pipes "
                "(any type) were active; dcgm-exporter's DCGM_FI_PROF_PIPE_TENSOR_ACTIVE.",
                [(f"nvgpu_gpm_tensor_activity_ratio{{{GPU}}}", GPU_LEGEND)],
                "percentunit",
                max_val=1,
            )
        )
        .with_panel(
            timeseries_panel(
                "SM occupancy",
                "nvgpu_gpm_sm_occupancy_ratio: resident warps as a share of the SMs' maximum.",
                [(f"nvgpu_gpm_sm_occupancy_ratio{{{GPU}}}", GPU_LEGEND)],
                "percentunit",
                w=8,
                max_val=1,
            )
        )
        .with_panel(
            timeseries_panel(
                "DRAM bandwidth used",
                "nvgpu_gpm_dram_bandwidth_ratio: DRAM bandwidth used as a share of the theoretical maximum.",
                [(f"nvgpu_gpm_dram_bandwidth_ratio{{{GPU}}}", GPU_LEGEND)],
                "percentunit",
                w=8,
                max_val=1,
            )
        )
        .with_panel(
            timeseries_panel(
                "Graphics engine activity",
                "nvgpu_gpm_graphics_activity_ratio: the share of time a graphics or compute engine was active.",
                [(f"nvgpu_gpm_graphics_activity_ratio{{{GPU}}}", GPU_LEGEND)],
                "percentunit",
                w=8,
                max_val=1,
            )
        )
        .with_panel(
            timeseries_panel(
                "Pipe activity",
                "nvgpu_gpm_pipe_activity_ratio by pipe, averaged over the selected GPUs: tensor pipes by type "
                "(hmma, imma, dmma, dfma) and non-tensor fp64/fp32/fp16. Feature gpm_pipes, off by default "
                "(NVGPU_FEATURE_GPM_PIPES=on): empty without it.",
                [(f"avg by (pipe) (nvgpu_gpm_pipe_activity_ratio{{{GPU}}})", "{{pipe}}")],
                "percentunit",
                w=8,
                max_val=1,
            )
        )
        .with_panel(
            timeseries_panel(
                "PCIe traffic (GPM)",
                "rate() of nvgpu_gpm_pcie_transmit_bytes_total / _receive_bytes_total: GPM's PCIe rates integrated "
                "over each sample interval by the exporter.",
                [
                    (f"rate(nvgpu_gpm_pcie_transmit_bytes_total{{{GPU}}}[$__rate_interval])", GPU_LEGEND + " tx"),
                    (f"rate(nvgpu_gpm_pcie_receive_bytes_total{{{GPU}}}[$__rate_interval])", GPU_LEGEND + " rx"),
                ],
                "Bps",
                w=16,
            )
        )
    )

    d = (
        d.with_row(dashboard.Row("Stuck-context signature"))
        .with_panel(
            state_timeline_panel(
                "Stuck-context signature",
                "nvgpu_stuck_context_suspected per GPU: busy (utilization at or above "
                "NVGPU_STUCK_UTILIZATION_RATIO), no compute processes and nothing running (no SM active by GPM, "
                "or no memory used without GPM) for NVGPU_STUCK_AFTER_SECONDS. The second incident in docs/design.md.",
                [(f"nvgpu_stuck_context_suspected{{{GPU}}}", GPU_LEGEND)],
                _mapping({"0": ("ok", "green"), "1": ("STUCK", "red")}),
                OK_RED,
            )
        )
        .with_panel(
            table_panel(
                "GPUs showing the stuck signature now",
                "Only GPUs whose signature holds now, and for how long.",
                [
                    (f"max by ({GPU_BY}) (nvgpu_stuck_context_suspected{{{GPU}}} == 1)", None),
                    (f"max by ({GPU_BY}) (time() - nvgpu_stuck_context_since_timestamp_seconds{{{GPU}}})", None),
                ],
                hide=("Value #A", "cluster"),
                rename={"Value #B": "for"},
                overrides=[("for", [dm.DynamicConfigValue(id_val="unit", value="s")])],
            )
        )
    )

    d = (
        d.with_row(dashboard.Row("NVLink"))
        .with_panel(
            timeseries_panel(
                "NVLink transmit",
                "rate() of nvgpu_nvlink_transmit_bytes_total: every link of the GPU (field counters). Where the "
                "nvlink_throughput feature is off (the known issue on H20 / driver 580), GPM's all-link counter "
                "(nvgpu_gpm_nvlink_transmit_bytes_total, Hopper and newer) instead.",
                [
                    (
                        f"sum by ({GPU_BY}) (rate(nvgpu_nvlink_transmit_bytes_total{{{GPU}}}[$__rate_interval]))"
                        f" or sum by ({GPU_BY}) "
                        f"(rate(nvgpu_gpm_nvlink_transmit_bytes_total{{{GPU}}}[$__rate_interval]))",
                        GPU_LEGEND,
                    )
                ],
                "Bps",
                w=8,
            )
        )
        .with_panel(
            timeseries_panel(
                "NVLink receive",
                "rate() of nvgpu_nvlink_receive_bytes_total (GPM's nvgpu_gpm_nvlink_receive_bytes_total where the "
                "nvlink_throughput feature is off).",
                [
                    (
                        f"sum by ({GPU_BY}) (rate(nvgpu_nvlink_receive_bytes_total{{{GPU}}}[$__rate_interval]))"
                        f" or sum by ({GPU_BY}) "
                        f"(rate(nvgpu_gpm_nvlink_receive_bytes_total{{{GPU}}}[$__rate_interval]))",
                        GPU_LEGEND,
                    )
                ],
                "Bps",
                w=8,
            )
        )
        .with_panel(
            timeseries_panel(
                "NVLink links up and errors",
                "Links up (nvgpu_nvlink_links_up) and the increase of the GPU's link error counters summed over "
                "its links (nvgpu_nvlink_errors_total: replay, recovery, flit CRC, data CRC). Data CRC counts grow "
                "slowly on healthy H200 links; replay and recovery do not.",
                [
                    (f"sum by ({GPU_BY}) (nvgpu_nvlink_links_up{{{GPU}}})", GPU_LEGEND + " links up"),
                    (
                        f"sum by ({GPU_BY}, error_type) "
                        f"(increase(nvgpu_nvlink_errors_total{{{GPU}}}[$__rate_interval]))",
                        GPU_LEGEND + " {{error_type}} errors",
                    ),
                ],
                "none",
                w=8,
            )
        )
        .with_panel(
            table_panel(
                "NVLink links with errors",
                "Per link: the error counters (since the driver loaded) of every link with replay, recovery or "
                "flit-CRC errors; a link stays listed for the exporter worker's life. With "
                "NVGPU_FEATURE_NVLINK_LINKS=on every link is listed (its bytes too: "
                "nvgpu_nvlink_link_transmit_bytes_total), else only those. nvgpu_nvlink_link_up: 0 = link down. A "
                "GPU with NVLink and no link with errors has one row, replay none." + QUIET,
                [
                    (
                        quiet_zero(
                            f'max by ({GPU_BY}, link) (nvgpu_nvlink_link_errors_total{{{GPU}, error_type="replay"}})',
                            f"max by ({GPU_BY}) (nvgpu_nvlink_links_up{{{GPU}}})",
                        ),
                        None,
                    ),
                    (
                        f'max by ({GPU_BY}, link) (nvgpu_nvlink_link_errors_total{{{GPU}, error_type="recovery"}})',
                        None,
                    ),
                    (
                        f'max by ({GPU_BY}, link) (nvgpu_nvlink_link_errors_total{{{GPU}, error_type="crc_flit"}})',
                        None,
                    ),
                    (
                        f'max by ({GPU_BY}, link) (nvgpu_nvlink_link_errors_total{{{GPU}, error_type="crc_data"}})',
                        None,
                    ),
                    (f"max by ({GPU_BY}, link) (nvgpu_nvlink_link_up{{{GPU}}})", None),
                ],
                w=24,
                h=6,
                hide=("cluster",),
                rename={
                    "Value #A": "replay",
                    "Value #B": "recovery",
                    "Value #C": "flit CRC",
                    "Value #D": "data CRC",
                    "Value #E": "up",
                },
                mappings=NONE,
            )
        )
        .with_panel(
            state_timeline_panel(
                "NVLink fabric registration",
                "nvgpu_fabric_state per GPU on systems with an NVLink fabric (NVSwitch boards; absent elsewhere): "
                "not started, in progress, completed. A GPU not completed for 5 minutes cannot start CUDA jobs "
                "(alert NvgpuFabricNotCompleted; check nvidia-fabricmanager).",
                [(f"nvgpu_fabric_state{{{GPU}}}", GPU_LEGEND)],
                _mapping({"1": ("not started", "red"), "2": ("in progress", "orange"), "3": ("completed", "green")}),
                _thresholds((None, "red"), (2, "orange"), (3, "green")),
                w=24,
                h=5,
            )
        )
    )

    d = d.with_row(dashboard.Row("Pods")).with_panel(
        table_panel(
            "Pods on each GPU",
            "nvgpu_gpu_pod_info from the kubelet PodResources API (feature pod_attribution): "
            "one row per container holding a GPU.",
            [(f"nvgpu_gpu_pod_info{{{GPU}}}", None)],
            w=24,
            h=7,
            hide=("Value",),
        )
    )
    d = _per_pod_usage(d)
    return to_json(d)


# MIG: instances under their GPU. Every MIG series carries the parent's gpu/uuid, so the GPU
# variable selects a GPU with its instances; legends and the table order put each instance after its GPU.
MIG_LEGEND = GPU_LEGEND + " / GI {{gpu_instance_id}} {{mig_profile}}"
GI_BY = GPU_BY + ", gpu_instance_id, mig_profile"


def _mig_instances(d: dashboard.Dashboard) -> dashboard.Dashboard:
    about = (
        "Only GPUs in MIG mode have these series (feature mig). Memory and GPM activity belong to the GPU "
        "instance (GI), shared by its compute instances; MIG devices (what pods get) are compute instances."
    )
    table = table_panel(
        "MIG devices",
        "One row per MIG device, under its GPU (gpu, uuid): GPU and compute instance ids, the GPU instance "
        "profile, the MIG device's UUID (what the kubelet hands out) and its compute processes "
        "(nvgpu_mig_instance_info, nvgpu_mig_compute_processes). " + about,
        [
            (f"nvgpu_mig_instance_info{{{GPU}}}", None),
            (f"nvgpu_mig_compute_processes{{{GPU}}}", None),
        ],
        w=24,
        h=7,
        hide=("Value #A",),
        rename={"Value #B": "processes", "gpu": "GPU index", "gpu_instance_id": "GI", "compute_instance_id": "CI"},
    ).with_transformation(
        dm.DataTransformerConfig(
            id_val="sortBy", options={"fields": {}, "sort": [{"field": "GPU index"}, {"field": "GI"}, {"field": "CI"}]}
        )
    )
    return (
        d.with_row(dashboard.Row("MIG instances"))
        .with_panel(
            stat_panel(
                "GPUs in MIG mode",
                "GPUs whose MIG mode is enabled now (nvgpu_mig_mode); a pending change waits for a GPU reset "
                "(alert NvgpuMigModeChangePending).",
                quiet_zero(f"count(nvgpu_mig_mode{{{GPU}}} == 1)", f"sum(nvgpu_device_up{{{GPU}}})"),
                "none",
                ALWAYS_BLUE,
                w=8,
            )
        )
        .with_panel(
            stat_panel(
                "MIG mode changes pending",
                "GPUs whose MIG mode changes at their next reset (nvgpu_mig_mode_pending != nvgpu_mig_mode). "
                "The reset fails while the exporter holds the GPU: docs/runbook.md, pause-label procedure." + QUIET,
                quiet_zero(
                    f"count(nvgpu_mig_mode_pending{{{GPU}}} != nvgpu_mig_mode{{{GPU}}})",
                    f"sum(nvgpu_device_up{{{GPU}}})",
                ),
                "none",
                OK_RED,
                w=8,
                mappings=NONE,
            )
        )
        .with_panel(
            stat_panel(
                "MIG devices in all",
                "MIG devices of the selected GPUs (nvgpu_mig_instance_info).",
                quiet_zero(f"count(nvgpu_mig_instance_info{{{GPU}}})", f"sum(nvgpu_device_up{{{GPU}}})"),
                "none",
                ALWAYS_BLUE,
                w=8,
            )
        )
        .with_panel(table)
        .with_panel(
            timeseries_panel(
                "MIG memory used per GPU instance",
                "Framebuffer used and total of each GPU instance (nvgpu_mig_memory_used_bytes, "
                "nvgpu_mig_memory_total_bytes). " + about,
                [
                    (f"sum by ({GI_BY}) (nvgpu_mig_memory_used_bytes{{{GPU}}})", MIG_LEGEND + " used"),
                    (f"sum by ({GI_BY}) (nvgpu_mig_memory_total_bytes{{{GPU}}})", MIG_LEGEND + " total"),
                ],
                "bytes",
            )
        )
        .with_panel(
            timeseries_panel(
                "MIG SM activity per GPU instance",
                "GPM SM activity (share of the GPU instance's SMs busy) and tensor activity over the last sample "
                "interval (nvgpu_mig_gpm_sm_activity_ratio, nvgpu_mig_gpm_tensor_activity_ratio; "
                "nvmlGpmMigSampleGet, Hopper and newer): what stands in for utilization on a MIG GPU. " + about,
                [
                    (f"sum by ({GI_BY}) (nvgpu_mig_gpm_sm_activity_ratio{{{GPU}}})", MIG_LEGEND + " SM"),
                    (f"sum by ({GI_BY}) (nvgpu_mig_gpm_tensor_activity_ratio{{{GPU}}})", MIG_LEGEND + " tensor"),
                ],
                "percentunit",
                max_val=1,
            )
        )
    )


# Fleet views: recording rules from deploy/prometheus/rules.yaml (group nvgpu-fleet), so a
# view over thousands of GPUs reads a few series per node or cluster instead of every GPU's.
CLUSTER = 'cluster=~"$cluster"'
RULES_NOTE = " Recording rules of deploy/prometheus/rules.yaml (group nvgpu-fleet): empty until they are loaded."


def _fleet(d: dashboard.Dashboard) -> dashboard.Dashboard:
    per_cluster = "{{cluster}}"
    return (
        d.with_row(dashboard.Row("Fleet"))
        .with_panel(
            stat_panel(
                "GPUs in the fleet",
                "GPUs the exporters of the selected clusters report (cluster:nvgpu_device_up:count)." + RULES_NOTE,
                f"sum(cluster:nvgpu_device_up:count{{{CLUSTER}}})",
                "none",
                ALWAYS_BLUE,
            )
        )
        .with_panel(
            stat_panel(
                "GPUs not up",
                "GPUs reported but not answering: lost, hung, crashed or not sampled "
                "(cluster:nvgpu_device_up:count - cluster:nvgpu_device_up:sum)." + RULES_NOTE + QUIET,
                f"sum(cluster:nvgpu_device_up:count{{{CLUSTER}}}) - sum(cluster:nvgpu_device_up:sum{{{CLUSTER}}})",
                "none",
                OK_RED,
                mappings=NONE,
            )
        )
        .with_panel(
            stat_panel(
                "GPUs busy with nothing on them",
                "GPUs showing the stuck-context signature (cluster:nvgpu_stuck_context_suspected:sum)."
                + RULES_NOTE
                + QUIET,
                f"sum(cluster:nvgpu_stuck_context_suspected:sum{{{CLUSTER}}})",
                "none",
                OK_RED,
                mappings=NONE,
            )
        )
        .with_panel(
            stat_panel(
                "Nodes without fresh GPU data",
                "Exporters whose nvgpu_up is 0 (cluster:nvgpu_up:count - cluster:nvgpu_up:sum)." + RULES_NOTE + QUIET,
                f"sum(cluster:nvgpu_up:count{{{CLUSTER}}}) - sum(cluster:nvgpu_up:sum{{{CLUSTER}}})",
                "none",
                OK_RED,
                mappings=NONE,
            )
        )
        .with_panel(
            stat_panel(
                "Fleet power draw",
                "Sum of the GPUs' power (cluster:nvgpu_power_usage_watts:sum)." + RULES_NOTE,
                f"sum(cluster:nvgpu_power_usage_watts:sum{{{CLUSTER}}})",
                "watt",
                ALWAYS_BLUE,
            )
        )
        .with_panel(
            stat_panel(
                "Fleet GPU memory used",
                "GPU memory used over total "
                "(cluster:nvgpu_memory_used_bytes:sum / cluster:nvgpu_memory_total_bytes:sum)." + RULES_NOTE,
                f"sum(cluster:nvgpu_memory_used_bytes:sum{{{CLUSTER}}})"
                f" / sum(cluster:nvgpu_memory_total_bytes:sum{{{CLUSTER}}})",
                "percentunit",
                ALWAYS_BLUE,
            )
        )
        .with_panel(
            timeseries_panel(
                "Utilization and SM activity by cluster",
                "Mean GPU utilization (share of time a kernel ran) and mean GPM SM activity (share of SMs busy) over "
                "each cluster's GPUs "
                "(cluster:nvgpu_gpu_utilization_ratio:avg, cluster:nvgpu_gpm_sm_activity_ratio:avg)." + RULES_NOTE,
                [
                    (f"cluster:nvgpu_gpu_utilization_ratio:avg{{{CLUSTER}}}", per_cluster + " utilization"),
                    (f"cluster:nvgpu_gpm_sm_activity_ratio:avg{{{CLUSTER}}}", per_cluster + " SM activity"),
                ],
                "percentunit",
                max_val=1,
            )
        )
        .with_panel(
            timeseries_panel(
                "Power and NVLink errors by cluster",
                "GPU power per cluster (cluster:nvgpu_power_usage_watts:sum, left) and NVLink errors in the last hour "
                "by type (cluster:nvgpu_nvlink_errors_total:increase1h). Data CRC grows slowly on healthy H200 links: "
                "compare it with its own past; replay and recovery should stay at 0." + RULES_NOTE,
                [
                    (f"cluster:nvgpu_power_usage_watts:sum{{{CLUSTER}}}", per_cluster + " W"),
                    (
                        f"cluster:nvgpu_nvlink_errors_total:increase1h{{{CLUSTER}}}",
                        per_cluster + " NVLink {{error_type}} / h",
                    ),
                ],
                "none",
            )
        )
        .with_panel(
            table_panel(
                "Nodes",
                "One row per exporter (node): GPUs, GPUs up, GPUs with the stuck signature, mean utilization, power "
                "and NVLink replay, recovery and flit-CRC errors in the last hour (instance:* rules)." + RULES_NOTE,
                [
                    (f"instance:nvgpu_device_up:count{{{FLEET}}}", None),
                    (f"instance:nvgpu_device_up:sum{{{FLEET}}}", None),
                    (f"instance:nvgpu_stuck_context_suspected:sum{{{FLEET}}}", None),
                    (f"instance:nvgpu_gpu_utilization_ratio:avg{{{FLEET}}}", None),
                    (f"instance:nvgpu_power_usage_watts:sum{{{FLEET}}}", None),
                    (
                        "sum without (error_type) "
                        f'(instance:nvgpu_nvlink_errors_total:increase1h{{{FLEET}, error_type!="crc_data"}})',
                        None,
                    ),
                ],
                w=24,
                h=8,
                rename={
                    "Value #A": "GPUs",
                    "Value #B": "up",
                    "Value #C": "stuck",
                    "Value #D": "utilization",
                    "Value #E": "power",
                    "Value #F": "NVLink errors / h",
                },
                overrides=[
                    ("utilization", [dm.DynamicConfigValue(id_val="unit", value="percentunit")]),
                    ("power", [dm.DynamicConfigValue(id_val="unit", value="watt")]),
                ],
            )
        )
    )


# Per-pod usage: who uses a shared GPU, from the processes' cgroups joined with the kubelet.
POD_BY = GPU_BY + ", namespace, pod"
POD_LEGEND = "{{namespace}}/{{pod}} on {{instance}} GPU {{gpu}}"


def _per_pod_usage(d: dashboard.Dashboard) -> dashboard.Dashboard:
    about = (
        "Summed over the pod's processes on each GPU: process -> pod through /proc/<pid>/cgroup (the exporter "
        "needs hostPID), names through the kubelet's /var/log/containers or the one pod holding the GPU. "
        "Empty namespace/pod: usage of pods that cannot be named. Time-sliced and MPS GPUs show one row per pod."
    )
    return (
        d.with_panel(
            table_panel(
                "Per-pod GPU usage",
                "GPU memory (nvgpu_pod_memory_used_bytes) and SM utilization (nvgpu_pod_sm_utilization_ratio) "
                "of each pod on each GPU, now. " + about,
                [
                    (f"sum by ({POD_BY}) (nvgpu_pod_memory_used_bytes{{{GPU}}})", None),
                    (f"sum by ({POD_BY}) (nvgpu_pod_sm_utilization_ratio{{{GPU}}})", None),
                ],
                w=24,
                h=8,
                hide=("cluster",),
                rename={"Value #A": "GPU memory", "Value #B": "SM utilization"},
                overrides=[
                    ("GPU memory", [dm.DynamicConfigValue(id_val="unit", value="bytes")]),
                    ("SM utilization", [dm.DynamicConfigValue(id_val="unit", value="percentunit")]),
                ],
            )
        )
        .with_panel(
            timeseries_panel(
                "Pod GPU memory",
                "nvgpu_pod_memory_used_bytes per pod and GPU. " + about,
                [(f"sum by ({POD_BY}) (nvgpu_pod_memory_used_bytes{{{GPU}}})", POD_LEGEND)],
                "bytes",
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                "Pod SM utilization",
                "nvgpu_pod_sm_utilization_ratio per pod and GPU: the sum of its processes' SM utilization "
                "(nvmlDeviceGetProcessUtilization); can exceed 1 when MPS runs kernels concurrently. " + about,
                [(f"sum by ({POD_BY}) (nvgpu_pod_sm_utilization_ratio{{{GPU}}})", POD_LEGEND)],
                "percentunit",
                stacked=True,
            )
        )
    )


# -- Exporter health --------------------------------------------------------------------------


def exporter_health() -> dict[str, Any]:
    by = "cluster, node, instance"
    d = (
        _base(
            HEALTH_UID,
            "nvgpu-exporter health",
            "Is the exporter itself healthy: targets, sample age, worker restarts and crashes, quarantined features, "
            "per-feature "
            "success and duration, self-check, versions in use. docs/metrics.md lists every metric.",
        )
        .link(_link("GPU fleet", FLEET_UID))
        .with_variable(datasource_variable())
        .with_variable(
            variable(
                "job",
                "Job",
                "label_values(nvgpu_up, job)",
                all_value=None,
                description="Scrape jobs that have nvgpu-exporter targets",
            )
        )
        .with_variable(variable("cluster", "Cluster", 'label_values(nvgpu_up{job=~"$job"}, cluster)'))
        .with_variable(variable("node", "Node", 'label_values(nvgpu_up{job=~"$job", cluster=~"$cluster"}, node)'))
        .with_variable(
            variable(
                "instance",
                "Instance",
                'label_values(nvgpu_up{job=~"$job", cluster=~"$cluster", node=~"$node"}, instance)',
            )
        )
    )

    d = (
        d.with_row(dashboard.Row("Targets and freshness"))
        .with_panel(
            stat_panel(
                "Targets answering", "Scrape targets answering (up == 1).", f"sum(up{{{HEALTH}}})", "none", ALWAYS_GREEN
            )
        )
        .with_panel(
            stat_panel(
                "Targets not answering",
                "Scrape targets not answering (up == 0).",
                f"sum(1 - up{{{HEALTH}}})",
                "none",
                OK_RED,
            )
        )
        .with_panel(
            stat_panel(
                "Exporters without fresh GPU data",
                "nvgpu_up == 0: NVML not initialised or the last sample is older "
                "than the stale bound (GPU series are dropped then)." + QUIET,
                f"sum(1 - nvgpu_up{{{HEALTH}}})",
                "none",
                OK_RED,
                mappings=NONE,
            )
        )
        .with_panel(
            stat_panel(
                "Oldest sample",
                "Largest nvgpu_last_sample_age_seconds over the selected exporters (the exporter's own age of "
                "its last sample: a node clock off from Prometheus's does not skew it).",
                f"max(nvgpu_last_sample_age_seconds{{{HEALTH}}})",
                "s",
                _thresholds((None, "green"), (30, "orange"), (120, "red")),
            )
        )
        .with_panel(
            stat_panel(
                "Quarantined features (count)",
                "Features switched off after repeated worker crashes in them "
                '(nvgpu_feature_enabled{reason="quarantined"}).' + QUIET,
                quiet_zero(
                    f'count(nvgpu_feature_enabled{{{HEALTH}, reason="quarantined"}})', f"sum(nvgpu_up{{{HEALTH}}})"
                ),
                "none",
                OK_RED,
                mappings=NONE,
            )
        )
        .with_panel(
            stat_panel(
                "Self-check failures",
                "Sum of nvgpu_selfcheck_failures (shadowed or mismatched modules)." + QUIET,
                f"sum(nvgpu_selfcheck_failures{{{HEALTH}}})",
                "none",
                OK_RED,
                mappings=NONE,
            )
        )
        .with_panel(
            timeseries_panel(
                "Targets up", "up per target.", [(f"up{{{HEALTH}}}", "{{instance}}")], "none", w=8, max_val=1
            )
        )
        .with_panel(
            timeseries_panel(
                "Sample age",
                "nvgpu_last_sample_age_seconds (the exporter's monotonic age of its last sample): grows when the "
                "worker is down or hung.",
                [(f"nvgpu_last_sample_age_seconds{{{HEALTH}}}", "{{instance}}")],
                "s",
                w=8,
            )
        )
        .with_panel(
            timeseries_panel(
                "Sample duration",
                "Wall time of the last NVML sample (nvgpu_sample_duration_seconds).",
                [(f"nvgpu_sample_duration_seconds{{{HEALTH}}}", "{{instance}}")],
                "s",
                w=8,
            )
        )
    )

    d = (
        d.with_row(dashboard.Row("Worker"))
        .with_panel(
            timeseries_panel(
                "Worker restarts by reason",
                "increase() of nvgpu_worker_restarts_total by reason: crash (signal), "
                "hang (missed its deadline), exit, NVML unusable." + QUIET,
                [
                    (
                        quiet_zero(
                            f"sum by (reason) (increase(nvgpu_worker_restarts_total{{{HEALTH}}}[$__rate_interval]))",
                            f"sum(nvgpu_up{{{HEALTH}}})",
                            reason=NONE_TEXT,
                        ),
                        "{{reason}}",
                    )
                ],
                "none",
                w=8,
                stacked=True,
                bars=True,
                mappings=NONE,
            )
        )
        .with_panel(
            bargauge_panel(
                "Worker crashes by feature",
                "nvgpu_worker_crashes_total since each exporter started: the feature and "
                "NVML function in flight when the worker crashed or hung." + QUIET,
                [
                    (
                        quiet_zero(
                            f"sum by (feature, function) (nvgpu_worker_crashes_total{{{HEALTH}}})",
                            f"sum(nvgpu_up{{{HEALTH}}})",
                            feature=NONE_TEXT,
                            function=NONE_TEXT,
                        ),
                        "{{feature}} / {{function}}",
                    )
                ],
                "none",
                _thresholds((None, "red")),
                w=8,
                mappings=NONE,
            )
        )
        .with_panel(
            table_panel(
                "Worker state",
                "Per exporter: worker uptime, stuck (uninterruptible sleep or respawning stopped), "
                "last exit signal and code.",
                [
                    (f"max by ({by}) (time() - nvgpu_worker_start_time_seconds{{{HEALTH}}})", None),
                    (f"max by ({by}) (nvgpu_worker_stuck{{{HEALTH}}})", None),
                    (f"max by ({by}) (nvgpu_worker_last_exit_signal{{{HEALTH}}})", None),
                    (f"max by ({by}) (nvgpu_worker_last_exit_code{{{HEALTH}}})", None),
                ],
                w=8,
                hide=("cluster",),
                rename={
                    "Value #A": "uptime",
                    "Value #B": "stuck",
                    "Value #C": "last signal",
                    "Value #D": "last exit code",
                },
                overrides=[("uptime", [dm.DynamicConfigValue(id_val="unit", value="s")])],
            )
        )
    )

    d = (
        d.with_row(dashboard.Row("Features"))
        .with_panel(
            table_panel(
                "Quarantined features",
                "Features the supervisor switched off after the worker crashed or hung in them "
                "NVGPU_QUARANTINE_AFTER times. docs/runbook.md: how to clear. An exporter without any has one "
                "row, feature none." + QUIET,
                [
                    (
                        quiet_zero(
                            f'nvgpu_feature_enabled{{{HEALTH}, reason="quarantined"}}',
                            f"max by ({by}) (nvgpu_up{{{HEALTH}}})",
                            feature=NONE_TEXT,
                        ),
                        None,
                    )
                ],
                w=8,
                hide=("Value", "cluster"),
            )
        )
        .with_panel(
            table_panel(
                "Feature states",
                "nvgpu_feature_enabled: on (1) or off (0), and why (default, env, known_issue, "
                "quarantined, unsupported).",
                [(f"nvgpu_feature_enabled{{{HEALTH}}}", None)],
                w=16,
                hide=("cluster",),
                rename={"Value": "enabled"},
            )
        )
        .with_panel(
            state_timeline_panel(
                "Feature success",
                "nvgpu_feature_success: the feature's last sample succeeded on every GPU.",
                [(f"min by (feature) (nvgpu_feature_success{{{HEALTH}}})", "{{feature}}")],
                _mapping({"0": ("failed", "red"), "1": ("ok", "green")}),
                _thresholds((None, "red"), (1, "green")),
            )
        )
        .with_panel(
            timeseries_panel(
                "Feature duration",
                "Time spent per feature in the last sample (max over exporters).",
                [(f"max by (feature) (nvgpu_feature_duration_seconds{{{HEALTH}}})", "{{feature}}")],
                "s",
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                "NVML errors by feature",
                "rate() of nvgpu_nvml_errors_total: transient or unexpected NVML errors that omitted a sample." + QUIET,
                [
                    (
                        quiet_zero(
                            f"sum by (feature, error) (rate(nvgpu_nvml_errors_total{{{HEALTH}}}[$__rate_interval]))",
                            f"sum(nvgpu_up{{{HEALTH}}})",
                            feature=NONE_TEXT,
                        ),
                        "{{feature}} {{error}}",
                    )
                ],
                "reqps",
                mappings=NONE,
            )
        )
        .with_panel(
            timeseries_panel(
                "NVML calls",
                "rate() of nvgpu_nvml_calls_total per exporter.",
                [(f"sum by ({by}) (rate(nvgpu_nvml_calls_total{{{HEALTH}}}[$__rate_interval]))", "{{instance}}")],
                "reqps",
            )
        )
    )

    d = (
        d.with_row(dashboard.Row("Self-check and versions"))
        .with_panel(
            table_panel(
                "Self-check results",
                "nvgpu_selfcheck_failures per exporter and process (supervisor, worker): "
                "0 = every imported module is the installed one. `nvgpu-exporter selfcheck` says which rule failed.",
                [(f"nvgpu_selfcheck_failures{{{HEALTH}}}", None)],
                w=8,
                hide=("cluster",),
                rename={"Value": "failures"},
                thresholds=OK_RED,
                color_column="failures",
            )
        )
        .with_panel(
            table_panel(
                "Versions in use",
                "nvgpu_build_info: how many exporters run each combination of exporter, "
                "nvidia-ml-py, NVML, driver and Python.",
                [
                    (
                        "count by (version, nvidia_ml_py_version, nvml_version, driver_version, python_version) "
                        f"(nvgpu_build_info{{{HEALTH}}})",
                        None,
                    )
                ],
                w=16,
                rename={"Value": "exporters"},
            )
        )
        .with_panel(
            table_panel(
                "Modules imported",
                "nvgpu_module_info: the file, __version__ and distribution each process really "
                "imported (the first incident: a stale copy in the working directory was imported).",
                [
                    (
                        "count by (process, module, version, distribution, distribution_version, path) "
                        f"(nvgpu_module_info{{{HEALTH}}})",
                        None,
                    )
                ],
                w=24,
                h=8,
                rename={"Value": "exporters"},
            )
        )
        .with_panel(
            timeseries_panel(
                "Process records dropped",
                "increase() of nvgpu_process_records_dropped_total by reason: process records NVML returned that "
                "cannot be true (pid 0, pid >= pid_max, memory above the GPU total, duplicates, sentinels). "
                "Anything but memory_not_available means the binding and the driver disagree on the process "
                "struct: the self-check and the exporter's log name the versions." + QUIET,
                [
                    (
                        quiet_zero(
                            f"sum by ({by}, reason) "
                            f"(increase(nvgpu_process_records_dropped_total{{{HEALTH}}}[$__rate_interval]))",
                            f"max by ({by}) (nvgpu_up{{{HEALTH}}})",
                            reason=NONE_TEXT,
                        ),
                        "{{instance}} {{reason}}",
                    )
                ],
                "none",
                bars=True,
                mappings=NONE,
            )
        )
        .with_panel(
            table_panel(
                "Process list API in use",
                "nvgpu_process_api_info: how many exporters read each process list with which NVML function, and "
                "why an older struct version (unsupported: the driver lacks the newer symbol; records_invalid: its "
                "records failed validation and the older struct read clean).",
                [(f"count by (list, function, fallback) (nvgpu_process_api_info{{{HEALTH}}})", None)],
                rename={"Value": "exporters"},
            )
        )
        .with_panel(
            timeseries_panel(
                "Kernel log and kubelet sources",
                "nvgpu_kernel_log_up (feature kernel_xid), nvgpu_pod_attribution_up (feature pod_attribution) and "
                "the sources of per-pod usage (nvgpu_pod_attribution_source_up: proc needs hostPID, container_logs "
                "the kubelet's /var/log/containers).",
                [
                    (f"nvgpu_kernel_log_up{{{HEALTH}}}", "{{instance}} kernel log"),
                    (f"nvgpu_pod_attribution_up{{{HEALTH}}}", "{{instance}} kubelet pod-resources"),
                    (f"nvgpu_pod_attribution_source_up{{{HEALTH}}}", "{{instance}} pod usage via {{source}}"),
                ],
                "none",
                w=24,
                h=6,
                max_val=1,
            )
        )
    )
    return to_json(d)


DASHBOARDS: dict[str, Callable[[], dict[str, Any]]] = {
    "gpu-fleet.json": gpu_fleet,
    "exporter-health.json": exporter_health,
}


def render(build: Callable[[], dict[str, Any]]) -> str:
    """The file text for one dashboard: stable key order, two-space indent, final newline."""
    return json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write to (default: dashboards/)")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path = args.out / name
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run `python dashboards/generate.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
