"""The Pod Security Standards' "baseline" and "restricted" rules, checked on a rendered pod template.

Written from the Kubernetes documentation, "Pod Security Standards" (kubernetes.io/docs/concepts/
security/pod-security-standards/, the policy of the `latest` version): each rule below is one row
of its tables, with the fields that row names. What the admission controller would say about a pod
made from the template, without a cluster. Used by tests/test_helm.py and
tests/test_kustomize_components.py.
"""

from __future__ import annotations

from typing import Any

# Baseline, "Capabilities": the only ones that may be added.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
        "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
# Baseline, "Sysctls": the safe set.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)  # fmt: skip
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
# Restricted, "Volume Types": the only ones allowed.
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
LEVELS = ("baseline", "restricted")


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for key in ("initContainers", "containers", "ephemeralContainers") for c in pod.get(key) or []]


def _baseline(pod: dict[str, Any], annotations: dict[str, str]) -> list[str]:
    out: list[str] = []
    psc = pod.get("securityContext") or {}
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("pod: windowsOptions.hostProcess")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            out.append(f"pod: {field}")
    for volume in pod.get("volumes") or []:
        if "hostPath" in volume:
            out.append(f"volume {volume['name']}: hostPath {volume['hostPath'].get('path')}")
    for sysctl in psc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"pod: sysctl {sysctl.get('name')}")
    contexts = [("pod", psc)]
    for c in _containers(pod):
        where = f"container {c.get('name')}"
        sc = c.get("securityContext") or {}
        contexts.append((where, sc))
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{where}: windowsOptions.hostProcess")
        if sc.get("privileged"):
            out.append(f"{where}: privileged")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            out.append(f"{where}: capabilities.add {sorted(added - BASELINE_CAPABILITIES)}")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"{where}: hostPort {port['hostPort']}")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{where}: procMount {sc['procMount']}")
    for where, sc in contexts:
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            out.append(f"{where}: appArmorProfile Unconfined")
        se = sc.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            out.append(f"{where}: seLinuxOptions {se}")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"{where}: seccompProfile Unconfined")
    for key, value in annotations.items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and value == "unconfined":
            out.append(f"annotation {key}: unconfined")
    return out


def _restricted(pod: dict[str, Any]) -> list[str]:
    out: list[str] = []
    psc = pod.get("securityContext") or {}
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {volume['name']}: type {sorted(kinds - RESTRICTED_VOLUMES)}")
    if psc.get("runAsUser") == 0:
        out.append("pod: runAsUser 0")
    for c in _containers(pod):
        where = f"container {c.get('name')}"
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: allowPrivilegeEscalation not false")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{where}: runAsNonRoot not true")
        if sc.get("runAsUser") == 0:
            out.append(f"{where}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccompProfile {seccomp!r}, not RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{where}: capabilities.drop lacks ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{where}: capabilities.add beyond NET_BIND_SERVICE")
    return out


def violations(template: dict[str, Any], level: str = "restricted") -> list[str]:
    """What the Pod Security ``level`` forbids in a pod template.

    Args:
        template: a pod template (``{"metadata": ..., "spec": ...}``, e.g. a DaemonSet's
            ``spec.template``) or a Pod.
        level: ``baseline`` or ``restricted`` (which includes baseline).

    Returns:
        One line per violation, naming the field; empty when the pod is admitted.

    Raises:
        ValueError: an unknown level.
    """
    if level not in LEVELS:
        raise ValueError(f"level {level!r}: expected one of {', '.join(LEVELS)}")
    pod = template.get("spec") or {}
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    found = _baseline(pod, annotations)
    if level == "restricted":
        found += _restricted(pod)
    return found
