"""The fault table: every cause the exporter can classify, its domain, the verdict it asks for, who acts.

Data, not logic (the classification that finds the causes is :mod:`exporter.supervisor.classify`,
the engine that derives one verdict per GPU :mod:`exporter.supervisor.verdicts`). docs/design.md,
"Fault domains and verdicts", mirrors :data:`CAUSES` row for row; tests/test_verdicts.py checks both
ways.

- domains (:data:`DOMAINS`): ``exporter`` (the exporter's own pod: NVML library missing or not the
  host's, device node or cgroup access denied, device access lost), ``driver`` (kernel module and
  userspace library disagree because the host changed, driver not loaded, NVML crashing in one GPU's
  calls), ``gpu`` (lost, hung, fell off the bus, ECC, row remapping, NVIDIA's recovery action, a
  stuck context, repeated application Xids), ``link`` (NVLink, PCIe, fabric), ``node`` (every GPU
  lost at once, power), ``application`` (one job's own fault);
- verdicts (:data:`VERDICTS`): ``ok``; ``watch`` (record, keep scheduling); ``stop_scheduling``
  (a GPU-level anomaly: no new work on this GPU); ``reset_gpu`` (drain the GPU, reset it);
  ``reboot_node`` (drain the node, reboot it: only where the evidence supports it: the GPU fell off
  the bus or stays lost, NVIDIA's recovery action or Xid resolution says so, a reset did not cure
  it, the host driver changed under the loaded module); ``fix_exporter`` (the exporter's pod is
  wrong: fix it, the GPU may well be healthy); ``unknown`` (no fresh evidence).
"""

from __future__ import annotations

from dataclasses import dataclass

VERDICTS = ("ok", "unknown", "watch", "stop_scheduling", "reset_gpu", "reboot_node", "fix_exporter")
"""Every verdict, in the order of :data:`RANK` (``fix_exporter`` and ``unknown`` stand apart)."""
RANK = {"ok": 0, "unknown": 0, "watch": 1, "stop_scheduling": 2, "reset_gpu": 3, "reboot_node": 4, "fix_exporter": 2}
"""How much a verdict asks; ``fix_exporter`` ranks with ``stop_scheduling`` for node-level consumers."""
DOMAINS = ("exporter", "driver", "gpu", "link", "node", "application", "none")

APPLICATION_WINDOW_S = 1800.0  # application Xids: repeats and distinct processes in 30 minutes
REPEAT_SLOT_S = 300.0  # a burst of one faulting kernel (13, 31, 43 within seconds) is one slot
REPEAT_SLOTS = 3  # application Xids in 3 distinct 5-minute slots: repeated
XID_WINDOW_S = 3600.0  # other Xids count for an hour after the last one
LOST_HOLD_S = 60.0  # lost this long (without Xid 79): it stays lost, reboot
STUCK_XID43_BEFORE_S = 600.0  # Xid 43 at most this long before the stuck signature began
BUSY_EMPTY_HOLD_S = 600.0  # the stuck signature without Xid 43 this long: stop scheduling
FABRIC_HOLD_S = 300.0  # fabric registration not completed this long (it takes up to a minute at boot)
RECUR_WINDOW_S = 3600.0  # a reset_gpu fault back within this after it cleared: the reset did not cure it


@dataclass(frozen=True)
class Cause:
    """One row of the fault table: a cause, its domain, the verdict it asks for, who acts."""

    domain: str
    verdict: str
    owner: str
    action: str


# The fault table (docs/design.md mirrors it; tests/test_verdicts.py checks both ways).
CAUSES: dict[str, Cause] = {
    # exporter: the exporter's own pod
    "device_access_denied": Cause(
        "exporter",
        "fix_exporter",
        "exporter deployment",
        "give the exporter's pod the GPU's device node (NVIDIA_VISIBLE_DEVICES=all / the CDI spec, or the device "
        "cgroup); the GPU itself is not at fault",
    ),
    "device_access_lost": Cause(
        "exporter",
        "fix_exporter",
        "exporter deployment",
        "restart the exporter's pod (liveness does after NVGPU_UNHEALTHY_AFTER_SECONDS): its device cgroup was "
        "reset (a host systemctl daemon-reload with the systemd cgroup driver)",
    ),
    "nvml_library_not_hosts": Cause(
        "exporter",
        "fix_exporter",
        "exporter image",
        "fix the image: remove the bundled libnvidia-ml.so and run with the host's (NVIDIA container toolkit)",
    ),
    "nvml_library_missing": Cause(
        "exporter",
        "fix_exporter",
        "exporter deployment",
        "mount the host driver's libnvidia-ml.so into the pod (runtimeClassName nvidia, or a hostPath)",
    ),
    # driver
    "driver_library_mismatch": Cause(
        "driver",
        "reboot_node",
        "node administrator",
        "the host driver was upgraded under a loaded kernel module: drain the node, reload the NVIDIA driver or "
        "reboot; restarting the exporter does not help",
    ),
    "driver_not_loaded": Cause(
        "driver", "stop_scheduling", "node administrator", "load the NVIDIA kernel module (or the driver container)"
    ),
    "nvml_crashes_on_gpu": Cause(
        "driver",
        "watch",
        "exporter maintainers / NVIDIA",
        "NVML crashes in calls on this GPU; the exporter samples around it; report the call with the driver version",
    ),
    "driver_xid": Cause("driver", "watch", "node administrator", "read the kernel log around the Xid"),
    # gpu
    "gpu_lost": Cause(
        "gpu",
        "reboot_node",
        "node administrator",
        "the GPU stays lost: drain the node and reboot it; if it recurs, the GPU or its slot is a repair case",
    ),
    "fell_off_bus": Cause(
        "gpu",
        "reboot_node",
        "node administrator",
        "the GPU fell off the bus (Xid 79, NVIDIA: RESTART_BM): drain the node and reboot it; recurring, repair",
    ),
    "reset_required": Cause("gpu", "reset_gpu", "node administrator", "drain the GPU and reset it (nvidia-smi -r)"),
    "inforom_corrupted": Cause("gpu", "stop_scheduling", "hardware vendor", "the GPU's InfoROM is corrupt: repair"),
    "nvml_call_hung": Cause(
        "gpu",
        "reset_gpu",
        "node administrator",
        "the driver or GSP does not answer for this GPU (look for Xid 119/120): drain it and reset it; if the reset "
        "is refused or it hangs again, reboot the node",
    ),
    "ecc_uncorrectable": Cause(
        "gpu",
        "reset_gpu",
        "node administrator",
        "uncorrectable ECC errors since the driver loaded: drain the GPU, reset it, check remapped rows",
    ),
    "row_remap_pending": Cause(
        "gpu", "reset_gpu", "node administrator", "a row remap takes effect at the next reset: drain and reset the GPU"
    ),
    "row_remap_failed": Cause("gpu", "stop_scheduling", "hardware vendor", "row remapping failed: repair the GPU"),
    "recovery_action": Cause("gpu", "reset_gpu", "node administrator", "do what NVIDIA's recovery action says"),
    "stuck_context": Cause(
        "gpu",
        "reset_gpu",
        "node administrator",
        "Xid 43 and the GPU busy with nothing on it: the context is stuck: drain the GPU, reset it; reboot if the "
        "reset is refused",
    ),
    "busy_and_empty": Cause(
        "gpu", "stop_scheduling", "node administrator", "busy with nothing running for 10 minutes: check it"
    ),
    "application_xids_repeated": Cause(
        "gpu",
        "stop_scheduling",
        "node administrator",
        "application Xids keep recurring on this GPU: stop scheduling onto it, find out whether every job fails here",
    ),
    "application_xids_several_processes": Cause(
        "gpu",
        "stop_scheduling",
        "node administrator",
        "several different processes hit application Xids on this GPU: a GPU-level anomaly, stop scheduling onto it",
    ),
    "gpu_xid": Cause("gpu", "watch", "node administrator", "the Xid's catalog entry and NVIDIA resolution decide"),
    # link
    "fabric_not_registered": Cause(
        "link",
        "stop_scheduling",
        "node administrator",
        "the GPU is not registered with the NVLink fabric: CUDA jobs fail to start; check nvidia-fabricmanager",
    ),
    "link_xid": Cause("link", "stop_scheduling", "node administrator", "NVLink or PCIe errors: check the links"),
    # node
    "all_gpus_lost": Cause(
        "node",
        "reboot_node",
        "node administrator",
        "every GPU of the node is lost at once: PCIe, power or the driver, not one GPU: drain and reboot the node",
    ),
    "insufficient_power": Cause(
        "node", "stop_scheduling", "node administrator", "the GPU lacks power (cables, PSU): check the node's power"
    ),
    # application
    "application_xid": Cause(
        "application", "watch", "job owner", "one job's fault: record it with its process and pod, let the job restart"
    ),
    # no evidence
    "no_fresh_sample": Cause("none", "unknown", "", "the exporter has no fresh reading of this GPU"),
    "none": Cause("none", "ok", "", ""),
}

# NVIDIA's immediate resolution bucket (the Xid catalog's nvidia_action) -> the verdict it asks for.
NVIDIA_ACTIONS = {
    "IGNORE": "",
    "RESTART_APP": "watch",
    "CHECK_UVM": "watch",
    "UPDATE_SWFW": "watch",
    "RESET_GPU": "reset_gpu",
    "WORKFLOW_XID_48": "reset_gpu",
    "RESTART_BM": "reboot_node",
    "RESTART_VM": "reboot_node",
    "CONTACT_SUPPORT": "stop_scheduling",
    "CHECK_MECHANICALS": "stop_scheduling",
    "WORKFLOW_NVLINK_ERR": "stop_scheduling",
    "WORKFLOW_NVLINK5_ERR": "stop_scheduling",
    "WORKFLOW_XID_45": "watch",
    "XID_154": "",  # the recovery action field says what to do (recovery_action below)
}
SEVERITY_VERDICT = {"critical": "stop_scheduling", "warning": "watch", "info": ""}
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (nvml.h nvmlDeviceGpuRecoveryAction_t, 570+; 6 and 7 from 615).
RECOVERY_ACTIONS = {
    1: ("gpu_reset", "reset_gpu", "gpu"),
    2: ("node_reboot", "reboot_node", "gpu"),
    3: ("drain_p2p", "stop_scheduling", "link"),
    4: ("drain_and_reset", "reset_gpu", "gpu"),
    5: ("recover_imex_domain", "stop_scheduling", "link"),
    6: ("bus_reset", "reset_gpu", "link"),
    7: ("system_reboot", "reboot_node", "gpu"),
}
CLASS_DOMAIN = {"application": "application", "driver": "driver", "nvlink": "link", "bus": "link"}
LOST_ERRORS = {"RESET_REQUIRED": "reset_required", "CORRUPTED_INFOROM": "inforom_corrupted"}


@dataclass(frozen=True)
class Fault:
    """One classified fault on one GPU (or the node).

    Attributes:
        cause: a key of :data:`CAUSES`.
        domain: its fault domain (usually the cause's; an Xid's follows its catalog class).
        verdict: what this fault alone asks for.
        evidence: the facts, each with its source (NVML code, Xid and time, field value).
        action: what to do, concretely (which device node, which library path …).
        owner: who acts.
    """

    cause: str
    domain: str
    verdict: str
    evidence: tuple[str, ...]
    action: str
    owner: str


def fault(cause: str, *evidence: str, verdict: str = "", domain: str = "", action: str = "") -> Fault:
    """A :class:`Fault` of a cause of :data:`CAUSES`, with its table row's defaults."""
    row = CAUSES[cause]
    return Fault(cause, domain or row.domain, verdict or row.verdict, tuple(evidence), action or row.action, row.owner)
