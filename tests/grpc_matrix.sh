#!/usr/bin/env bash
# The pod-attribution stubs (exporter/supervisor/podresources/v1, grpcio-tools 1.62.3) and the h2 client
# against the protobuf and h2 versions in common use, with grpcio servers of those years as the fake
# kubelet: the oldest the `kubernetes` and `test` extras admit, the H200 image's grpcio 1.84, and the
# newest. Each combination gets a throwaway virtual environment (needs the package index) and runs
# tests/test_podresources.py there: a real gRPC server on a unix socket, the real client. Not part of the default test run (it installs packages); run it after regenerating the
# stubs or changing the extra's bounds:
#
#   bash tests/grpc_matrix.sh            # about a minute per combination on a warm pip cache
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
combos=(
  "grpcio==1.66.2 protobuf==4.25.8 h2==4.4.1"   # the extra's lower bounds
  "grpcio==1.70.0 protobuf==5.29.6 h2==4.4.1"
  "grpcio==1.84.2 protobuf==6.33.6 h2==4.4.1"   # the H200 image's grpcio
  "grpcio protobuf h2"                           # the newest
)
status=0
for combo in "${combos[@]}"; do
  env="$work/$(echo "$combo" | tr ' =.' '___')"
  "$python" -m venv "$env"
  # shellcheck disable=SC2086
  "$env/bin/pip" install -q --disable-pip-version-check $combo pytest pyyaml packaging >"$env.pip.log" 2>&1
  versions="$("$env/bin/python" -c 'import grpc, google.protobuf as p, importlib.metadata as m; h2 = m.version("h2"); print(f"grpcio {grpc.__version__}, protobuf {p.__version__}, h2 {h2}")')"
  if PYTHONPATH="$repo:$repo/tests" "$env/bin/python" -m pytest -q -p no:cacheprovider -p no:asyncio \
      -o asyncio_mode=strict "$repo/tests/test_podresources.py" >"$env.log" 2>&1; then
    echo "ok    $versions: $(tail -1 "$env.log")"
  else
    echo "FAIL  $versions"; tail -30 "$env.log"; status=1
  fi
done
exit $status
