"""deploy/kubernetes/components: any order renders the same, and components/restricted.

- Order: every set of components that can go together renders the same objects listed forwards
  and backwards (reversing flips the order of every pair at once). The case that used to go wrong:
  web-tls listed before servicemonitor rendered a plain-HTTP ServiceMonitor against an HTTPS
  exporter.
- Combinations that cannot work (restricted with uid 0 or hostPID) fail the render in both orders.
- restricted: the rendered pods pass the Pod Security "restricted" rules (tests/pod_security.py),
  the namespace enforces it, and the pod still validates and configures.
"""

from __future__ import annotations

import copy
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from k8s_render import (
    _KV_VERSIONS,
    CANARY,
    COMPONENTS,
    OPERATOR_GROUP,
    _kustomize_cmd,
    _need,
    _validate_operator_object,
)
from pod_security import violations

yaml = pytest.importorskip("yaml")

# Sets of components that go together (ServiceMonitor and PodMonitor are alternatives;
# restricted excludes pod-attribution-root and process-attribution).
COMPATIBLE = {
    "servicemonitor-set": (
        "web-tls", "servicemonitor", "restricted", "networkpolicy", "dcgm-compat", "prometheusrule",
        "runtime-class-nvidia",
    ),
    "podmonitor-set": (
        "web-tls", "podmonitor", "pod-attribution-root", "process-attribution", "runtime-class-nvidia",
        "dra-resourceslices",
    ),
}  # fmt: skip
CONFLICTS = [("restricted", "pod-attribution-root"), ("restricted", "process-attribution")]


def _render(*components: str, base: Path = CANARY) -> subprocess.CompletedProcess[str]:
    """kustomize on a throw-away overlay of base + components, in this order."""
    cmd = _kustomize_cmd()
    if not cmd:
        _need("kustomize", "install kubectl or kustomize")
    with tempfile.TemporaryDirectory() as tmp:
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(base, tmp)],
            "components": [os.path.relpath(COMPONENTS / c, tmp) for c in components],
        }
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return subprocess.run([*cmd, tmp], capture_output=True, text=True, timeout=120, check=False)


_CACHE: dict[tuple[str, ...], list[dict[str, Any]]] = {}


def rendered(*components: str) -> list[dict[str, Any]]:
    if components not in _CACHE:
        proc = _render(*components)
        assert proc.returncode == 0, proc.stderr
        _CACHE[components] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return _CACHE[components]


def _by_id(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def _unordered(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Objects by kind/name, with the pod's volumes, mounts and env sorted: components that each
    append one put them in their order, which Kubernetes does not read (no env entry here
    refers to another with $(NAME))."""
    out = _by_id(copy.deepcopy(docs))
    for doc in out.values():
        if doc["kind"] != "DaemonSet":
            continue
        pod = doc["spec"]["template"]["spec"]
        pod["volumes"].sort(key=lambda v: v["name"])
        for c in pod["containers"]:
            assert not any("$(" in str(e.get("value", "")) for e in c["env"])
            c["env"].sort(key=lambda e: e["name"])
            c["volumeMounts"].sort(key=lambda m: m["mountPath"])
    return out


def _monitor_endpoint(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (monitor,) = [d for d in docs if d["kind"] == kind]
    key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
    (endpoint,) = monitor["spec"][key]
    return dict(endpoint)


# -- order ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(COMPATIBLE))
def test_component_order_does_not_change_the_render(name: str) -> None:
    forwards = COMPATIBLE[name]
    assert _unordered(rendered(*forwards)) == _unordered(rendered(*reversed(forwards)))


@pytest.mark.parametrize("monitor", ["ServiceMonitor", "PodMonitor"])
def test_web_tls_reaches_the_monitor_in_either_order(monitor: str) -> None:
    component = monitor.lower()
    for order in (("web-tls", component), (component, "web-tls")):
        endpoint = _monitor_endpoint(rendered(*order), monitor)
        assert endpoint["scheme"] == "https", order
        assert endpoint["tlsConfig"]["serverName"] == "nvgpu-exporter.nvgpu-exporter.svc", order
        assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "nvgpu-exporter-scrape", "key": "ca.crt"}, order
        assert endpoint["basicAuth"]["username"] == {"name": "nvgpu-exporter-scrape", "key": "username"}, order
    plain = _monitor_endpoint(rendered(component), monitor)
    assert plain["scheme"] == "http" and "tlsConfig" not in plain and "basicAuth" not in plain
    # The same endpoint otherwise: TLS adds to it, changes nothing else.
    tls = _monitor_endpoint(rendered("web-tls", component), monitor)
    assert {k: v for k, v in tls.items() if k not in ("scheme", "tlsConfig", "basicAuth")} == {
        k: v for k, v in plain.items() if k != "scheme"
    }


def test_the_scrape_endpoint_is_never_applied() -> None:
    """base/scrape-endpoint.yaml is kustomize's input only (local-config): no render prints it."""
    for components in [(), *COMPATIBLE.values()]:
        assert not [d for d in rendered(*components) if d["kind"] == "ConfigMap"], components


@pytest.mark.parametrize("pair", CONFLICTS, ids=["+".join(p) for p in CONFLICTS])
def test_restricted_with_root_or_host_pid_fails_in_either_order(pair: tuple[str, str]) -> None:
    for order in (pair, pair[::-1]):
        proc = _render(*order)
        assert proc.returncode != 0, f"{order} rendered: {proc.stdout[:200]}"
        assert "testing value" in proc.stderr, proc.stderr


# -- restricted ----------------------------------------------------------------------------------

RESTRICTED = ("restricted", "web-tls", "servicemonitor", "networkpolicy")


def _daemonsets(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    dss = [d for d in docs if d["kind"] == "DaemonSet"]
    assert len(dss) == 2, "stable and canary"
    return dss


@pytest.mark.parametrize("components", [("restricted",), RESTRICTED], ids=["restricted", "restricted+tls"])
def test_restricted_pods_meet_pod_security_restricted(components: tuple[str, ...]) -> None:
    docs = rendered(*components)
    (namespace,) = [d for d in docs if d["kind"] == "Namespace"]
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted", mode
    for ds in _daemonsets(docs):
        assert violations(ds["spec"]["template"], "restricted") == [], ds["metadata"]["name"]


def test_without_restricted_the_checker_names_what_restricted_removes() -> None:
    """The check above is a real one: the canary overlay's pods fail it for the hostPath only,
    process-attribution's already fail baseline, and their namespace enforces privileged."""
    for ds in _daemonsets(rendered()):
        found = violations(ds["spec"]["template"], "restricted")
        assert found and all("pod-resources" in v for v in found), found
    for ds in _daemonsets(rendered("pod-attribution-root", "process-attribution")):
        found = violations(ds["spec"]["template"], "baseline")
        assert "pod: hostPID" in found and any("/var/log/containers" in v for v in found), found
        assert "pod: runAsUser 0" in violations(ds["spec"]["template"], "restricted")
    (namespace,) = [d for d in rendered() if d["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_restricted_turns_pod_attribution_off_and_keeps_the_rest() -> None:
    from exporter.config import Config

    plain = {d["metadata"]["name"]: d for d in _daemonsets(rendered())}
    for ds in _daemonsets(rendered("restricted")):
        pod = ds["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["NVGPU_FEATURE_POD_ATTRIBUTION"] == "off"
        assert "NVGPU_POD_RESOURCES_SOCKET" not in env
        Config.from_env(env)  # still a configuration the exporter accepts
        assert [v["name"] for v in pod["volumes"]] == ["state", "tmp"]
        assert [m["mountPath"] for m in c["volumeMounts"]] == ["/var/lib/nvgpu-exporter", "/tmp"]
        # Nothing else changed: same probes, security context, resources, image, env order.
        before = plain[ds["metadata"]["name"]]["spec"]["template"]["spec"]
        (bc,) = before["containers"]
        for key in (
            "image",
            "ports",
            "resources",
            "securityContext",
            "startupProbe",
            "readinessProbe",
            "livenessProbe",
        ):
            assert c[key] == bc[key], key
        assert pod["securityContext"] == before["securityContext"]
        assert [e["name"] for e in c["env"]] == [
            e["name"] for e in bc["env"] if e["name"] != "NVGPU_POD_RESOURCES_SOCKET"
        ]


@pytest.mark.parametrize("k8s_version", _KV_VERSIONS)
def test_restricted_render_validates_strictly(k8s_version: str) -> None:
    if k8s_version == "missing":
        _need("kubernetes-validate", "pip install kubernetes-validate")
    import kubernetes_validate as kv

    for doc in rendered(*RESTRICTED):
        if doc["apiVersion"].startswith(OPERATOR_GROUP):
            _validate_operator_object(doc)
            continue
        kv.validate(doc, k8s_version, strict=True)


def test_podmonitor_with_web_tls_validates_against_the_crd_model() -> None:
    for components in (("web-tls", "podmonitor"), ("podmonitor", "web-tls")):
        (pm,) = [d for d in rendered(*components) if d["kind"] == "PodMonitor"]
        _validate_operator_object(pm)
