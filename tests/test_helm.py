"""deploy/helm/nvgpu-exporter: lint, render a matrix of values, validate, and hold it to kustomize.

- Helm's own engine renders and lints the chart, offline: the PyPI package helm-python-sdk bundles
  it (``helm_python.Chart.load(path).render(values, name=..., namespace=...)``, which also checks
  values.schema.json as ``helm install`` does, and ``helm_python.lint``).
- Every rendered object is validated as tests/test_deploy.py validates the kustomize renders:
  built-in kinds strictly with kubernetes-validate (oldest and newest Kubernetes it knows),
  ServiceMonitor / PodMonitor / PrometheusRule against the Prometheus Operator CRD models.
- The default render and the kustomize base describe the same DaemonSet (the whole pod template
  but the Helm labels), and each chart value that stands for a kustomize component renders what
  that component renders.
- values.schema.json refuses bad values, and the values it admits are ones the exporter accepts.
"""

from __future__ import annotations

import copy
import functools
import tempfile
from pathlib import Path
from typing import Any

import pytest
from k8s_render import (
    _KV_VERSIONS,
    BASE,
    OPERATOR_GROUP,
    _kustomize,
    _need,
    _overlay,
    _validate_operator_object,
)
from pod_security import violations

import exporter

yaml = pytest.importorskip("yaml")
try:
    import helm_python as helm
except ImportError:  # reported by the fixture below (a failure in CI)
    helm = None

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "nvgpu-exporter"
RULES = REPO / "deploy" / "prometheus" / "rules.yaml"
DCGM_RULES = REPO / "deploy" / "prometheus" / "dcgm-compat" / "rules.yaml"
SMI_RULES = REPO / "deploy" / "prometheus" / "nvidia-smi-compat" / "rules.yaml"
RELEASE = "nvgpu-exporter"
NAMESPACE = "nvgpu-exporter"
# Labels Helm adds that kustomize does not (the rest of every object must be the same).
HELM_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
)


@pytest.fixture(autouse=True)
def _helm_sdk() -> None:
    if helm is None:
        _need("helm-python-sdk", "pip install helm-python-sdk (requirements-ci.txt)")


@functools.cache
def _chart() -> Any:
    return helm.Chart.load(str(CHART))


def _render_text(values: dict[str, Any], name: str = RELEASE, namespace: str = NAMESPACE) -> dict[str, str]:
    return dict(_chart().render(copy.deepcopy(values), name=name, namespace=namespace))


@functools.cache
def _render_cached(key: str) -> tuple[dict[str, Any], ...]:
    values, name, namespace = MATRIX[key]
    return tuple(_docs(_render_text(values, name, namespace)))


def _docs(manifests: dict[str, str]) -> list[dict[str, Any]]:
    docs = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def render(values: dict[str, Any], name: str = RELEASE, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    return _docs(_render_text(values, name, namespace))


def notes(values: dict[str, Any], namespace: str = NAMESPACE) -> str:
    return _render_text(values, namespace=namespace)[f"{CHART.name}/templates/NOTES.txt"]


def _one(docs: list[dict[str, Any]] | tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}"
    return copy.deepcopy(found[0])


def _without_helm_labels(doc: dict[str, Any]) -> dict[str, Any]:
    """The object as kustomize would write it: Helm's labels gone from metadata, template and selectors."""
    doc = copy.deepcopy(doc)

    def strip(labels: dict[str, str] | None) -> None:
        for key in HELM_LABELS:
            (labels or {}).pop(key, None)

    strip(doc["metadata"].get("labels"))
    spec = doc.get("spec") or {}
    for path in (
        ("template", "metadata", "labels"),
        ("selector", "matchLabels"),
        ("selector",),
        ("podSelector", "matchLabels"),
    ):
        node: Any = spec
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            strip(node)
    return doc


# name -> (values, release name, namespace). Each optional object on, and the combinations that
# change the pod.
MATRIX: dict[str, tuple[dict[str, Any], str, str]] = {
    "defaults": ({}, RELEASE, NAMESPACE),
    "servicemonitor+prometheusrule+dcgm-compat": (
        {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
         "prometheusRule": {"enabled": True}, "dcgmCompat": {"enabled": True}, "nvidiaSmiCompat": {"enabled": True}},
        RELEASE, NAMESPACE,
    ),
    "podmonitor+networkpolicy": (
        {"podMonitor": {"enabled": True, "interval": "30s"}, "networkPolicy": {"enabled": True}}, RELEASE, NAMESPACE
    ),
    "tls+servicemonitor": ({"webConfig": {"enabled": True}, "serviceMonitor": {"enabled": True}}, RELEASE, NAMESPACE),
    "tls+podmonitor, no mutual TLS": (
        {"webConfig": {"enabled": True}, "podMonitor": {"enabled": True},
         "scrapeAuth": {"mutualTLS": False, "serverName": "gpu-metrics.example.com"}},
        RELEASE, NAMESPACE,
    ),
    "restricted": ({"restricted": True}, RELEASE, NAMESPACE),
    "restricted+tls+servicemonitor+networkpolicy": (
        {"restricted": True, "webConfig": {"enabled": True}, "serviceMonitor": {"enabled": True},
         "networkPolicy": {"enabled": True, "from": [{"podSelector": {"matchLabels": {"app": "prometheus"}}}]}},
        RELEASE, NAMESPACE,
    ),
    "hostNetwork": ({"hostNetwork": True, "port": 9400}, RELEASE, NAMESPACE),
    "root+process-attribution+pod-labels": (
        {"podAttribution": {"runAsRoot": True, "podLabels": True}, "processAttribution": {"enabled": True},
         "features": {"process_usage": "on"}},
        RELEASE, NAMESPACE,
    ),
    "no pod attribution, no service, podmonitor": (
        {"podAttribution": {"enabled": False}, "service": {"enabled": False}, "podMonitor": {"enabled": True},
         "serviceAccount": {"create": False, "name": "default"}},
        RELEASE, NAMESPACE,
    ),
    "canary by digest, other release and namespace": (
        {"track": "canary", "image": {"repository": "registry.internal/gpu/nvgpu-exporter",
                                      "digest": "sha256:" + "ab" * 32}},
        "gpu-canary", "monitoring",
    ),
    "placement": (
        {"nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                         {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}],
         "priorityClassName": "system-node-critical", "runtimeClassName": "nvidia",
         "imagePullSecrets": [{"name": "registry"}], "podAnnotations": {"a": "b"}, "podLabels": {"team": "ml"}},
        RELEASE, NAMESPACE,
    ),
    "affinity replaced, config": (
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}}},
         "logFormat": "text", "logLevel": "debug", "selfcheck": "strict", "maxUnavailable": 1,
         # YAML's unquoted off/on arrive as booleans
         "features": {"nvlink_throughput": False, "details": True, "mig": "auto"},
         "extraEnv": [{"name": "NVGPU_SAMPLE_INTERVAL_SECONDS", "value": "5"}],
         "image": {"tag": "0.1.0-rc1"}},
        RELEASE, NAMESPACE,
    ),
    # nvidia_gpu_exporter's chart defaults: promslog's names and a Go duration
    "toolkit spellings": (
        {"logFormat": "logfmt", "logLevel": "warn",
         "extraEnv": [{"name": "NVGPU_SAMPLE_INTERVAL_SECONDS", "value": "1s"}]},
        RELEASE, NAMESPACE,
    ),
}  # fmt: skip


def _daemonset(key: str) -> dict[str, Any]:
    return _one(_render_cached(key), "DaemonSet")


def _container(ds: dict[str, Any]) -> dict[str, Any]:
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    return dict(c)


def _env(ds: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in _container(ds)["env"] if "value" in e}


# -- lint and the rendered objects -----------------------------------------------------------------


def test_chart_lints_clean_in_strict_mode() -> None:
    for values, _, namespace in (MATRIX["defaults"], MATRIX["restricted+tls+servicemonitor+networkpolicy"]):
        report = helm.lint(str(CHART), values, strict=True, namespace=namespace)
        assert report["errors"] == [], report
        # info only ("icon is recommended"); no warning or error
        assert all(m["severity"] <= 1 for m in report["messages"]), report["messages"]


def test_lint_is_a_real_check(tmp_path: Path) -> None:
    """The same chart with a broken template fails the lint."""
    import shutil

    broken = tmp_path / "nvgpu-exporter"
    shutil.copytree(CHART, broken)
    service = broken / "templates" / "service.yaml"
    service.write_text(service.read_text().replace("{{- end }}\n", "", 1))
    report = helm.lint(str(broken))
    assert report["errors"] or any(m["severity"] == 3 for m in report["messages"]), report


@pytest.mark.parametrize("key", list(MATRIX))
def test_renders_the_expected_objects(key: str) -> None:
    values, name, namespace = MATRIX[key]
    kinds = sorted(d["kind"] for d in _render_cached(key))
    expected = ["DaemonSet"]
    expected += ["Service"] if values.get("service", {}).get("enabled", True) else []
    expected += ["ServiceAccount"] if values.get("serviceAccount", {}).get("create", True) else []
    for value, kind in (("serviceMonitor", "ServiceMonitor"), ("podMonitor", "PodMonitor"),
                        ("networkPolicy", "NetworkPolicy"), ("prometheusRule", "PrometheusRule"),
                        ("dcgmCompat", "PrometheusRule"), ("nvidiaSmiCompat", "PrometheusRule")):  # fmt: skip
        expected += [kind] if values.get(value, {}).get("enabled") else []
    assert kinds == sorted(expected)
    for doc in _render_cached(key):
        assert doc["metadata"]["namespace"] == namespace
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == name


@pytest.mark.parametrize("k8s_version", _KV_VERSIONS)
@pytest.mark.parametrize("key", list(MATRIX))
def test_builtin_kinds_validate_strictly(key: str, k8s_version: str) -> None:
    if k8s_version == "missing":
        _need("kubernetes-validate", "pip install kubernetes-validate")
    import kubernetes_validate as kv

    for doc in _render_cached(key):
        if doc["apiVersion"].startswith(OPERATOR_GROUP):
            continue
        try:
            kv.validate(doc, k8s_version, strict=True)
        except kv.ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} at {path}: {exc.message}")


def test_operator_objects_validate_against_the_crd_models() -> None:
    seen = set()
    for key in MATRIX:
        for doc in _render_cached(key):
            if doc["apiVersion"].startswith(OPERATOR_GROUP):
                _validate_operator_object(doc)
                seen.add(doc["kind"])
    assert seen == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


@pytest.mark.parametrize("key", list(MATRIX))
def test_daemonset_env_is_accepted_by_the_exporters_config_parser(key: str) -> None:
    from exporter.config import Config

    ds = _daemonset(key)
    env = _env(ds)
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as stand_in:  # the Secret's file, in the pod only
        if "NVGPU_WEB_CONFIG_FILE" in env:
            stand_in.write("http_server_config: {http2: false}\n")
            stand_in.flush()
            env["NVGPU_WEB_CONFIG_FILE"] = stand_in.name
        cfg = Config.from_env(env)  # raises ConfigError listing every problem
    port = _container(ds)["ports"][0]["containerPort"]
    assert env["NVGPU_LISTEN_ADDRESS"] == f":{port}"
    assert cfg.state_file == env["NVGPU_STATE_FILE"]
    values = MATRIX[key][0]
    for feature, mode in values.get("features", {}).items():
        expected = {True: "on", False: "off"}.get(mode, mode)
        assert env[f"NVGPU_FEATURE_{feature.upper()}"] == expected


# -- the default render is the kustomize base --------------------------------------------------------


@functools.cache
def _kustomize_base() -> tuple[dict[str, Any], ...]:
    return tuple(_kustomize(BASE))


def _kustomize_with(*components: str) -> list[dict[str, Any]]:
    return _overlay(*components, base=BASE)


def _same_daemonset(helm_ds: dict[str, Any], kustomize_ds: dict[str, Any]) -> None:
    ours, theirs = _without_helm_labels(helm_ds), copy.deepcopy(kustomize_ds)
    # Kustomize selects the stable track by label; the chart selects by release (app.kubernetes.io/instance).
    theirs["spec"]["selector"]["matchLabels"].pop("nvgpu-exporter/track")
    assert ours["spec"]["selector"] == theirs["spec"]["selector"]
    assert ours["metadata"] == theirs["metadata"]
    assert ours["spec"] == theirs["spec"]


def test_default_render_is_the_kustomize_base() -> None:
    """Same DaemonSet (image, args, env, probes, mounts, security context: the whole pod template),
    same Service and ServiceAccount, but for the labels Helm adds."""
    ours = _render_cached("defaults")
    theirs = [d for d in _kustomize_base() if d["kind"] != "Namespace"]  # Helm does not own the namespace
    assert sorted(d["kind"] for d in ours) == sorted(d["kind"] for d in theirs)
    ds, kds = _one(ours, "DaemonSet"), _one(theirs, "DaemonSet")
    # Spelled out first, for a readable failure; then everything.
    c, kc = _container(ds), _container(kds)
    for field in ("image", "args", "env", "ports", "resources", "securityContext", "volumeMounts"):
        assert c.get(field) == kc.get(field), field
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe] == kc[probe], probe
    assert ds["spec"]["template"]["spec"]["securityContext"] == kds["spec"]["template"]["spec"]["securityContext"]
    _same_daemonset(ds, kds)
    svc, ksvc = _without_helm_labels(_one(ours, "Service")), _one(theirs, "Service")
    assert svc == ksvc
    assert _without_helm_labels(_one(ours, "ServiceAccount")) == _one(theirs, "ServiceAccount")


# chart values -> the kustomize components they stand for (rendered on the base)
EQUIVALENTS = [
    ({"webConfig": {"enabled": True}, "serviceMonitor": {"enabled": True}}, ("servicemonitor", "web-tls")),
    ({"webConfig": {"enabled": True}, "podMonitor": {"enabled": True}}, ("web-tls", "podmonitor")),
    ({"podAttribution": {"runAsRoot": True}, "processAttribution": {"enabled": True}},
     ("pod-attribution-root", "process-attribution")),
    ({"runtimeClassName": "nvidia", "networkPolicy": {"enabled": True}}, ("runtime-class-nvidia", "networkpolicy")),
    ({"restricted": True, "prometheusRule": {"enabled": True}, "dcgmCompat": {"enabled": True}},
     ("restricted", "prometheusrule", "dcgm-compat")),
]  # fmt: skip


@pytest.mark.parametrize(("values", "components"), EQUIVALENTS, ids=["+".join(c) for _, c in EQUIVALENTS])
def test_chart_values_render_what_the_kustomize_components_render(
    values: dict[str, Any], components: tuple[str, ...]
) -> None:
    ours = render(values)
    theirs = [d for d in _kustomize_with(*components) if d["kind"] != "Namespace"]
    assert sorted(d["kind"] for d in ours) == sorted(d["kind"] for d in theirs)
    _same_daemonset(_one(ours, "DaemonSet"), _one(theirs, "DaemonSet"))
    for kind, key in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        if any(d["kind"] == kind for d in theirs):
            assert _one(ours, kind)["spec"][key] == _one(theirs, kind)["spec"][key], kind
    if any(d["kind"] == "NetworkPolicy" for d in theirs):
        ours_np, theirs_np = _one(ours, "NetworkPolicy"), _one(theirs, "NetworkPolicy")
        assert ours_np["spec"]["ingress"] == theirs_np["spec"]["ingress"]
        assert ours_np["spec"]["policyTypes"] == theirs_np["spec"]["policyTypes"]
    rules = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"] for d in ours if d["kind"] == "PrometheusRule"
    }
    for d in theirs:
        if d["kind"] == "PrometheusRule":
            assert rules[d["metadata"]["labels"]["app.kubernetes.io/component"]] == d["spec"]


# -- rules come from the repository's rule files -------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "copy_name"),
    [(RULES, "rules.yaml"), (DCGM_RULES, "dcgm-compat-rules.yaml"), (SMI_RULES, "nvidia-smi-compat-rules.yaml")],
)
def test_chart_rule_files_are_the_repositorys(source: Path, copy_name: str) -> None:
    assert (CHART / "files" / copy_name).read_bytes() == source.read_bytes(), (
        f"deploy/helm/nvgpu-exporter/files/{copy_name} differs from {source.relative_to(REPO)}: "
        "run python deploy/prometheus/gen_prometheusrule.py (and --set dcgm-compat, --set nvidia-smi-compat)"
    )


def test_prometheusrules_carry_the_rule_files_unchanged() -> None:
    docs = {
        d["metadata"]["name"]: d
        for d in _render_cached("servicemonitor+prometheusrule+dcgm-compat")
        if d["kind"] == "PrometheusRule"
    }
    assert docs["nvgpu-exporter"]["spec"] == yaml.safe_load(RULES.read_text())
    assert docs["nvgpu-exporter-dcgm-compat"]["spec"] == yaml.safe_load(DCGM_RULES.read_text())
    assert docs["nvgpu-exporter-nvidia-smi-compat"]["spec"] == yaml.safe_load(SMI_RULES.read_text())
    # Prometheus' own templates in the annotations survived Helm's (inserted, not templated).
    text = yaml.safe_dump(docs["nvgpu-exporter"]["spec"])
    assert "{{ $labels." in text


# -- what the values do ------------------------------------------------------------------------------


def test_image_reference_defaults_to_the_chart_app_version() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["appVersion"] == exporter.__version__
    assert _container(_daemonset("defaults"))["image"] == (
        f"registry.example.com/platform/nvgpu-exporter:{meta['appVersion']}"
    )
    tagged = _daemonset("affinity replaced, config")
    assert _container(tagged)["image"].endswith(":0.1.0-rc1")
    # the version label says what runs, not the chart's appVersion
    assert tagged["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/version"] == "0.1.0-rc1"
    digest = _container(_daemonset("canary by digest, other release and namespace"))["image"]
    assert digest == "registry.internal/gpu/nvgpu-exporter@sha256:" + "ab" * 32


def test_web_config_switches_probes_and_monitors_to_https() -> None:
    for key in ("tls+servicemonitor", "tls+podmonitor, no mutual TLS"):
        c = _container(_daemonset(key))
        assert {c[p]["httpGet"].get("scheme") for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {"HTTPS"}
    sm = _one(_render_cached("tls+servicemonitor"), "ServiceMonitor")["spec"]["endpoints"][0]
    assert sm["scheme"] == "https" and sm["tlsConfig"]["serverName"] == "nvgpu-exporter.nvgpu-exporter.svc"
    pm = _one(_render_cached("tls+podmonitor, no mutual TLS"), "PodMonitor")["spec"]["podMetricsEndpoints"][0]
    assert pm["scheme"] == "https" and pm["tlsConfig"]["serverName"] == "gpu-metrics.example.com"
    assert "cert" not in pm["tlsConfig"] and "keySecret" not in pm["tlsConfig"]
    plain = _container(_daemonset("defaults"))
    assert "scheme" not in plain["livenessProbe"]["httpGet"]


def test_host_network_listens_on_the_node_port() -> None:
    ds = _daemonset("hostNetwork")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert _container(ds)["ports"] == [{"name": "metrics", "containerPort": 9400, "hostPort": 9400, "protocol": "TCP"}]
    assert _env(ds)["NVGPU_LISTEN_ADDRESS"] == ":9400"
    assert _one(_render_cached("hostNetwork"), "Service")["spec"]["ports"][0]["port"] == 9400


def test_canary_track_takes_the_canary_nodes() -> None:
    ds = _daemonset("canary by digest, other release and namespace")
    assert ds["metadata"]["name"] == "gpu-canary-nvgpu-exporter"
    assert ds["spec"]["template"]["metadata"]["labels"]["nvgpu-exporter/track"] == "canary"
    terms = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in terms["nodeSelectorTerms"]:
        by_key = {e["key"]: e for e in term["matchExpressions"]}
        assert by_key["nvgpu-exporter/canary"]["operator"] == "In"
        assert by_key["nvgpu-exporter/paused"]["operator"] == "NotIn"


def test_placement_values_reach_the_pod() -> None:
    pod = _daemonset("placement")["spec"]["template"]["spec"]
    values = MATRIX["placement"][0]
    for key in ("nodeSelector", "tolerations", "priorityClassName", "runtimeClassName", "imagePullSecrets"):
        assert pod[key] == values[key], key
    assert "affinity" in pod, "nodeSelector adds to the GPU-node affinity"
    replaced = _daemonset("affinity replaced, config")["spec"]["template"]["spec"]["affinity"]
    assert replaced == MATRIX["affinity replaced, config"][0]["affinity"]


def test_pod_attribution_off_drops_the_mount() -> None:
    ds = _daemonset("no pod attribution, no service, podmonitor")
    env = _env(ds)
    assert env["NVGPU_FEATURE_POD_ATTRIBUTION"] == "off" and "NVGPU_POD_RESOURCES_SOCKET" not in env
    assert not [v for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v]
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "default"


# -- Pod Security ------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [k for k in MATRIX if MATRIX[k][0].get("restricted")])
def test_restricted_renders_meet_pod_security_restricted(key: str) -> None:
    ds = _daemonset(key)
    assert violations(ds["spec"]["template"], "restricted") == []
    env = _env(ds)
    assert env["NVGPU_FEATURE_POD_ATTRIBUTION"] == "off" and "NVGPU_POD_RESOURCES_SOCKET" not in env
    assert "restricted" in notes(MATRIX[key][0]).split("pod-security.kubernetes.io/enforce=")[1].split()[0]


def test_pod_security_check_finds_what_the_other_renders_need() -> None:
    """The checker is a real one: the default pod is refused for its hostPath only, the
    process-attribution pod by baseline already (hostPID), and the checker sees hostNetwork."""
    default = violations(_daemonset("defaults")["spec"]["template"], "restricted")
    assert default and all("pod-resources" in v for v in default), default
    assert violations(_daemonset("defaults")["spec"]["template"], "baseline") == [
        "volume pod-resources: hostPath /var/lib/kubelet/pod-resources"
    ]
    root = violations(_daemonset("root+process-attribution+pod-labels")["spec"]["template"], "baseline")
    assert "pod: hostPID" in root
    restricted = violations(_daemonset("root+process-attribution+pod-labels")["spec"]["template"], "restricted")
    assert "pod: runAsUser 0" in restricted
    host_network = violations(_daemonset("hostNetwork")["spec"]["template"], "baseline")
    assert "pod: hostNetwork" in host_network and any("hostPort" in v for v in host_network)
    assert "enforce=privileged" in notes({})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"restricted": True, "podAttribution": {"runAsRoot": True}}, "forbids podAttribution.runAsRoot"),
        ({"restricted": True, "processAttribution": {"enabled": True}}, "forbids processAttribution.enabled"),
        ({"restricted": True, "hostNetwork": True}, "forbids hostNetwork"),
        ({"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}, "choose one"),
        ({"serviceMonitor": {"enabled": True}, "service": {"enabled": False}}, "needs service.enabled"),
        ({"podAttribution": {"enabled": False}, "processAttribution": {"enabled": True}}, "needs podAttribution"),
    ],
)
def test_combinations_that_cannot_work_fail_the_render(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(values)


# -- values.schema.json ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"image": {"tag": 0.1}}, "/image/tag"),  # --set image.tag=0.1 is a number
        ({"image": {"repository": "Registry.example.com/x"}}, "/image/repository"),
        ({"image": {"digest": "sha256:abc"}}, "/image/digest"),
        ({"servicemonitor": {"enabled": True}}, "servicemonitor"),  # misspelt: not silently ignored
        ({"serviceMonitor": {"enabled": True, "interval": "15 sec"}}, "/serviceMonitor/interval"),
        ({"serviceMonitor": {"enable": True}}, "enable"),
        ({"port": 70000}, "/port"),
        ({"track": "blue"}, "/track"),
        ({"restricted": "yes"}, "/restricted"),
        ({"logFormat": "jsn"}, "/logFormat"),
        ({"selfcheck": "on"}, "/selfcheck"),
        ({"features": {"nvlink_throughput": "disabled"}}, "/features/nvlink_throughput"),
        ({"features": {"kernel_xid": "on"}}, "kernel_xid"),
        ({"features": {"NVLINK": "on"}}, "NVLINK"),
        ({"maxUnavailable": "200%"}, "/maxUnavailable"),
        ({"resources": {"limits": {"memory": "256 MB"}}}, "/resources/limits/memory"),
        ({"tolerations": [{"key": "a", "operator": "Matches"}]}, "/tolerations/0/operator"),
        ({"extraEnv": [{"value": "x"}]}, "/extraEnv/0"),
        ({"podAttribution": {"socketDir": "relative/dir"}}, "/podAttribution/socketDir"),
    ],
)
def test_schema_rejects_bad_values(values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError) as exc:
        _chart().validate_schema(values)
    assert where in str(exc.value), str(exc.value)
    with pytest.raises(helm.HelmValuesError):  # and rendering (helm install / template) refuses them too
        render(values)


def test_schema_admits_the_defaults_and_every_feature() -> None:
    from guards import featuretable

    _chart().validate_schema(_chart().values)
    names = set(featuretable.FEATURES) - {"pod_attribution", "kernel_xid"}
    assert names
    _chart().validate_schema({"features": dict.fromkeys(sorted(names), "auto")})


def test_schema_choices_are_accepted_by_the_exporter() -> None:
    """Every logFormat / logLevel / selfcheck the schema admits is one the exporter's parser takes."""
    import json

    from exporter.config import Config

    props = json.loads((CHART / "values.schema.json").read_text())["properties"]
    for value, variable in (
        ("logFormat", "NVGPU_LOG_FORMAT"),
        ("logLevel", "NVGPU_LOG_LEVEL"),
        ("selfcheck", "NVGPU_SELFCHECK"),
    ):
        for choice in props[value]["enum"]:
            if choice:
                Config.from_env({variable: choice})  # raises ConfigError when refused
    modes = props["features"]["additionalProperties"]["oneOf"][0]["enum"]
    for mode in modes:
        Config.from_env({"NVGPU_FEATURE_DETAILS": mode})


def test_notes_guide_the_next_steps() -> None:
    text = notes({})
    assert "kubectl -n nvgpu-exporter get pods" in text
    assert "port-forward svc/nvgpu-exporter 19400" in text
    assert "image.repository is the example registry" in text
    assert "podAttribution.runAsRoot=true" in text
    sm = notes({"serviceMonitor": {"enabled": True}, "webConfig": {"enabled": True},
                "image": {"repository": "registry.internal/gpu/nvgpu-exporter"}})  # fmt: skip
    assert "ServiceMonitor nvgpu-exporter" in sm and "serviceMonitor.labels" in sm
    assert "Secret nvgpu-exporter-web" in sm and "https://" in sm
    assert "example registry" not in sm
