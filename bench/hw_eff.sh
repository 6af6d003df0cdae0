#!/usr/bin/env bash
# The efficiency measurements (CPU at equal cadence, footprint, sample time) on an H200 machine
# in one device call (about 7 minutes, under 9):
#   1. the footprint with pod attribution loaded (bench/footprint.py --backend nvml: RSS/USS/PSS of
#      all processes, idle at 1 s, the fake kubelet of bench/kubelet.py; goals PASS/MISS);
#   2. the side-by-side (bench/peer.py --gpu-load: under load, as the earlier H200 figures were):
#      the raw NVML floor against our time per sample, ours at 1 s against nvitop-exporter at its 1 s default,
#      one after the other in one run: idle CPU and RSS/PSS of all processes, sequential and 1000
#      concurrent; goals PASS/MISS;
#   3. if time is left, the two allocator variants of the footprint (MALLOC_ARENA_MAX=2; malloc_trim
#      after 10 s).
# Everything lands under $OUT (JSON, logs, versions); the verdicts are on stdout.
#   bash bench/hw_eff.sh
# Wheels the image lacks travel in .whl/ (carry it): nvitop, nvitop-exporter, bcrypt, PyYAML, and for
# pod attribution h2, hpack, hyperframe, protobuf (exporter/supervisor/podresources/transport.py).
# Never changes MIG mode, resets a GPU or injects faults.
set -u
OUT=${OUT:-/tmp/hw-eff-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BACKEND=${HW_EFF_BACKEND:-nvml}  # fake:examples/scenarios/h200x2.json for a dry run without a GPU
PEER_ARGS=${HW_EFF_PEER_ARGS:---gpu-load}
SITE=${HW_EFF_SITE:-/tmp/site}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    > "$OUT/wheels.log" 2>&1 || echo "wheel install failed: $OUT/wheels.log"
fi
export PYTHONPATH=$SITE:$PWD
# installed as bench/hw_run.sh does, so the exporter's own version is read from its metadata; the
# wheels above and our modules compiled to bytecode as any installed package is: an import that
# compiles from source (PYTHONDONTWRITEBYTECODE, or a tree not yet imported) holds more memory
# after (h2 + hpack from source: about 4 MB more USS in the supervisor, measured 2026-12-01)
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1
python3 -m compileall -q exporter bench >> "$OUT/install.log" 2>&1
{
  date -u; nvidia-smi -L; python3 --version; cat /proc/driver/nvidia/version; nproc
  python3 - <<'EOF'
import importlib.metadata as m
for d in ("nvidia-ml-py", "aiohttp", "psutil", "prometheus-client", "uvloop", "h2", "hpack", "hyperframe",
          "protobuf", "grpcio", "nvitop", "nvitop-exporter", "PyYAML", "bcrypt"):
    try:
        print(d, m.version(d))
    except m.PackageNotFoundError:
        print(d, "MISSING")
import exporter.supervisor.podresources.transport, exporter.supervisor.podresources.v1.api_pb2  # pod attribution
print("pod attribution imports: ok")
EOF
} > "$OUT/versions.txt" 2>&1
timeout 90 python3 bench/footprint.py --backend "$BACKEND" --json "$OUT/footprint.json" --markdown \
  > "$OUT/footprint.log" 2>&1
echo "footprint rc=$?" >> "$OUT/versions.txt"
# peer.py rewrites its JSON after every phase: a run cut by the timeout keeps what it measured
timeout 400 python3 bench/peer.py --our-backend "$BACKEND" $PEER_ARGS --out "$OUT/peer.json" > "$OUT/peer.log" 2>&1
echo "peer rc=$?" >> "$OUT/versions.txt"
if [ "$SECONDS" -lt 420 ]; then
  timeout 45 python3 bench/footprint.py --backend "$BACKEND" --env MALLOC_ARENA_MAX=2 \
    --json "$OUT/footprint-arena2.json" > "$OUT/footprint-arena2.log" 2>&1
fi
if [ "$SECONDS" -lt 460 ]; then
  timeout 50 python3 bench/footprint.py --backend "$BACKEND" --trim-after 10 \
    --json "$OUT/footprint-trim.json" > "$OUT/footprint-trim.log" 2>&1
fi
echo "elapsed ${SECONDS} s" >> "$OUT/versions.txt"
tail -4 "$OUT/versions.txt"; grep -E 'MISSING|ok$' "$OUT/versions.txt"
grep -E '^(PASS|MISS|N/A)' "$OUT"/footprint*.log; sed -n '/^| goal/,$p' "$OUT/peer.log" | head -20
