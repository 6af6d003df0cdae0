#!/usr/bin/env bash
# One batched device run on an H200 machine (the device tool): every hardware check in one call, so
# the session's short device time is spent measuring, not starting machines. Results: $OUT/<name>.tgz
# (every raw file) and the pytest tail on stdout. Never changes MIG mode, resets a GPU or injects faults.
#   bash bench/hw_run.sh <name> [pytest args...]
set -u
name=${1:-run}; shift || true
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=/tmp/hw-$name; rm -rf "$R"; mkdir -p "$R/hw"
# packages the image lacks (bcrypt for the web config) travel as wheels in .whl/ (device README)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$R/wheels.log" 2>&1 && export PYTHONPATH=/tmp/site:$PWD
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$R/install.log" 2>&1
{
  date -u; nvidia-smi; nvidia-smi topo -m; python3 --version; cat /proc/driver/nvidia/version
  python3 -c "import pynvml, importlib.metadata as m; pynvml.nvmlInit(); print('driver', pynvml.nvmlSystemGetDriverVersion(), 'nvml', pynvml.nvmlSystemGetNVMLVersion(), 'nvidia-ml-py', m.version('nvidia-ml-py'))"
} > "$R/versions.txt" 2>&1
timeout 150 python3 bench/attach_only.py --out "$R/attach_only.json" > "$R/attach_only.log" 2>&1
timeout 90 python3 bench/hw_exposition.py --out "$R/expo" > "$R/expo.log" 2>&1
timeout 90 python3 bench/adoption_check.py --out "$R/adoption.json" > "$R/adoption.log" 2>&1
timeout 120 python3 bench/footprint.py --backend nvml --json "$R/footprint.json" --markdown > "$R/footprint.log" 2>&1
NVGPU_HW_OUT="$R/hw" timeout 420 python3 -m pytest -q -p no:cacheprovider -rs "${@:-tests/hardware}" > "$R/pytest.log" 2>&1
# every exporter log the hardware tests left (a worker death's record and stack are in them)
mkdir -p "$R/logs"; find /tmp/pytest-of-*/ -name 'exporter-*.log' -exec cp --parents {} "$R/logs" \; 2>/dev/null
grep -l 'worker died' -r "$R" 2>/dev/null | head
tar czf "${OUT:-/tmp}/$name.tgz" -C "$R" .
tail -25 "$R/pytest.log"; cat "$R/attach_only.log" "$R/expo.log" "$R/adoption.log" | tail -12; tail -30 "$R/footprint.log"
