"""The runbook's words for an incident record: commands, handling, recovery checks (docs/runbook.md).

Data and small builders for :mod:`exporter.supervisor.incident`: the read-only diagnostic commands
of the two incidents of docs/design.md with a GPU's index and PCI bus id filled in, the evidence
steps of the fault atlas in their order, the temporary handling of each verdict, the recovery
check. ``nvgpu-exporter diagnose`` runs the commands of :func:`gpu_commands` and
:func:`node_commands` (every one of them only reads).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

QUERY_GPU = (
    "index,uuid,pci.bus_id,name,serial,vbios_version,inforom.img,driver_version,pstate,utilization.gpu,"
    "memory.used,memory.total,temperature.gpu,power.draw,ecc.errors.uncorrected.volatile.total"
)
QUERY_REMAPPED = (
    "gpu_bus_id,gpu_uuid,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,"
    "remapped_rows.failure"
)
QUERY_APPS = "gpu_uuid,pid,process_name,used_memory"
KERNEL_GREP = "grep -iE 'nvrm|xid'"
STEPS = (
    "pod, job and node identity, and the time",
    "Kubernetes events and scheduling",
    "kubelet, container runtime, device plugin",
    "DCGM, nvidia-smi, kernel log",
    "NIC, RDMA, NCCL, switches, NVLink fabric",
    "decide: isolate, reset, restart or repair",
)
REPRODUCTION = (
    "not known to the exporter: write down the job, input, load and recent upgrades under which it happens, "
    "or 'not reproduced'"
)
HANDLING: Mapping[str, str] = {
    "ok": "nothing to do",
    "unknown": "no fresh reading: follow NvgpuExporterNotUp / NvgpuNvmlInitFailing in docs/runbook.md; do not "
    "drain for it",
    "watch": "keep scheduling; record the Xid with its PID, pod and the job's traceback; the verdict escalates by "
    "itself",
    "stop_scheduling": "stop scheduling onto the GPU ({cordon}); let running jobs finish or checkpoint; read the "
    "evidence before deciding",
    "reset_gpu": "drain the GPU's jobs ({cordon}), pause the exporter on the node (label nvgpu-exporter/paused=true) "
    "and every other NVML client, then nvidia-smi -r -i {bus}; reboot the node if the reset is refused",
    "reboot_node": "drain the node (kubectl drain {node} --ignore-daemonsets --delete-emptydir-data) under change "
    "control, reboot it, check again before returning traffic",
    "fix_exporter": "fix the exporter's pod (device nodes, the NVIDIA runtime, the image's library): the GPU may be "
    "healthy; do not drain the node for it",
}


def _q(text: str) -> str:
    return shlex.quote(text) if text else "<bus id>"


def gpu_commands(index: str, bus_id: str, boot_id: str = "") -> list[dict[str, Any]]:
    """The read-only commands to run next for one GPU, each ``{"name", "argv", "shell", "why"}``
    (``argv`` runs as is; ``shell`` is the line to paste, filters included).

    The GPU is selected by its PCI bus id (``nvidia-smi -i`` and ``pmon -i`` take an index, a UUID or
    a PCI bus id): the NVML index is the container's enumeration, which on the host or under another
    NVIDIA_VISIBLE_DEVICES can name a different GPU. The index is only a label in ``why``; it
    selects only where no bus id is known.
    """
    sel = bus_id or index or "<bus id>"
    gpu = f"GPU {index or '<index>'}, {bus_id or '<bus id>'}"
    out = [
        _cmd("nvidia-smi-q", ["nvidia-smi", "-q", "-i", sel], f"everything NVML knows of {gpu}"),
        _cmd("query-gpu", ["nvidia-smi", f"--query-gpu={QUERY_GPU}", "--format=csv", "-i", sel], f"{gpu} in one line"),
        _cmd(
            "query-remapped-rows",
            ["nvidia-smi", f"--query-remapped-rows={QUERY_REMAPPED}", "--format=csv"],
            "remapped rows pending or failed",
        ),
        _cmd(
            "query-compute-apps",
            ["nvidia-smi", f"--query-compute-apps={QUERY_APPS}", "--format=csv"],
            "who has a context on which GPU",
        ),
        _cmd(
            "pmon",
            ["nvidia-smi", "pmon", "-c", "5", "-i", sel],
            f"per-process SM and memory use on {gpu}, five samples",
        ),
    ]
    return [*out, *kernel_commands(boot_id)]


def node_commands(boot_id: str = "") -> list[dict[str, Any]]:
    """The read-only commands to run next for the node."""
    return [
        _cmd("nvidia-smi", ["nvidia-smi"], "every GPU at a glance"),
        _cmd("nvidia-smi-q", ["nvidia-smi", "-q"], "everything NVML knows of every GPU"),
        _cmd("query-gpu", ["nvidia-smi", f"--query-gpu={QUERY_GPU}", "--format=csv"], "every GPU in one line each"),
        _cmd(
            "query-remapped-rows",
            ["nvidia-smi", f"--query-remapped-rows={QUERY_REMAPPED}", "--format=csv"],
            "remapped rows pending or failed",
        ),
        _cmd(
            "query-compute-apps",
            ["nvidia-smi", f"--query-compute-apps={QUERY_APPS}", "--format=csv"],
            "who has a context on which GPU",
        ),
        _cmd("pmon", ["nvidia-smi", "pmon", "-c", "5"], "per-process SM and memory use, five samples"),
        _cmd("nvlink-status", ["nvidia-smi", "nvlink", "-s"], "NVLink state per link"),
        _cmd("topology", ["nvidia-smi", "topo", "-m"], "how the GPUs, NICs and CPUs connect"),
        *kernel_commands(boot_id),
    ]


def kernel_commands(boot_id: str = "") -> list[dict[str, Any]]:
    """The kernel log's NVIDIA lines since boot: journalctl's, or dmesg's where there is no journal."""
    return [
        _cmd(
            "kernel-log-journalctl",
            ["journalctl", "-k", "-b", "0", "--no-pager", "-o", "short-iso"],
            f"the kernel log of this boot{f' ({boot_id})' if boot_id else ''}, NVIDIA lines",
            grep=KERNEL_GREP,
        ),
        _cmd("kernel-log-dmesg", ["dmesg", "-T"], "the kernel ring buffer, NVIDIA lines", grep=KERNEL_GREP),
    ]


def _cmd(name: str, argv: list[str], why: str, grep: str = "") -> dict[str, Any]:
    shell = " ".join(shlex.quote(a) for a in argv) + (f" | {grep}" if grep else "")
    return {"name": name, "argv": argv, "shell": shell, "why": why, "filter": "nvidia" if grep else ""}


def step_commands(index: str, bus_id: str, node: str, pods: Sequence[Mapping[str, Any]]) -> dict[int, list[str]]:
    """For each evidence step, what to run where the exporter cannot see (filled in)."""
    n = shlex.quote(node) if node else "<node>"
    described = [
        f"kubectl describe pod -n {shlex.quote(str(p['namespace']))} {shlex.quote(str(p['pod']))}" for p in pods
    ]
    where = f" -i {_q(bus_id)}" if bus_id else ""
    return {
        1: [f"kubectl get pods -A -o wide --field-selector spec.nodeName={n}"],
        2: ["kubectl get events -A --sort-by=.lastTimestamp", f"kubectl describe node {n}", *described],
        3: [
            "journalctl -u kubelet --since -2h",
            "journalctl -u containerd --since -2h",
            "the NVIDIA device plugin's log",
        ],
        4: [
            f"nvidia-smi -q{where}",
            f"journalctl -k -b 0 | {KERNEL_GREP}",
            "dcgmi health -g <group> -c (where DCGM runs)",
        ],
        5: [
            f"nvidia-smi nvlink -s{where}",
            "nvidia-smi topo -m",
            "ibstat",
            "systemctl status nvidia-fabricmanager",
            "the job's NCCL log (NCCL_DEBUG=INFO)",
        ],
        6: [],
    }


def evidence_steps(found: Mapping[int, list[str]], commands: Mapping[int, list[str]]) -> list[dict[str, Any]]:
    """The atlas's evidence order: each step with what the exporter found and what to run next."""
    out = []
    for n, name in enumerate(STEPS, start=1):
        seen = found.get(n, [])
        out.append(
            {
                "step": n,
                "name": name,
                "found": seen,
                "not_seen_by_the_exporter": not seen and n in (2, 3, 5),
                "next": commands.get(n, []),
            }
        )
    return out


def handling(verdict: str, index: str, bus_id: str, node: str) -> str:
    """The temporary handling of a verdict, with this GPU and node filled in."""
    cordon = f"kubectl cordon {node}" if node else "kubectl cordon <node>"
    cordon += " or take GPU " + (index or "<index>") + " out of the device plugin's pool"
    text = HANDLING.get(verdict, HANDLING["unknown"])
    return text.format(cordon=cordon, bus=bus_id or "<bus id>", node=node or "<node>")


def recovery_steps(index: str, bus_id: str) -> list[str]:
    """The runbook's recovery check, with this GPU filled in."""
    bus = bus_id or index or "<bus id>"  # the bus id selects (the index is the container's enumeration)
    return [
        "the verdict is ok again and the signature gone (the exporter checks: recovery_check.watch)",
        f"nvidia-smi -q -i {bus}: no remapped rows pending, volatile uncorrectable ECC 0, utilization 0 with no "
        "processes",
        f"nvidia-smi pmon -c 5 -i {bus}: no process left; journalctl -k -b 0 | {KERNEL_GREP}: no new Xid since the "
        "reset",
        "a short, small job pinned to the GPU finishes and the GPU goes back to idle",
        "one real job alone on the node; uncordon only after it passed",
    ]


def conclusion(domain: str, cause: str) -> str:
    """The exporter's provisional conclusion (the operator writes the repair conclusion)."""
    if cause in ("none", ""):
        return "nothing against the GPU now"
    return f"provisional, from the exporter's evidence: domain {domain} ({cause}); confirm or correct it"


def recurrence(cause: str, window_s: float) -> str:
    """The recurrence threshold of the record."""
    return (
        f"{cause} again, or any Xid on the GPU, within {window_s:g} s after it came back "
        "(NVGPU_RECURRENCE_WINDOW_SECONDS) is recorded as recurred; a reset_gpu fault that recurs asks for "
        "reboot_node; a second occurrence on this GPU after a reboot is a repair case"
    )
