"""deploy/: render the kustomizations, validate every manifest, and check what must line up.

- Rendering uses a real kustomize (``kustomize`` or ``kubectl kustomize``).
- Built-in kinds are validated strictly (unknown fields rejected) with kubernetes-validate, for
  the oldest and the newest Kubernetes version it ships schemas for.
- Prometheus Operator kinds (ServiceMonitor, PodMonitor, PrometheusRule) have no schema in
  kubernetes-validate (it raises SchemaNotFoundError, asserted below). They are validated with
  the pydantic models that cloudcoil-models-prometheus-operator generates from the operator's
  CRD OpenAPI schemas (enums, patterns, types), plus a round trip that rejects unknown fields.
- Probe paths, ports and port names are checked against the exporter's own routes, default port
  and configuration parser, not against copies of them in this file.
- ``promtool check config`` on deploy/prometheus/scrape-config.yaml.
"""

from __future__ import annotations

import copy
import functools
import os
import posixpath
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_render import (
    _KV_VERSIONS,
    BASE,
    CANARY,
    CANARY_LABEL,
    NAMESPACE,
    OPERATOR_GROUP,
    PAUSE_LABEL,
    PROMETHEUS_RULE,
    REPO,
    SCRAPE_CONFIG,
    TRACK_LABEL,
    _kustomize,
    _need,
    _overlay,
    _validate_operator_object,
)
from promql_docs import promql_blocks

yaml = pytest.importorskip("yaml")

# Every way the repository can be rendered: the base, the canary overlay, and the overlay with each
# opt-in component (ServiceMonitor and PodMonitor are alternatives, so they go in separate sets).
RENDERINGS = {
    "base": lambda: _kustomize(BASE),
    "canary": lambda: _kustomize(CANARY),
    "canary+servicemonitor+runtime-class-nvidia+prometheusrule": lambda: _overlay(
        "servicemonitor", "runtime-class-nvidia", "prometheusrule"
    ),
    "canary+podmonitor+pod-attribution-root": lambda: _overlay("podmonitor", "pod-attribution-root"),
    "canary+pod-attribution-root+process-attribution": lambda: _overlay("pod-attribution-root", "process-attribution"),
    "canary+servicemonitor+web-tls+networkpolicy+dcgm-compat": lambda: _overlay(
        "servicemonitor", "web-tls", "networkpolicy", "dcgm-compat"
    ),
}
SECURED = "canary+servicemonitor+web-tls+networkpolicy+dcgm-compat"
DCGM_RULE = REPO / "deploy" / "prometheus" / "dcgm-compat" / "prometheusrule.yaml"


@functools.cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(RENDERINGS[name]())


def _all(name: str, kind: str) -> list[dict[str, Any]]:
    return [copy.deepcopy(d) for d in rendered(name) if d["kind"] == kind]


def _one(name: str, kind: str) -> dict[str, Any]:
    docs = _all(name, kind)
    assert len(docs) == 1, f"{name}: {len(docs)} {kind}"
    return docs[0]


def _container(ds: dict[str, Any]) -> dict[str, Any]:
    containers = ds["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def _env(ds: dict[str, Any]) -> dict[str, str]:
    env = _container(ds)["env"]
    for item in env:
        assert set(item) == {"name", "value"}, item
        assert isinstance(item["value"], str), f"{item['name']}: not a string: {item['value']!r}"
    return {e["name"]: e["value"] for e in env}


# -- rendering and schema validation -------------------------------------------------------------


def test_renderings_have_the_expected_objects() -> None:
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in rendered("base"))
    assert kinds == [
        "DaemonSet/nvgpu-exporter",
        "Namespace/nvgpu-exporter",
        "Service/nvgpu-exporter",
        "ServiceAccount/nvgpu-exporter",
    ]
    daemonsets = sorted(d["metadata"]["name"] for d in rendered("canary") if d["kind"] == "DaemonSet")
    assert daemonsets == ["nvgpu-exporter", "nvgpu-exporter-canary"]
    for name in RENDERINGS:
        for doc in rendered(name):
            if doc["kind"] != "Namespace":
                assert doc["metadata"].get("namespace") == NAMESPACE, (name, doc["metadata"])
            assert not doc["apiVersion"].startswith("kustomize"), "unrendered kustomize object"


def _kv_versions() -> list[str]:
    kv = pytest.importorskip("kubernetes_validate")
    versions = kv.utils.all_versions()
    return [versions[0], versions[-1]]


@pytest.mark.parametrize("k8s_version", _KV_VERSIONS)
@pytest.mark.parametrize("rendering", list(RENDERINGS))
def test_builtin_kinds_validate_strictly(rendering: str, k8s_version: str) -> None:
    if k8s_version == "missing":
        _need("kubernetes-validate", "pip install kubernetes-validate")
    import kubernetes_validate as kv

    checked = 0
    for doc in rendered(rendering):
        if doc["apiVersion"].startswith(OPERATOR_GROUP):
            # kubernetes-validate ships schemas for built-in kinds only: it cannot check CRDs.
            with pytest.raises(kv.SchemaNotFoundError):
                kv.validate(doc, k8s_version, strict=True)
            continue
        try:
            kv.validate(doc, k8s_version, strict=True)
        except kv.ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} at {path}: {exc.message}")
        checked += 1
    assert checked >= 4


def test_strict_validation_rejects_a_misspelt_field() -> None:
    """The validator used above is strict: an unknown field is an error, not ignored."""
    kv = pytest.importorskip("kubernetes_validate")
    ds = _one("base", "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, _kv_versions()[-1], strict=True)


def test_operator_objects_validate_against_the_crd_models() -> None:
    seen = set()
    for name in RENDERINGS:
        for doc in rendered(name):
            if doc["apiVersion"].startswith(OPERATOR_GROUP):
                _validate_operator_object(doc)
                seen.add(doc["kind"])
    assert {"ServiceMonitor", "PodMonitor"} <= seen
    if PROMETHEUS_RULE.exists():
        assert "PrometheusRule" in seen


def test_crd_model_validation_rejects_typos() -> None:
    sm = _one("canary+servicemonitor+runtime-class-nvidia+prometheusrule", "ServiceMonitor")
    bad = copy.deepcopy(sm)
    bad["spec"]["endpoints"][0]["relabelings"][0]["sourcelabels"] = ["x"]  # unknown field
    with pytest.raises(AssertionError):
        _validate_operator_object(bad)
    bad = copy.deepcopy(sm)
    bad["spec"]["endpoints"][0]["interval"] = "15 sec"  # not a Prometheus duration
    with pytest.raises(Exception, match="interval"):
        _validate_operator_object(bad)


# -- probes, ports and names line up with the exporter ---------------------------------------------


def _app_routes() -> set[str]:
    from exporter.config import Config

    text = (REPO / "exporter" / "supervisor" / "http" / "web.py").read_text(encoding="utf-8")
    return set(re.findall(r"add_get\(\s*\"([^\"]+)\"", text)) | {Config().telemetry_path}  # --web.telemetry-path


def _default_port() -> int:
    from exporter import settingvalues

    return int(settingvalues.DEFAULT_PORT)


def _daemonsets(rendering: str) -> list[dict[str, Any]]:
    dss = _all(rendering, "DaemonSet")
    assert dss
    return dss


@pytest.mark.parametrize("rendering", list(RENDERINGS))
def test_probes_hit_the_exporters_routes_on_the_metrics_port(rendering: str) -> None:
    routes = _app_routes()
    assert {"/metrics", "/healthz", "/readyz"} <= routes, routes
    port = _default_port()
    assert port == 19400
    for ds in _daemonsets(rendering):
        c = _container(ds)
        assert c["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
        probes = {k: c[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
        paths = {k: p["httpGet"]["path"] for k, p in probes.items()}
        assert paths == {
            "startupProbe": "/readyz",  # fresh data once, with a long budget for NVML init
            "readinessProbe": "/readyz",  # Ready = serving fresh GPU data
            "livenessProbe": "/healthz",  # supervisor alive; never NVML/GPU trouble
        }
        assert {p["httpGet"]["port"] for p in probes.values()} == {"metrics"}
        # Generous startup budget (NVML init after boot), liveness slower to give up than ready.
        s, r, live = probes["startupProbe"], probes["readinessProbe"], probes["livenessProbe"]
        assert s["periodSeconds"] * s["failureThreshold"] >= 300
        assert live["periodSeconds"] * live["failureThreshold"] > r["periodSeconds"] * r["failureThreshold"]
        listen = _env(ds)["NVGPU_LISTEN_ADDRESS"]
        assert listen.rpartition(":")[2] == str(port)


@pytest.mark.parametrize("rendering", list(RENDERINGS))
def test_daemonset_env_is_accepted_by_the_exporters_config_parser(rendering: str) -> None:
    from exporter.config import Config

    for ds in _daemonsets(rendering):
        env = _env(ds)
        if "NVGPU_WEB_CONFIG_FILE" in env:  # the Secret's file exists in the pod only: a stand-in here
            assert env["NVGPU_WEB_CONFIG_FILE"].startswith("/etc/nvgpu-exporter/web/")
            stand_in = tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False)  # noqa: SIM115
            stand_in.write("http_server_config: {http2: false}\n")
            stand_in.close()
            env["NVGPU_WEB_CONFIG_FILE"] = stand_in.name
        try:
            cfg = Config.from_env(env)  # raises ConfigError listing every problem
        finally:
            if "NVGPU_WEB_CONFIG_FILE" in env and env["NVGPU_WEB_CONFIG_FILE"].startswith(tempfile.gettempdir()):
                os.unlink(env["NVGPU_WEB_CONFIG_FILE"])
        state_dir = posixpath.dirname(env["NVGPU_STATE_FILE"])
        socket_dir = posixpath.dirname(env["NVGPU_POD_RESOURCES_SOCKET"])
        assert cfg.state_file == env["NVGPU_STATE_FILE"]
        mounts = {m["mountPath"]: m for m in _container(ds)["volumeMounts"]}
        volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
        assert "emptyDir" in volumes[mounts[state_dir]["name"]], "state must be on an emptyDir"
        assert not mounts[state_dir].get("readOnly")
        pod_resources = volumes[mounts[socket_dir]["name"]]
        assert pod_resources["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
        assert mounts[socket_dir]["readOnly"] is True


def test_service_and_monitors_use_the_metrics_port_name() -> None:
    rendering = "canary+servicemonitor+runtime-class-nvidia+prometheusrule"
    svc = _one(rendering, "Service")
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": _default_port(), "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert svc["spec"]["publishNotReadyAddresses"] is True
    selector = svc["spec"]["selector"]
    for ds in _daemonsets(rendering):
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), "Service does not select this DaemonSet"
        assert svc["spec"]["ports"][0]["targetPort"] in {p["name"] for p in _container(ds)["ports"]}

    sm = _one(rendering, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert [e["port"] for e in sm["spec"]["endpoints"]] == [svc["spec"]["ports"][0]["name"]]
    assert [e["path"] for e in sm["spec"]["endpoints"]] == ["/metrics"]

    pm = _one("canary+podmonitor+pod-attribution-root", "PodMonitor")
    for ds in _daemonsets("canary+podmonitor+pod-attribution-root"):
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["metrics"]


@pytest.mark.parametrize(
    ("rendering", "kind", "key"),
    [
        (
            "canary+servicemonitor+runtime-class-nvidia+prometheusrule",
            "ServiceMonitor",
            "endpoints",
        ),
        ("canary+podmonitor+pod-attribution-root", "PodMonitor", "podMetricsEndpoints"),
    ],
)
def test_monitors_keep_workload_labels_unrenamed(rendering: str, kind: str, key: str) -> None:
    """The operator's namespace/pod/container target labels are dropped, node/track added."""
    monitor = _one(rendering, kind)
    for endpoint in monitor["spec"][key]:
        assert not endpoint.get("honorLabels"), "honorLabels would let any series override targets"
        relabelings = endpoint["relabelings"]
        targets = {r.get("targetLabel"): r.get("sourceLabels") for r in relabelings}
        assert targets["node"] == ["__meta_kubernetes_pod_node_name"]
        assert targets["track"] == ["__meta_kubernetes_pod_label_nvgpu_exporter_track"]
        drops = [r["regex"] for r in relabelings if r["action"] == "labeldrop"]
        assert len(drops) == 1 and relabelings[-1]["action"] == "labeldrop"
        for label in ("namespace", "pod", "container"):
            assert re.fullmatch(drops[0], label), label
        for label in ("node", "track", "exporter_pod", "job", "instance"):
            assert not re.fullmatch(drops[0], label), label


# -- the DaemonSets ------------------------------------------------------------------------------


@pytest.mark.parametrize("rendering", list(RENDERINGS))
def test_daemonset_security(rendering: str) -> None:
    sa = _one(rendering, "ServiceAccount")
    assert sa["automountServiceAccountToken"] is False
    root = "pod-attribution-root" in rendering
    processes = "process-attribution" in rendering  # hostPID and the container log names
    for ds in _daemonsets(rendering):
        pod = ds["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == sa["metadata"]["name"]
        assert pod["automountServiceAccountToken"] is False
        for host_ns in ("hostNetwork", "hostIPC"):
            assert not pod.get(host_ns), host_ns
        assert bool(pod.get("hostPID")) is processes
        psc = pod["securityContext"]
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
        if root:
            # The opt-in component: uid 0 to open the kubelet's root-owned socket, nothing more.
            assert psc["runAsUser"] == 0 and psc["runAsNonRoot"] is False
        else:
            assert psc["runAsNonRoot"] is True
            assert psc["runAsUser"] > 0 and psc["runAsGroup"] > 0
        c = _container(ds)
        csc = c["securityContext"]
        assert csc["readOnlyRootFilesystem"] is True
        assert csc["allowPrivilegeEscalation"] is False
        assert not csc.get("privileged")
        assert csc["capabilities"] == {"drop": ["ALL"]}
        env = _env(ds)
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
        # Watching the GPUs must not take one: no GPU resource requested.
        assert not any(k.startswith("nvidia.com/") for section in c["resources"].values() for k in section)
        volumes = pod["volumes"]
        host_paths = [v["hostPath"]["path"] for v in volumes if "hostPath" in v]
        expected = ["/var/lib/kubelet/pod-resources"] + (["/var/log/containers"] if processes else [])
        assert host_paths == expected, "only the pod-resources dir (and the container log names)"
        host_mounts = [m for m in c["volumeMounts"] if m["mountPath"] in expected]
        assert len(host_mounts) == len(expected) and all(m.get("readOnly") is True for m in host_mounts)
        writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
        empty_dirs = {v["name"] for v in volumes if "emptyDir" in v}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert all(mounts[p] in empty_dirs for p in writable), "writable mounts are emptyDirs"


@pytest.mark.parametrize("rendering", list(RENDERINGS))
def test_daemonset_rollout_resources_and_placement(rendering: str) -> None:
    for ds in _daemonsets(rendering):
        strategy = ds["spec"]["updateStrategy"]
        assert strategy["type"] == "RollingUpdate"
        max_unavailable = strategy["rollingUpdate"]["maxUnavailable"]
        assert max_unavailable in (1, "10%"), max_unavailable
        assert strategy["rollingUpdate"]["maxSurge"] == 0
        assert ds["spec"]["minReadySeconds"] >= 30
        res = _container(ds)["resources"]
        assert res == {
            "requests": {"cpu": "50m", "memory": "128Mi"},
            "limits": {"cpu": "500m", "memory": "256Mi"},
        }
        pod = ds["spec"]["template"]["spec"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        image = _container(ds)["image"]
        assert image.startswith("registry.example.com/platform/nvgpu-exporter:"), image


def _node_terms(ds: dict[str, Any]) -> list[dict[str, dict[str, Any]]]:
    affinity = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [{e["key"]: e for e in t["matchExpressions"]} for t in terms]


def test_canary_and_stable_split_the_gpu_nodes() -> None:
    dss = {d["metadata"]["name"]: d for d in _daemonsets("canary")}
    stable, canary = dss["nvgpu-exporter"], dss["nvgpu-exporter-canary"]
    for term in _node_terms(stable):
        assert term[CANARY_LABEL] == {"key": CANARY_LABEL, "operator": "NotIn", "values": ["true"]}
    for term in _node_terms(canary):
        assert term[CANARY_LABEL] == {"key": CANARY_LABEL, "operator": "In", "values": ["true"]}
    # Same GPU-node terms otherwise.
    strip = [{k: v for k, v in t.items() if k != CANARY_LABEL} for t in _node_terms(stable)]
    assert strip == [{k: v for k, v in t.items() if k != CANARY_LABEL} for t in _node_terms(canary)]
    assert {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present", PAUSE_LABEL} == {
        k for t in strip for k in t
    }
    # Every term keeps the exporter off a node labelled for a GPU reset / MIG change.
    for term in [*_node_terms(stable), *_node_terms(canary)]:
        assert term[PAUSE_LABEL] == {"key": PAUSE_LABEL, "operator": "NotIn", "values": ["true"]}
    # Distinct selectors (a DaemonSet's selector is immutable and must not overlap another's).
    assert stable["spec"]["selector"]["matchLabels"][TRACK_LABEL] == "stable"
    assert canary["spec"]["selector"]["matchLabels"][TRACK_LABEL] == "canary"
    # The canary is the stable pod, pinned elsewhere: same container spec but the image.
    s_pod = copy.deepcopy(stable["spec"]["template"]["spec"])
    c_pod = copy.deepcopy(canary["spec"]["template"]["spec"])
    for pod in (s_pod, c_pod):
        del pod["affinity"]
        pod["containers"][0].pop("image")
    assert s_pod == c_pod
    assert canary["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1


def test_base_stable_daemonset_is_the_one_in_the_canary_overlay() -> None:
    assert (
        _one("base", "DaemonSet")
        == [d for d in _all("canary", "DaemonSet") if d["metadata"]["name"] == "nvgpu-exporter"][0]
    )


def test_runtime_class_is_settable() -> None:
    assert "runtimeClassName" not in _one("base", "DaemonSet")["spec"]["template"]["spec"]
    for ds in _daemonsets("canary+servicemonitor+runtime-class-nvidia+prometheusrule"):
        assert ds["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"


def test_prometheusrule_component_carries_the_generated_rules() -> None:
    """components/prometheusrule renders deploy/prometheus/prometheusrule.yaml, unchanged."""
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    (doc,) = _all("canary+servicemonitor+runtime-class-nvidia+prometheusrule", "PrometheusRule")
    assert doc["metadata"]["namespace"] == NAMESPACE
    assert doc["spec"] == rule["spec"]
    assert "PrometheusRule" not in [d["kind"] for d in rendered("canary")]


def test_web_tls_component_mounts_the_secret_and_probes_over_https() -> None:
    for ds in _daemonsets(SECURED):
        c = _container(ds)
        assert _env(ds)["NVGPU_WEB_CONFIG_FILE"] == "/etc/nvgpu-exporter/web/web-config.yml"
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/etc/nvgpu-exporter/web")
        assert mount["readOnly"] is True
        volume = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == "nvgpu-exporter-web"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["scheme"] == "HTTPS", probe
    sm = _one(SECURED, "ServiceMonitor")
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "nvgpu-exporter-scrape", "key": "ca.crt"}
    assert endpoint["tlsConfig"]["keySecret"]["name"] == "nvgpu-exporter-scrape"
    assert endpoint["basicAuth"]["password"] == {"name": "nvgpu-exporter-scrape", "key": "password"}
    for name in ("base", "canary+servicemonitor+runtime-class-nvidia+prometheusrule"):
        assert "scheme" not in _container(_daemonsets(name)[0])["livenessProbe"]["httpGet"]


def test_networkpolicy_admits_only_the_prometheus_namespace_to_the_metrics_port() -> None:
    (policy,) = _all(SECURED, "NetworkPolicy")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    for ds in _daemonsets(SECURED):
        assert spec["podSelector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert "NetworkPolicy" not in [d["kind"] for d in rendered("canary")], "opt-in only"


def test_dcgm_compat_component_carries_the_generated_rules() -> None:
    rule = yaml.safe_load(DCGM_RULE.read_text())
    docs = {d["metadata"]["name"]: d for d in _all(SECURED, "PrometheusRule")}
    assert docs["nvgpu-exporter-dcgm-compat"]["spec"] == rule["spec"]


# -- plain Prometheus ----------------------------------------------------------------------------


def _scrape_job() -> dict[str, Any]:
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    jobs = config["scrape_configs"]
    assert [j["job_name"] for j in jobs] == ["nvgpu-exporter"]
    return dict(jobs[0])


def test_scrape_config_discovers_the_exporter_pods() -> None:
    job = _scrape_job()
    assert job["metrics_path"] == "/metrics"
    (sd,) = job["kubernetes_sd_configs"]
    # promtool here may lack Kubernetes SD (see below), so at least hold the block to the keys
    # Prometheus documents for kubernetes_sd_config (HTTP client settings aside, unused here).
    assert set(sd) <= {"role", "api_server", "kubeconfig_file", "namespaces", "selectors"}, sd
    assert set(sd["namespaces"]) <= {"own_namespace", "names"}
    assert all(set(sel) <= {"role", "label", "field"} for sel in sd["selectors"])
    assert sd["role"] == "pod"
    assert sd["namespaces"]["names"] == [NAMESPACE]
    (selector,) = sd["selectors"]
    key, _, value = selector["label"].partition("=")
    for ds in _daemonsets("canary"):
        assert ds["spec"]["template"]["metadata"]["labels"][key] == value
    relabel = job["relabel_configs"]
    keep = [r for r in relabel if r["action"] == "keep"]
    assert keep == [
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": "metrics",
        }
    ]
    targets = {r.get("target_label") for r in relabel}
    assert {"node", "track"} <= targets
    assert not targets & {"namespace", "pod", "container"}
    assert not job.get("honor_labels")


@functools.cache
def _promtool() -> str | None:
    return shutil.which("promtool")


def _promtool_check(path: Path) -> subprocess.CompletedProcess[str]:
    exe = _promtool()
    if exe is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return subprocess.run([exe, "check", "config", str(path)], capture_output=True, text=True, timeout=60, check=False)


def _promtool_has_kubernetes_sd(tmp: Path) -> bool:
    probe = tmp / "probe.yml"
    probe.write_text("scrape_configs:\n  - job_name: p\n    kubernetes_sd_configs:\n      - role: pod\n")
    return _promtool_check(probe).returncode == 0


@pytest.fixture
def tmp_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def test_promtool_check_config(tmp_dir: Path) -> None:
    if not _promtool_has_kubernetes_sd(tmp_dir):
        pytest.skip(
            "this promtool was built without Kubernetes service discovery (Debian's package "
            "drops it); the rest of the job is checked by test_promtool_check_config_rest"
        )
    proc = _promtool_check(SCRAPE_CONFIG)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_check_config_rest(tmp_dir: Path) -> None:
    """promtool on the same file with only the SD block swapped for a static target.

    Checks everything but the kubernetes_sd_configs block with the real promtool even where it
    lacks Kubernetes SD: global settings, the job, every relabel rule (actions, regexes, labels).
    """
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    job = config["scrape_configs"][0]
    del job["kubernetes_sd_configs"]
    job["static_configs"] = [{"targets": ["127.0.0.1:19400"]}]
    path = tmp_dir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    proc = _promtool_check(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # ... and it is a real check: a broken regex fails.
    job["relabel_configs"][0]["regex"] = "metrics("
    path.write_text(yaml.safe_dump(config))
    assert _promtool_check(path).returncode != 0


# -- PromQL in the docs --------------------------------------------------------------------------


@pytest.mark.parametrize("doc", ["rollout.md", "kubernetes.md"])
def test_promql_in_docs_parses_and_uses_known_metrics(doc: str, tmp_dir: Path) -> None:
    exprs = promql_blocks(REPO / "docs" / doc)
    assert exprs
    documented = set(re.findall(r"`(nvgpu_[a-z_]+)`", (REPO / "docs" / "metrics.md").read_text()))
    for expr in exprs:
        for name in re.findall(r"\b(nvgpu_[a-z_]+)\b", expr):
            assert name in documented, f"{doc}: {name} is not in docs/metrics.md"
    rules = {
        "groups": [
            {
                "name": "docs",
                "rules": [{"record": f"docs:expr_{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_dir / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    exe = _promtool()
    if exe is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    proc = subprocess.run([exe, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
