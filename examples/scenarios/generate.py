#!/usr/bin/env python3
"""Generate the H200 fake-NVML scenarios (h200x1.json, h200x2.json, h200x8.json,
h200x2-mig.json) and one per other GPU generation and driver branch (a100x2-r535.json,
l40sx2-r550.json, h100x2-r550.json, gh200x1-r570.json, b200x2-r570.json, gb200x2-r580.json: see
"other generations" below) in exporter/common/scenarios/.

They ship inside the package (so ``--nvml-backend fake:h200x2`` works after any install and in the
image); the files next to this script are links to them, kept for paths in older notes.

Standard library only and deterministic: running it twice gives byte-identical files.

    python3 examples/scenarios/generate.py           # (re)write the JSON files
    python3 examples/scenarios/generate.py --check   # validate shape and fail if a file is stale

Format: docs/scenarios.md. Every number below was measured on H200 SXM GPUs (driver 580.159.04,
NVML 13.580.159.04, nvidia-ml-py 13.610/13.615), unless a comment says "synthetic". The raw probe
output is not part of this repository; the comments name the runs: "probe 1gpu" (one H200 without
NVLink peers) and "probe 2gpu" (the NVLink-connected pair) with their ``nvidia-smi -q`` and
``nvidia-smi topo -m``, and the runs of 2026-11-30 on the pair, "fields" (NVLink error counters
and field values), "misc" / "misc-load" (power scopes, clock-event durations, fabric; idle and
under a bf16 matmul) and "gpm" / "gpm-load" (GPM metrics, idle and under the matmul).

Load model (all per-GPU cycles share PHASE_S and four phases, so they stay in step):
  phase 0  idle                 (t mod 20 in [0, 5))   the measured idle values
  phase 1  loaded, boosting     ([5, 10))              SM 1980 MHz (max), below the power cap
  phase 2  loaded, power-capped ([10, 15))             measured load: util 94/22, 693 W, SwPowerCap
  phase 3  idle, cooling down   ([15, 20))             idle clocks, still-warm temperatures
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent.parent / "exporter" / "common" / "scenarios"  # package data: selectable by name
PHASE_S = 5

# --- system-wide, probes 1gpu and 2gpu "driver", "nvml_version", "cuda_driver" -----------------------
DRIVER_VERSION = "580.159.04"
NVML_VERSION = "13.580.159.04"
CUDA_DRIVER_VERSION = 13000

# --- per-GPU constants shared by all H200s (identical in both probes) -----------------------------
NAME = "NVIDIA H200"
ARCHITECTURE = 9  # NVML_DEVICE_ARCH_HOPPER
MEM_TOTAL = 150_754_820_096  # mem_v2[0]
MEM_RESERVED = 644_939_776  # mem_v2[3] (= v1 used when v2 used is 0)
MEM_USED_LOAD_MEASURED = 1_059_913_728  # probe 1gpu: v2 used under load (bf16 matmul)
MEM_USED_LOAD_TRAINING = 128 * 1024**3  # synthetic: a training footprint for h200x2/x8 (see below)
BAR1_TOTAL = 274_877_906_944  # bar1[0], 256 GiB
BAR1_USED = 1_703_936  # bar1[1]
POWER_LIMIT_MW = 700_000  # power_limit_mw
POWER_BOOST_MW = 652_000  # synthetic: loaded but below the 700 W cap (reasons 0)
POWER_CAPPED_MW = 693_000  # probe 1gpu under load: reasons 0x4 (SwPowerCap) at 693 W of 700 W
UTIL_LOAD = (94, 22)  # probe 1gpu: utilization under load 94/22
CLOCK_SM_MAX = 1980  # clock_sm_max; nvidia-smi Max Clocks Graphics/SM 1980
CLOCK_SM_CAPPED = 1515  # probe 1gpu: SM 345 MHz idle, 1515 loaded
CLOCK_MEM = 3201  # clock_mem; nvidia-smi Clocks/Max Clocks Memory 3201
CLOCK_VIDEO = 765  # nvidia-smi Clocks Video 765 (load value not measured)
CLOCK_VIDEO_MAX = 1545  # nvidia-smi Max Clocks Video 1545
# nvmlDeviceGetTemperatureThreshold (docs/capabilities.md, measured on H200 / 580.159.04): shutdown 95,
# slowdown 89, GPU max 87 C; the memory maximum (type 2) was not measured: 95 C is synthetic.
TEMPERATURE_THRESHOLDS = {0: 95, 1: 89, 2: 95, 3: 87}
MARGIN_IDLE = 50  # nvmlDeviceGetMarginTemperature on the idle H200, measured; loaded values follow the temperature
REASON_IDLE = 0x1  # clocks_event_reasons idle = 1
REASON_SW_POWER_CAP = 0x4  # probe 1gpu under load
SUPPORTED_EVENT_TYPES = 0xFF9F  # supported_event_types 65439
UINT_MAX = 0xFFFFFFFF  # scopeId "sum over links"; gi/ci ids with MIG off
NVLINK_LINKS = 18  # field 91 = 18, nvlink_states 0..17 = 1, topology NV18
NVLINK_MAX_LINKS = 36  # nvidia-ml-py 13.610 NVML_NVLINK_MAX_LINKS (18 up to 13.595):
# the 1-GPU probe got NotSupported for all 36 link indices
PROCESS_MEASURED = {  # probe 1gpu: the compute process under load
    "pid": 494,
    "usedGpuMemory": 1_050_673_152,
    "gpuInstanceId": UINT_MAX,
    "computeInstanceId": UINT_MAX,
}

NOT_SUPPORTED = {"error": "NOT_SUPPORTED"}

# --- NVLink error counters, run fields, 2026-11-30 --------------
# nvmlDeviceGetNvLinkErrorCounter per link on the idle, healthy pair: replay, recovery and flit CRC
# 0 on every link; data CRC (counter 3) non-zero on every link (counts since the driver loaded).
# Fields 161-163 (DL replay, recovery, CRC) per link: 0, the same as the per-call counters.
NVLINK_CRC_DATA = (
    (73, 66, 41, 72, 57, 40, 181, 174, 96, 162, 106, 67, 39, 58, 57, 60, 128, 74),  # GPU 0
    (104, 142, 25, 43, 53, 82, 46, 49, 155, 375, 152, 314, 64, 33, 74, 169, 244, 99),  # GPU 1
)
NVLINK_DL_FIELDS = (161, 162, 163)

# --- power scope, throttle time, fabric, GPM (runs of 2026-11-30) -----
MEMORY_POWER_IDLE_MW = (38_874, 40_551)  # run misc: field 185 scope 2 (memory), GPU 0 / GPU 1
MEMORY_POWER_LOAD_MW = (144_008, 138_113)  # run misc-load, same field under the matmul load
MEMORY_POWER_BOOST_MW = 141_000  # synthetic: loaded, below the cap (not measured)
# Clock-event-reason durations (fields 74-81, 269-271; ns since driver load). The counters grow
# only while their reason holds in the load model's phases (integral value specs), from the idle
# values measured in run misc (GPU 0): low utilization 21.9 s, below app/base clocks 12.6 s.
LOW_UTILIZATION_NS = 21_898_577_760
BELOW_APP_CLOCKS_NS = 12_573_121_088
BELOW_BASE_CLOCKS_NS = 12_573_944_800
FABRIC_COMPLETED = {"state": 3, "status": 0, "cliqueId": 0, "healthMask": 0, "healthSummary": 0}  # run misc v3
# GPM metric values in percent / MiB/s per phase (idle, boosting, capped, cooling): run gpm (idle)
# and run gpm-load (bf16 matmul on both GPUs, GPU 0): graphics 93.6, SM 89.8, occupancy 16.2,
# any tensor 82.7 = HMMA, DRAM bandwidth 21.2, FP32 0, PCIe TX 6.5 / RX 18.8 MiB/s; idle all 0
# except DRAM 0.0004 and PCIe 0.2 / 0.07 MiB/s. IMMA, DMMA, DFMA, FP64, FP16 were not measured:
# 0 (synthetic; a bf16 matmul does not use them).
GPM_LOADED = {1: 93.6, 2: 89.8, 3: 16.2, 5: 82.7, 7: 82.7, 10: 21.2, 20: 6.5, 21: 18.8}
GPM_IDLE = {10: 0.0004, 20: 0.2, 21: 0.07}
GPM_ACTIVITY_IDS = (1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 20, 21)

# --- other process lists and per-process utilization ------------------------------------------
# graphics_procs [] was measured (probe 1gpu); the MPS list is a Volta+ call that was not
# probed: with no MPS daemon running it is empty (synthetic). process_util answered NotFound on the
# idle GPU (measured: "no samples newer than the timestamp"). While loaded, the one process of
# h200x1 is the whole load, so its samples carry the measured device utilization 94/22 (derived).
NO_SAMPLES = {"error": "NOT_FOUND"}


def process_lists(procs):
    """The graphics and MPS lists (empty) next to the compute list ``procs``."""
    values = {}
    for kind in ("Graphics", "MPSCompute"):
        for suffix in ("_v3", "_v2"):
            values[f"nvmlDeviceGet{kind}RunningProcesses{suffix}"] = []
    return values


def process_utilization(processes_loaded):
    """NOT_FOUND while idle; one sample per loaded process at the measured load utilization."""
    if not processes_loaded:
        return NO_SAMPLES
    loaded = [
        {"pid": p["pid"], "smUtil": UTIL_LOAD[0], "memUtil": UTIL_LOAD[1], "encUtil": 0, "decUtil": 0}
        for p in processes_loaded
    ]
    return cycle(NO_SAMPLES, loaded, loaded, NO_SAMPLES)


def cycle(*values):
    return {"cycle": list(values), "step_s": PHASE_S}


def memory_info(used):
    return {
        "total": MEM_TOTAL,
        "reserved": MEM_RESERVED,
        "free": MEM_TOTAL - MEM_RESERVED - used,
        "used": used,
    }


VBIOS_VERSION = "96.00.A5.00.1A"  # nvidia-smi -q of the 1-GPU H200: "VBIOS Version"
INFOROM_IMAGE_VERSION = "G520.0282.02.02"  # ... "Inforom Version / Image Version"


def gpu(
    ident,
    *,
    temp_idle,
    mem_temp_idle,
    power_idle_mw,
    sm_idle,
    energy_mj,
    pcie_replay,
    mem_used_load,
    processes_loaded,
    nvlink_tx_kib_s=None,
    nvlink_rx_kib_s=None,
    crc_data=NVLINK_CRC_DATA[0],
    mem_power=(MEMORY_POWER_IDLE_MW[0], MEMORY_POWER_LOAD_MW[0]),
    fabric=None,
):
    """One H200. nvlink_tx_kib_s None = no NVLink (as in the single-GPU probe: NotSupported)."""
    power = [power_idle_mw, POWER_BOOST_MW, POWER_CAPPED_MW, power_idle_mw + 8_000]
    # energy counter: a ramp at the mean power of one load cycle (mW = mJ/s)
    energy_per_s = sum(power) // len(power)
    sm = cycle(sm_idle, CLOCK_SM_MAX, CLOCK_SM_CAPPED, sm_idle)  # graphics == SM on H200
    procs = cycle([], processes_loaded, processes_loaded, []) if processes_loaded else []
    values = {
        "nvmlDeviceGetUtilizationRates": cycle(
            {"gpu": 0, "memory": 0},
            {"gpu": UTIL_LOAD[0], "memory": UTIL_LOAD[1]},
            {"gpu": UTIL_LOAD[0], "memory": UTIL_LOAD[1]},
            {"gpu": 0, "memory": 0},
        ),
        "nvmlDeviceGetEncoderUtilization": [0, 100_000],
        "nvmlDeviceGetDecoderUtilization": [0, 100_000],
        "nvmlDeviceGetMemoryInfo": cycle(
            memory_info(0), memory_info(mem_used_load), memory_info(mem_used_load), memory_info(0)
        ),
        "nvmlDeviceGetBAR1MemoryInfo": {
            "bar1Total": BAR1_TOTAL,
            "bar1Free": BAR1_TOTAL - BAR1_USED,
            "bar1Used": BAR1_USED,
        },
        "nvmlDeviceGetPowerUsage": cycle(*power),
        "nvmlDeviceGetEnforcedPowerLimit": POWER_LIMIT_MW,
        "nvmlDeviceGetTotalEnergyConsumption": {"ramp": energy_mj, "per_s": energy_per_s},
        "nvmlDeviceGetTemperatureV:0": cycle(temp_idle, temp_idle + 18, temp_idle + 27, temp_idle + 10),
        "nvmlDeviceGetTemperature:0": cycle(temp_idle, temp_idle + 18, temp_idle + 27, temp_idle + 10),
        **{f"nvmlDeviceGetTemperatureThreshold:{t}": c for t, c in TEMPERATURE_THRESHOLDS.items()},
        "nvmlDeviceGetMarginTemperature": cycle(MARGIN_IDLE, MARGIN_IDLE - 18, MARGIN_IDLE - 27, MARGIN_IDLE - 10),
        "nvmlDeviceGetNumFans": NOT_SUPPORTED,
        "nvmlDeviceGetFanSpeed": NOT_SUPPORTED,
        "nvmlDeviceGetFanSpeed_v2": NOT_SUPPORTED,
        "nvmlDeviceGetClockInfo:0": sm,
        "nvmlDeviceGetClockInfo:1": sm,
        "nvmlDeviceGetClockInfo:2": CLOCK_MEM,
        "nvmlDeviceGetClockInfo:3": CLOCK_VIDEO,
        "nvmlDeviceGetMaxClockInfo:0": CLOCK_SM_MAX,
        "nvmlDeviceGetMaxClockInfo:1": CLOCK_SM_MAX,
        "nvmlDeviceGetMaxClockInfo:2": CLOCK_MEM,
        "nvmlDeviceGetMaxClockInfo:3": CLOCK_VIDEO_MAX,
        "nvmlDeviceGetPerformanceState": 0,
        "nvmlDeviceGetCurrentClocksEventReasons": cycle(REASON_IDLE, 0, REASON_SW_POWER_CAP, REASON_IDLE),
        "nvmlDeviceGetCurrPcieLinkGeneration": 5,
        "nvmlDeviceGetMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 16,
        "nvmlDeviceGetMaxPcieLinkWidth": 16,
        "nvmlDeviceGetPcieReplayCounter": pcie_replay,
        "nvmlDeviceGetEccMode": [1, 1],
        "nvmlDeviceGetTotalEccErrors:0,0": 0,
        "nvmlDeviceGetTotalEccErrors:0,1": 0,
        "nvmlDeviceGetTotalEccErrors:1,0": 0,
        "nvmlDeviceGetTotalEccErrors:1,1": 0,
        "nvmlDeviceGetRetiredPages": NOT_SUPPORTED,
        "nvmlDeviceGetRetiredPages_v2": NOT_SUPPORTED,
        "nvmlDeviceGetRetiredPagesPendingStatus": NOT_SUPPORTED,
        "nvmlDeviceGetRemappedRows": [0, 0, 0, 0],
        "nvmlDeviceGetVbiosVersion": VBIOS_VERSION,
        "nvmlDeviceGetInforomImageVersion": INFOROM_IMAGE_VERSION,
    }
    fields = {"82": cycle(mem_temp_idle, mem_temp_idle + 4, mem_temp_idle + 8, mem_temp_idle + 5)}
    if nvlink_tx_kib_s is None:
        values["nvmlDeviceGetNvLinkState"] = NOT_SUPPORTED
        values["nvmlDeviceGetNvLinkErrorCounter"] = NOT_SUPPORTED
        fields["91"] = NOT_SUPPORTED
    else:
        for link in range(NVLINK_LINKS):
            values[f"nvmlDeviceGetNvLinkState:{link}"] = 1
        # one fallback key: every link (< nvlink_link_count) and counter answers 0, but data CRC
        values["nvmlDeviceGetNvLinkErrorCounter"] = 0
        for link, count in enumerate(crc_data):
            values[f"nvmlDeviceGetNvLinkErrorCounter:{link},3"] = count
        for fid in NVLINK_DL_FIELDS:
            for link in range(NVLINK_LINKS):
                fields[f"{fid}:{link}"] = 0
        fields["91"] = NVLINK_LINKS
        for link in range(NVLINK_LINKS):
            fields[f"138:{link}"] = {"ramp": 0, "per_s": nvlink_tx_kib_s}
        fields[f"138:{UINT_MAX}"] = {"ramp": 0, "per_s": nvlink_tx_kib_s * NVLINK_LINKS}
        for link in range(NVLINK_LINKS):
            fields[f"139:{link}"] = {"ramp": 0, "per_s": nvlink_rx_kib_s}
        fields[f"139:{UINT_MAX}"] = {"ramp": 0, "per_s": nvlink_rx_kib_s * NVLINK_LINKS}
    fields["230"] = 0
    issue14(values, fields, power, mem_power, nvlink_tx_kib_s, nvlink_rx_kib_s, fabric)
    values["nvmlDeviceGetComputeRunningProcesses_v3"] = procs
    values["nvmlDeviceGetComputeRunningProcesses_v2"] = procs
    values["nvmlDeviceGetComputeRunningProcesses"] = procs
    values.update(process_lists(procs))
    values["nvmlDeviceGetProcessUtilization"] = process_utilization(processes_loaded)
    values["nvmlDeviceGetSupportedEventTypes"] = SUPPORTED_EVENT_TYPES
    out = {"name": NAME, **ident, "architecture": ARCHITECTURE}
    out["values"] = values
    out["fields"] = fields
    out["default_field_error"] = "NOT_SUPPORTED"
    # without NVLink, indices up to the binding's bound answer NotSupported (measured), not
    # INVALID_ARGUMENT, so the fake's per-link bound is 36 there
    out["nvlink_link_count"] = NVLINK_MAX_LINKS if nvlink_tx_kib_s is None else NVLINK_LINKS
    return out


def issue14(values, fields, power, mem_power, nvlink_tx_kib_s, nvlink_rx_kib_s, fabric):
    """Power by scope, clock-event-reason durations, fabric state and GPM for one H200."""
    mem_idle, mem_load = mem_power
    # power fields 185 (1 s average) by scope: GPU (= nvmlDeviceGetPowerUsage), memory; the module
    # scope answers NOT_SUPPORTED on x86 (unlisted fields answer default_field_error)
    fields["185:0"] = cycle(*power)
    fields["185:2"] = cycle(mem_idle, MEMORY_POWER_BOOST_MW, mem_load, mem_idle + 1_000)

    # throttle time, in step with nvmlDeviceGetCurrentClocksEventReasons' cycle above
    def held(*phases, start=0):
        spec = {"integral": {"cycle": list(phases), "step_s": PHASE_S}, "scale": 1_000_000_000}
        return {**spec, "initial": start} if start else spec

    fields["74"] = held(0, 0, 1, 0)  # SW power cap: the capped phase
    fields["78"] = held(1, 0, 0, 1, start=LOW_UTILIZATION_NS)  # low utilization: the idle phases
    fields["80"] = held(1, 0, 1, 1, start=BELOW_APP_CLOCKS_NS)  # below application clocks
    fields["81"] = held(1, 0, 1, 1, start=BELOW_BASE_CLOCKS_NS)  # below base clocks
    for fid in ("75", "76", "77", "79", "269", "270", "271"):  # thermal, sync boost, board limit,
        fields[fid] = 0  # reliability, SW/HW thermal, HW power brake: 0 in both measurements
    values["nvmlDeviceGetGpuFabricInfoV"] = fabric if fabric is not None else NOT_SUPPORTED
    values["nvmlDeviceGetMigMode"] = [0, 0]  # probes 1gpu and 2gpu: mig_mode [0, 0]
    values["nvmlGpmQueryDeviceSupport"] = {"isSupportedDevice": 1}  # run gpm: supported 1
    for mid in GPM_ACTIVITY_IDS:
        idle = GPM_IDLE.get(mid, 0.0)
        loaded = GPM_LOADED.get(mid, 0.0)
        values[f"nvmlGpmMetricsGet:{mid}"] = cycle(idle, loaded, loaded, idle)
    if nvlink_tx_kib_s is None:  # no NVLink: synthetic NOT_SUPPORTED (not measured on one GPU)
        values["nvmlGpmMetricsGet:60"] = NOT_SUPPORTED
        values["nvmlGpmMetricsGet:61"] = NOT_SUPPORTED
    else:  # NVLink total RX / TX in MiB/s, equal to the field 138/139 ramps (18 links, KiB/s)
        values["nvmlGpmMetricsGet:60"] = nvlink_rx_kib_s * NVLINK_LINKS / 1024
        values["nvmlGpmMetricsGet:61"] = nvlink_tx_kib_s * NVLINK_LINKS / 1024


# Confidential computing: not probed on the H200 (nvidia-smi -q: "Conf Compute Protected Memory Usage"
# 0 MiB, CC off); the system state is synthetic: no CC environment, the feature and devtools off.
CC_OFF = {"environment": 0, "ccFeature": 0, "devToolsMode": 0}


def scenario(description, gpus):
    return {
        "description": description,
        "driver_version": DRIVER_VERSION,
        "nvml_version": NVML_VERSION,
        "cuda_driver_version": CUDA_DRIVER_VERSION,
        "missing_functions": [],
        "system_values": {"nvmlSystemGetConfComputeState": CC_OFF},
        "gpus": gpus,
        "faults": [],
        "events": [],
    }


COMMON_DESC = (
    " Driver 580.159.04 / NVML 13.580.159.04 / CUDA 13000 and all static values (name, arch 9,"
    " memory total 150754820096 B / reserved 644939776 B, BAR1 256 GiB with 1703936 B used,"
    " power limit 700000 mW, PCIe gen 5 x16, ECC [1,1] with 0 errors, remapped rows (0,0,0,0),"
    " enc/dec [0,100000], P0, max clocks 1980/1980/3201/1545 MHz, supported event types 0xff9f,"
    " fan and retired pages NOT_SUPPORTED) from probes 1gpu and 2gpu and"
    " nvidia-smi -q (VBIOS 96.00.A5.00.1A, InfoROM image G520.0282.02.02: the 1-GPU H200's);"
    " field 230 (recovery action) 0 and field 82 (HBM temperature) as"
    " measured. Values cycle every 5 s through 4 phases (20 s period): idle"
    " (measured idle values, clock-event reasons 0x1) -> loaded boosting (util 94/22, SM/graphics"
    " 1980 MHz, 652 W, reasons 0; the 652 W is synthetic) -> loaded power-capped (util 94/22,"
    " SM/graphics 1515 MHz, 693 W, reasons 0x4 SwPowerCap, as measured under load in"
    " probe 1gpu) -> idle cooling; GPU temperature idle/+18/+27/+10 C, HBM"
    " idle/+4/+8/+5 C (temperatures under load are synthetic); temperature thresholds shutdown 95,"
    " slowdown 89, GPU max 87 C as measured (memory max 95 C synthetic), margin temperature 50 idle"
    " as measured, following the GPU temperature under load (synthetic). Energy is a ramp from the measured"
    " counter at the cycle's mean power (mW = mJ/s). Memory/video clocks stay at 3201/765 MHz."
    " Events register OK, none are delivered."
    " Runs of 2026-11-30: memory power (field 185 scope 2) idle"
    " 38874/40551 mW and 144008/138113 mW capped as measured (141000 mW boosting is synthetic),"
    " module scope NOT_SUPPORTED; clock-event-reason durations (fields 74-81, 269-271, ns) grow"
    " only in the phases whose reason bit is set (SW power cap while capped, low utilization while"
    " idle, below app/base clocks in all but the boosting phase) from the idle values of run misc;"
    " MIG mode [0, 0]; GPM supported, metric values per phase from run gpm (idle) and"
    " run gpm-load (loaded: graphics 93.6 %, SM 89.8 %, occupancy 16.2 %, tensor and HMMA 82.7 %,"
    " DRAM bandwidth 21.2 %, PCIe TX 6.5 / RX 18.8 MiB/s; IMMA, DMMA, DFMA, FP64, FP32, FP16 0);"
    " GPM NVLink rates equal the field 138/139 ramps. Confidential computing off (system state"
    " environment 0, ccFeature 0: synthetic, not probed; nvidia-smi -q shows 0 MiB protected memory);"
    " NVLink-C2C absent (fields 170-172 NOT_SUPPORTED: nvidia-smi -q 'GPU C2C Mode: Disabled')."
    " Graphics process lists are empty (measured); MPS"
    " lists empty (not probed: no MPS daemon); per-process utilization answers NOT_FOUND while"
    " idle (measured) and, where a process runs, 94/22 % for it while loaded (the device's"
    " measured load, derived). Generated by examples/scenarios/generate.py."
)


def h200x1():
    desc = (
        "One H200 SXM without NVLink peers, as measured in"
        " probe 1gpu"
        " (UUID GPU-820f4b2d-da15-c9b7-3ba6-c396976ca722, serial 1653724067064,"
        " PCI 00000000:00:06.0, minor 0; idle 35 C GPU / 34 C HBM, 77886 mW,"
        " SM 345 MHz, energy 2461760 mJ, PCIe replay counter 4). Every NVLink call and field"
        " answers NOT_SUPPORTED, as measured on this single GPU (nvlink_states: NotSupported for"
        " all 36 indices, so nvlink_link_count is 36 = NVML_NVLINK_MAX_LINKS of nvidia-ml-py"
        " 13.610, the bound past which real NVML answers INVALID_ARGUMENT; field 91"
        " NotSupported). While loaded (phases 1-2) one compute process runs: pid 494,"
        " 1050673152 B, gi/ci 4294967295, and v2 memory used is"
        " 1059913728 B, both as measured under a bf16 matmul load."
        " No NVLink fabric: nvmlDeviceGetGpuFabricInfoV NOT_SUPPORTED (nvidia-smi -q: Fabric"
        " State N/A); GPM NVLink metrics NOT_SUPPORTED (synthetic)." + COMMON_DESC
    )
    g = gpu(
        {
            "uuid": "GPU-820f4b2d-da15-c9b7-3ba6-c396976ca722",
            "serial": "1653724067064",
            "pci_bus_id": "00000000:00:06.0",
            "minor_number": 0,
        },
        temp_idle=35,
        mem_temp_idle=34,
        power_idle_mw=77_886,
        sm_idle=345,
        energy_mj=2_461_760,
        pcie_replay=4,
        mem_used_load=MEM_USED_LOAD_MEASURED,
        processes_loaded=[PROCESS_MEASURED],
    )
    return scenario(desc, [g])


NVLINK_DESC = (
    " 18 NVLink4 links per GPU, all up (nvlink_link_count 18, nvmlDeviceGetNvLinkState 1 for"
    " links 0-17, field 91 = 18: probe 2gpu, nvidia-smi topo -m: NV18); NVLink"
    " error counters as measured on the idle pair (run fields, 2026-11-30): replay, recovery and flit"
    " CRC 0, data CRC 25-375 per link (GPU 0's counts for even GPUs, GPU 1's for odd ones), fields"
    " 161-163 per link 0. Fields 138/139 (NVLink data TX/RX, cumulative KiB) are"
    " ramps from the measured 0 per link (scopeId 0-17) plus the all-links sum (scopeId"
    " 4294967295 = 18 x per link)."
)


def h200x2():
    desc = (
        "Two NVLink-connected H200 SXM (README demo scenario), identities as measured in"
        " probe 2gpu:"
        " GPU 0 GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6, serial 1654524012390,"
        " PCI 00000000:00:06.0 (idle 34 C / HBM 37 C, 85337 mW, SM 390 MHz,"
        " energy 2445309 mJ); GPU 1 GPU-094221fd-19f9-1561-7ef8-949bb0d57826, serial 1654524012455,"
        " PCI 00000000:00:07.0 (idle 35 C / HBM 37 C, 76813 mW, SM 345 MHz, energy 2517241 mJ);"
        " PCIe replay counters 0."
        + NVLINK_DESC
        + " Traffic: GPU 0 TX = GPU 1 RX = 1000 KiB/s per link; GPU 1 TX = GPU 0 RX = 250 KiB/s per"
        " link (asymmetric on purpose, so a TX/RX mix-up shows; the rates are synthetic)."
        " No compute processes are listed (an exporter without hostPID sees none:"
        " drivers translate pids into the caller's PID namespace); v2 memory used while loaded is a"
        " synthetic 128 GiB training footprint, so utilization without"
        " processes does not also look like a stuck context. Fabric: state 3 (completed), status 0,"
        " as measured on this pair (run misc)." + COMMON_DESC
    )
    g0 = gpu(
        {
            "uuid": "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6",
            "serial": "1654524012390",
            "pci_bus_id": "00000000:00:06.0",
            "minor_number": 0,
        },
        temp_idle=34,
        mem_temp_idle=37,
        power_idle_mw=85_337,
        sm_idle=390,
        energy_mj=2_445_309,
        pcie_replay=0,
        mem_used_load=MEM_USED_LOAD_TRAINING,
        processes_loaded=[],
        nvlink_tx_kib_s=1000,
        nvlink_rx_kib_s=250,
        fabric=FABRIC_COMPLETED,
    )
    g1 = gpu(
        {
            "uuid": "GPU-094221fd-19f9-1561-7ef8-949bb0d57826",
            "serial": "1654524012455",
            "pci_bus_id": "00000000:00:07.0",
            "minor_number": 1,
        },
        temp_idle=35,
        mem_temp_idle=37,
        power_idle_mw=76_813,
        sm_idle=345,
        energy_mj=2_517_241,
        pcie_replay=0,
        mem_used_load=MEM_USED_LOAD_TRAINING,
        processes_loaded=[],
        nvlink_tx_kib_s=250,
        nvlink_rx_kib_s=1000,
        crc_data=NVLINK_CRC_DATA[1],
        mem_power=(MEMORY_POWER_IDLE_MW[1], MEMORY_POWER_LOAD_MW[1]),
        fabric=FABRIC_COMPLETED,
    )
    return scenario(desc, [g0, g1])


X8_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]  # HGX 8-GPU style bus numbers
X8_IDLE = [  # (GPU C, HBM C, idle mW, idle SM MHz): spread over the measured idle values
    (34, 37, 85_337, 390),
    (35, 37, 76_813, 345),
    (35, 34, 77_886, 345),
    (34, 36, 80_112, 345),
    (36, 38, 82_451, 390),
    (35, 36, 78_940, 345),
    (34, 35, 79_604, 345),
    (36, 37, 84_018, 390),
]


def synthetic_uuid(i):
    h = hashlib.sha256(f"nvgpu-exporter synthetic H200 {i}".encode()).hexdigest()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def h200x8():
    gpus = []
    for i, (bus, (temp, hbm, p_idle, sm_idle)) in enumerate(zip(X8_BUSES, X8_IDLE, strict=True)):
        gpus.append(
            gpu(
                {
                    "uuid": synthetic_uuid(i),
                    "serial": str(1654524013000 + 17 * i),
                    "pci_bus_id": f"00000000:{bus}:00.0",
                    "minor_number": i,
                },
                temp_idle=temp,
                mem_temp_idle=hbm,
                power_idle_mw=p_idle,
                sm_idle=sm_idle,
                energy_mj=2_445_309 + 23_981 * i,
                pcie_replay=0,
                mem_used_load=MEM_USED_LOAD_TRAINING,
                processes_loaded=[],
                # all-reduce style: each GPU sends and receives the same through the NVSwitches
                nvlink_tx_kib_s=1000,
                nvlink_rx_kib_s=1000,
                crc_data=NVLINK_CRC_DATA[i % 2],
                mem_power=(MEMORY_POWER_IDLE_MW[i % 2], MEMORY_POWER_LOAD_MW[i % 2]),
                fabric=FABRIC_COMPLETED,  # synthetic: an NVSwitch board whose Fabric Manager finished
            )
        )
    uuids = ", ".join(g["uuid"] for g in gpus)
    desc = (
        "Eight H200 SXM (HGX-style node; used by the benchmark). SYNTHETIC identities: UUIDs"
        f" ({uuids}) are sha256-derived, serials 1654524013000 + 17*i and PCI bus ids"
        " 00000000:{18,2A,3A,5D,9A,AB,BA,DB}:00.0 are invented in the form NVML reports them;"
        " minor numbers 0-7. Idle temperature/power/SM clock per GPU are spread over the idle"
        " values measured in probe 1gpu and"
        " probe 2gpu (34-36 C, 76813-85337 mW, SM 345/390 MHz); energy ramps"
        " start near the measured 2445309 mJ."
        + NVLINK_DESC
        + " Traffic: TX = RX = 1000 KiB/s per link on every GPU (synthetic). No compute processes"
        " are listed; v2 memory used while loaded is a synthetic 128 GiB training footprint."
        " Fabric: state 3 (completed), status 0 on every GPU (synthetic: an NVSwitch board whose"
        " Fabric Manager finished)." + COMMON_DESC
    )
    return scenario(desc, gpus)


# --- MIG (h200x2-mig.json) ---------------------------------------------------------------------------
# GPU instance profiles of the H200 141GB (NVIDIA MIG user guide, "Supported MIG Profiles": names
# and which profiles exist) with the profile ids and NVML_GPU_INSTANCE_PROFILE_* indices NVML gives
# the same profiles on A100/H100 (nvidia-smi mig -lgip: 1g 19, 1g+me 20, 1g double memory 15,
# 2g 14, 3g 9, 4g 5, 7g 0). SYNTHETIC: no H200 was put in MIG mode (never change MIG mode
# on the lab machines), so the ids are unverified on H200 and memorySizeMB is the measured total
# (150754820096 B = 143772 MiB) split by memory slices (1/8, 2/8, 4/8, 8/8), rounded down to 256 MiB.
MIG_PROFILES = {
    "19": {"name": "MIG 1g.18gb", "index": 0, "sliceCount": 1, "memorySizeMB": 17920},
    "14": {"name": "MIG 2g.35gb", "index": 1, "sliceCount": 2, "memorySizeMB": 35840},
    "9": {"name": "MIG 3g.71gb", "index": 2, "sliceCount": 3, "memorySizeMB": 71680},
    "5": {"name": "MIG 4g.71gb", "index": 3, "sliceCount": 4, "memorySizeMB": 71680},
    "0": {"name": "MIG 7g.141gb", "index": 4, "sliceCount": 7, "memorySizeMB": 143360},
    "20": {"name": "MIG 1g.18gb+me", "index": 7, "sliceCount": 1, "memorySizeMB": 17920},
    "15": {"name": "MIG 1g.35gb", "index": 9, "sliceCount": 1, "memorySizeMB": 35840},
}
MIB = 1 << 20


def mig_uuid(gpu_index, gi, ci):
    """A MIG device UUID in NVML's R470+ form (``MIG-`` + a UUID); SYNTHETIC (sha256-derived)."""
    h = hashlib.sha256(f"nvgpu-exporter synthetic MIG {gpu_index}/{gi}/{ci}".encode()).hexdigest()
    return f"MIG-{h[0:8]}-{h[8:12]}-5{h[13:16]}-{h[16:20]}-{h[20:32]}"


def mig_instance(gi, ci, profile_id, start, *, used, gpm, procs=()):
    """One MIG device of GPU 0: memory of its GPU instance (``used`` per phase), GPM per phase
    (metric id -> values), compute processes (pid, bytes) while loaded."""
    total = MIG_PROFILES[str(profile_id)]["memorySizeMB"] * MIB
    reserved = 64 * MIB  # synthetic: the driver's share inside the GPU instance
    records = [{"pid": pid, "usedGpuMemory": mem, "gpuInstanceId": gi, "computeInstanceId": ci} for pid, mem in procs]
    values = {
        "nvmlDeviceGetMemoryInfo": cycle(
            *({"total": total, "reserved": reserved, "free": total - reserved - u, "used": u} for u in used)
        ),
        "nvmlDeviceGetComputeRunningProcesses_v3": cycle([], records, records, []) if records else [],
        "nvmlDeviceGetComputeRunningProcesses_v2": cycle([], records, records, []) if records else [],
    }
    values.update({f"nvmlGpmMetricsGet:{m}": cycle(*v) for m, v in gpm.items()})
    size = {9: 4, 14: 2, 19: 1}[profile_id]
    return {
        "gpu_instance_id": gi,
        "compute_instance_id": ci,
        "profile_id": profile_id,
        "uuid": mig_uuid(0, gi, ci),
        "placement": {"start": start, "size": size},
        "values": values,
    }


def mig_gpm(idle, loaded):
    """GPM activity per phase (idle, boosting, capped, cooling) for the five activity metrics."""
    return {m: (idle.get(m, 0.0), loaded.get(m, 0.0), loaded.get(m, 0.0), idle.get(m, 0.0)) for m in (1, 2, 3, 5, 10)}


MIG_TRAINING = {1: 93.6, 2: 89.8, 3: 16.2, 5: 82.7, 10: 21.2}  # run gpm-load, the bf16 matmul (GPU 0)
MIG_INFERENCE = {1: 40.0, 2: 35.0, 3: 8.0, 5: 20.0, 10: 9.0}  # synthetic: a lighter load


def mig_gpu0(g0):
    """GPU 0 of h200x2 in MIG mode with mixed profiles (all synthetic, see MIG_PROFILES):
    GI 2 3g.71gb (one compute instance, a training process), GI 3 2g.35gb split into two compute
    instances (1c.2g.35gb each, one process each), GI 9 and GI 10 1g.18gb (GI 9 idle, GI 10 an
    inference process): 3 + 2 + 1 + 1 = 7 compute slices, placements 0-3, 4-5, 6, 7."""
    busy, idle_gpm = mig_gpm({}, MIG_TRAINING), mig_gpm({}, {})
    instances = [
        mig_instance(2, 0, 9, 0, used=(0, 38 << 30, 38 << 30, 0), gpm=busy, procs=[(3101, 38 << 30)]),
        mig_instance(
            3, 0, 14, 4, used=(0, 12 << 30, 12 << 30, 0), gpm=mig_gpm({}, MIG_INFERENCE), procs=[(3201, 5 << 30)]
        ),
        mig_instance(
            3, 1, 14, 4, used=(0, 12 << 30, 12 << 30, 0), gpm=mig_gpm({}, MIG_INFERENCE), procs=[(3202, 7 << 30)]
        ),
        mig_instance(9, 0, 19, 6, used=(0, 0, 0, 0), gpm=idle_gpm),
        mig_instance(
            10, 0, 19, 7, used=(2 << 30,) * 4, gpm=mig_gpm(MIG_INFERENCE, MIG_INFERENCE), procs=[(3301, 2 << 30)]
        ),
    ]
    for split in instances[1:3]:  # the MIG devices of a split GPU instance name their compute profile
        split["values"]["nvmlDeviceGetName"] = "NVIDIA H200 MIG 1c.2g.35gb"
    # GI 10's inference server runs in every phase: its process list is not a load-phase cycle
    instances[4]["values"]["nvmlDeviceGetComputeRunningProcesses_v3"] = instances[4]["values"][
        "nvmlDeviceGetComputeRunningProcesses_v2"
    ] = [{"pid": 3301, "usedGpuMemory": 2 << 30, "gpuInstanceId": 10, "computeInstanceId": 0}]
    values = g0["values"]
    del values["nvmlDeviceGetMigMode"]  # the mig object answers it
    for fn in (
        "nvmlDeviceGetUtilizationRates",  # "On MIG-enabled GPUs, querying device utilization rates is not
        "nvmlDeviceGetEncoderUtilization",  # currently supported" (NVML API reference); encoder and
        "nvmlDeviceGetDecoderUtilization",  # decoder as well (nvml.h)
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetRemappedRows",  # NOT_SUPPORTED "if MIG has active instances" (nvml.h)
    ):
        values[fn] = NOT_SUPPORTED
    # the parent's process lists: the aggregate over the instances, with their ids (privileged
    # callers, nvml.h), while loaded; GI 10's process always
    loaded = [
        r for inst in instances[:3] for r in inst["values"]["nvmlDeviceGetComputeRunningProcesses_v3"]["cycle"][1]
    ]
    always = instances[4]["values"]["nvmlDeviceGetComputeRunningProcesses_v3"]
    procs = cycle(always, loaded + always, loaded + always, always)
    for fn in (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses",
    ):
        values[fn] = procs
    g0["mig"] = {"mode": [1, 1], "max_devices": 7, "profiles": MIG_PROFILES, "layouts": [{"instances": instances}]}
    return g0


def h200x2_mig():
    doc = h200x2()
    doc["description"] = (
        "h200x2.json with GPU 0 in MIG mode (examples/scenarios/generate.py, mig_gpu0): mixed"
        " profiles, GI 2 3g.71gb (a training process, GPM as measured under the bf16 matmul in"
        " run gpm-load while loaded), GI 3 2g.35gb split into two compute instances, GI 9 and GI 10"
        " 1g.18gb (GI 9 idle, GI 10 an inference server in every phase). SYNTHETIC, not measured: no H200"
        " was put in MIG mode (the lab machines' MIG setting must stay as it is); profile names from"
        " NVIDIA's MIG user guide for the H200, profile ids as NVML gives them on A100/H100, memory"
        " sizes the measured total split by memory slices, MIG UUIDs sha256-derived, instance memory"
        " and processes invented. On GPU 0 utilization, encoder, decoder, per-process utilization and"
        " remapped rows answer NOT_SUPPORTED as NVML documents for MIG mode; its process lists are"
        " the aggregate of the instances (a privileged caller's view). GPU 1 is h200x2's GPU 1, MIG"
        " mode [0, 0]. The rest as h200x2.json: " + doc["description"]
    )
    doc["gpus"][0] = mig_gpu0(doc["gpus"][0])
    return doc


# --- other generations and driver branches (docs/capabilities.md, "Scenario recipes") -----------------
# None of these GPUs was measured here: every value comes from docs/capabilities.md (nvml.h of each
# branch, NVIDIA's documents, public reports; its JSON cites each) or, where no source gives one, is
# picked and says so in the scenario's description ("synthetic"). The load model, process lists and
# call shapes are the H200's (gpu() above), changed where the generation differs. The fake answers
# as a driver of the scenario's branch (driver_branch: exporter/common/scenarios/branches.py).

BRANCH_CUDA = {"R535": 12020, "R550": 12040, "R570": 12080, "R580": 13000, "R590": 13010}
EVENTS_WITHOUT_RECOVERY = SUPPORTED_EVENT_TYPES & ~0xC000  # no GpuUnavailable/GpuRecoveryAction (R570+)


def synthetic_identity(model, i, bus):
    """A UUID, serial and PCI bus id in NVML's forms for GPU ``i`` of ``model``: SYNTHETIC."""
    h = hashlib.sha256(f"nvgpu-exporter synthetic {model} {i}".encode()).hexdigest()
    return {
        "uuid": f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}",
        "serial": str(1_320_000_000_000 + int(h[32:40], 16) % 1_000_000_000),
        "pci_bus_id": f"00000000:{bus}:00.0",
        "minor_number": i,
    }


def domain_uuid(name):
    """A fabric cluster UUID (the NVLink domain), SYNTHETIC."""
    h = hashlib.sha256(f"nvgpu-exporter synthetic NVLink domain {name}".encode()).hexdigest()
    return f"{h[0:8]}-{h[8:12]}-4{h[13:16]}-8{h[17:20]}-{h[20:32]}"


def branch_scenario(description, branch, driver, gpus, *, system=None, events=()):
    major = 13 if branch in ("R580", "R590") else 12
    return {
        "description": description,
        "driver_version": driver,
        "nvml_version": f"{major}.{driver}",
        "cuda_driver_version": BRANCH_CUDA[branch],
        "driver_branch": branch,
        "missing_functions": [],
        "system_values": system if system is not None else {"nvmlSystemGetConfComputeState": CC_OFF},
        "gpus": gpus,
        "faults": [],
        "events": list(events),
    }


def base_gpu(ident, *, nvlink=True, idle_mw, power_limit_mw, energy_mj=1_000_000):
    """The H200 builder's GPU with another identity (values patched by each generation below)."""
    g = gpu(
        ident,
        temp_idle=34,
        mem_temp_idle=36,
        power_idle_mw=idle_mw,
        sm_idle=345,
        energy_mj=energy_mj,
        pcie_replay=0,
        mem_used_load=MEM_USED_LOAD_TRAINING,
        processes_loaded=[],
        nvlink_tx_kib_s=1000 if nvlink else None,
        nvlink_rx_kib_s=1000 if nvlink else None,
        fabric=None,
    )
    g["values"]["nvmlDeviceGetEnforcedPowerLimit"] = power_limit_mw
    return g


def set_memory(g, total, reserved, used_load):
    mem = [0, used_load, used_load, 0]
    g["values"]["nvmlDeviceGetMemoryInfo"] = cycle(
        *({"total": total, "reserved": reserved, "free": total - reserved - u, "used": u} for u in mem)
    )


def set_power(g, idle_mw, load_mw, memory_scope=True):
    """GPU power (1 s average, field 185 scope 0 too) idle / boosting / capped / cooling, energy at the mean."""
    power = [idle_mw, load_mw - 40_000, load_mw, idle_mw + 8_000]
    g["values"]["nvmlDeviceGetPowerUsage"] = cycle(*power)
    g["fields"]["185:0"] = cycle(*power)
    g["values"]["nvmlDeviceGetTotalEnergyConsumption"] = {"ramp": 1_000_000, "per_s": sum(power) // 4}
    if not memory_scope:
        g["fields"].pop("185:2", None)


def set_module_power(g, idle_mw, load_mw, limit_mw):
    """Grace module scope (185 and 190 with scope 1); the energy counter then counts the module."""
    module = [idle_mw, load_mw - 60_000, load_mw, idle_mw + 20_000]
    g["fields"]["185:1"] = cycle(*module)
    g["fields"]["190:1"] = limit_mw
    g["values"]["nvmlDeviceGetTotalEnergyConsumption"] = {"ramp": 2_000_000, "per_s": sum(module) // 4}


def set_temperatures(g, idle, thresholds, *, hbm=True, margin=True):
    """GPU temperature idle/+18/+27/+10; thresholds {type: C}; margin = slowdown - temperature (the
    H200's margin was 50 at 35 C idle with slowdown 89, a few degrees less than this: synthetic)."""
    temps = [idle, idle + 18, idle + 27, idle + 10]
    g["values"]["nvmlDeviceGetTemperatureV:0"] = cycle(*temps)
    g["values"]["nvmlDeviceGetTemperature:0"] = cycle(*temps)
    for t in range(4):
        g["values"].pop(f"nvmlDeviceGetTemperatureThreshold:{t}", None)
    for t, c in thresholds.items():
        g["values"][f"nvmlDeviceGetTemperatureThreshold:{t}"] = c
    if margin:
        g["values"]["nvmlDeviceGetMarginTemperature"] = cycle(*(thresholds[1] - 4 - c for c in temps))
    else:
        g["values"].pop("nvmlDeviceGetMarginTemperature", None)
    if hbm:
        g["fields"]["82"] = cycle(idle + 2, idle + 6, idle + 10, idle + 7)
    else:
        g["fields"]["82"] = NOT_SUPPORTED


def set_clocks(g, sm_idle, sm_max, mem):
    sm = cycle(sm_idle, sm_max, sm_max - 300, sm_idle)
    for c in (0, 1):
        g["values"][f"nvmlDeviceGetClockInfo:{c}"] = sm
        g["values"][f"nvmlDeviceGetMaxClockInfo:{c}"] = sm_max
    g["values"]["nvmlDeviceGetClockInfo:2"] = mem
    g["values"]["nvmlDeviceGetMaxClockInfo:2"] = mem


def no_gpm(g):
    """Pre-Hopper: nvmlGpmQueryDeviceSupport says not supported (isSupportedDevice 0)."""
    for key in [k for k in g["values"] if k.startswith("nvmlGpm")]:
        del g["values"][key]
    g["values"]["nvmlGpmQueryDeviceSupport"] = {"isSupportedDevice": 0}


def no_nvlink(g):
    for key in [k for k in g["values"] if k.startswith("nvmlDeviceGetNvLink")]:
        del g["values"][key]
    for key in [k for k in g["fields"] if k.split(":")[0] in ("91", "138", "139", "161", "162", "163")]:
        del g["fields"][key]
    g["values"]["nvmlDeviceGetNvLinkState"] = NOT_SUPPORTED
    g["values"]["nvmlDeviceGetNvLinkErrorCounter"] = NOT_SUPPORTED
    g["fields"]["91"] = NOT_SUPPORTED
    g["values"]["nvmlGpmMetricsGet:60"] = NOT_SUPPORTED
    g["values"]["nvmlGpmMetricsGet:61"] = NOT_SUPPORTED
    g["nvlink_link_count"] = NVLINK_MAX_LINKS


def set_nvlink_links(g, links):
    """Fewer links than the H200's 18 (A100: 12 NVLink3 links)."""
    for key in [k for k in g["values"] if k.startswith("nvmlDeviceGetNvLinkState:")]:
        if int(key.split(":")[1]) >= links:
            del g["values"][key]
    for key in list(g["fields"]):
        fid, _, scope = key.partition(":")
        if scope and scope != str(UINT_MAX) and int(scope) >= links:
            del g["fields"][key]
    for fid in ("138", "139"):
        per_link = g["fields"][f"{fid}:0"]
        g["fields"][f"{fid}:{UINT_MAX}"] = {"ramp": 0, "per_s": per_link["per_s"] * links}
    g["fields"]["91"] = links
    g["nvlink_link_count"] = links


def nvlink5(g, *, degrading_link=None, recovery_start=505):
    """NVLink5: 161-163 and the per-call counters NOT_SUPPORTED (documented for 161-163, "unsupported
    for Blackwell+"; no source for the per-call counter: NOT_SUPPORTED is the recipe's pick), 138/139
    NOT_SUPPORTED (no source either way: the recipe's choice, so the 202/204 byte counters serve), the
    NVML_FI_DEV_NVLINK_COUNT_* fields per link. ``degrading_link``: link recovery events growing from
    ``recovery_start`` by 3 in 21 minutes (the marin-community/marin#9086 report); symbol errors
    (corrected) a few per hour on every link; the rest 0 (synthetic)."""
    for key in [k for k in g["values"] if k.startswith("nvmlDeviceGetNvLinkErrorCounter")]:
        del g["values"][key]
    g["values"]["nvmlDeviceGetNvLinkErrorCounter"] = NOT_SUPPORTED
    for key in [k for k in g["fields"] if k.split(":")[0] in ("138", "139", "161", "162", "163")]:
        del g["fields"][key]
    for link in range(NVLINK_LINKS):
        for fid in (206, 207, 208, 209, 210, 211, 212, 214, 219):
            g["fields"][f"{fid}:{link}"] = 0
        if link == degrading_link:
            g["fields"][f"215:{link}"] = {"ramp": recovery_start, "per_s": 3 / (21 * 60)}
        else:
            g["fields"][f"215:{link}"] = 0
        g["fields"][f"221:{link}"] = {"ramp": 100 + 7 * link, "per_s": 0.001}
        g["fields"][f"202:{link}"] = {"ramp": 0, "per_s": 1000 * 1024}
        g["fields"][f"204:{link}"] = {"ramp": 0, "per_s": 1000 * 1024}


def set_c2c(g, links=1, errors=True):
    """NVLink-C2C to the Grace CPU: values unknown (no public measurement): SYNTHETIC; the error fields
    231-233 from R575 (absent on an R570 driver by its branch)."""
    g["fields"]["170"] = links
    for link in range(links):
        g["fields"][f"171:{link}"] = 1
        if errors:
            g["fields"][f"231:{link}"] = 0
            g["fields"][f"232:{link}"] = 0
            g["fields"][f"233:{link}"] = 0


def fabric_of(clique, domain, mask, summary=None):
    f = {"state": 3, "status": 0, "cliqueId": clique, "clusterUuid": domain, "healthMask": mask}
    if summary is not None:
        f["healthSummary"] = summary
    return f


FABRIC_ALL_FALSE = 2 | 2 << 2 | 2 << 4 | 2 << 6  # every health condition reported, none holding
FABRIC_CONFIGURATION_NONE = 1 << 8  # the configuration check: "none" (correct), R580+
FABRIC_DEGRADED_BW = (FABRIC_ALL_FALSE & ~0x3) | 1  # DEGRADED_BW true, the rest false


def a100x2_r535():
    model = "A100-SXM4-80GB"
    gpus = []
    for i, bus in enumerate(("07", "0F")):
        g = base_gpu(synthetic_identity(model, i, bus), idle_mw=58_000, power_limit_mw=400_000)
        g["name"], g["architecture"] = "NVIDIA A100-SXM4-80GB", 7
        set_memory(g, 85_899_345_920, 576_716_800, MEM_USED_LOAD_TRAINING // 2)
        set_power(g, 58_000, 392_000, memory_scope=False)
        g["fields"]["185:0"] = NOT_SUPPORTED  # field 185: "supported on Ampere (except GA100)"
        set_temperatures(g, 32, {0: 92, 1: 89, 2: 95, 3: 87}, margin=False)
        set_clocks(g, 210, 1410, 1593)
        g["values"]["nvmlDeviceGetMaxPcieLinkGeneration"] = g["values"]["nvmlDeviceGetCurrPcieLinkGeneration"] = 4
        set_nvlink_links(g, 12)
        g["values"]["nvmlDeviceGetGpuFabricInfoV"] = NOT_SUPPORTED  # "for Hopper or newer"; R535: v1 only
        no_gpm(g)
        g["values"]["nvmlDeviceGetSupportedEventTypes"] = EVENTS_WITHOUT_RECOVERY
        gpus.append(g)
    desc = (
        "Two A100-SXM4-80GB (ampere_ga100) on an R535 driver, as docs/capabilities.md's recipe says"
        " (examples/scenarios/generate.py a100x2_r535); NOT MEASURED. driver_branch R535: no"
        " nvmlDeviceGetGpuFabricInfoV (the v1 call answers NOT_SUPPORTED: fabric info is for Hopper or"
        " newer), no nvmlDeviceGetTemperatureV (the legacy call answers) and no margin call, field ids"
        " from 197 unknown (INVALID_ARGUMENT: no recovery action, no 269-271, no NVLink5). Documented:"
        " architecture 7, 12 NVLink3 links with fields 161-163 per link, field 185 NOT_SUPPORTED at"
        " every scope (GA100), GPM not supported, PCIe gen 4, 400 W limit and 1410 MHz SM boost (the"
        " A100 datasheet), events without GpuUnavailable/GpuRecoveryAction. SYNTHETIC (picked):"
        " identities (sha256-derived UUIDs, serials, bus ids 07/0F), memory total 85899345920 B and"
        " reserved 576716800 B, memory clock 1593 MHz, idle 58 W and 392 W loaded, temperature"
        " thresholds shutdown 92 / slowdown 89 / GPU max 87 / memory max 95 C, temperatures, NVLink"
        " traffic and data-CRC counts (the H200's), everything in the H200 load model; no confidential"
        " computing (nvmlSystemGetConfComputeState NOT_SUPPORTED: CC is Hopper hardware)."
    )
    return branch_scenario(desc, "R535", "535.247.01", gpus, system={})


def l40sx2_r550():
    model = "L40S"
    gpus = []
    for i, bus in enumerate(("41", "61")):
        g = base_gpu(synthetic_identity(model, i, bus), nvlink=False, idle_mw=36_000, power_limit_mw=350_000)
        g["name"], g["architecture"] = "NVIDIA L40S", 8
        set_memory(g, 48_305_799_168, 603_979_776, 24 << 30)
        set_power(g, 36_000, 345_000, memory_scope=False)
        g["fields"]["185:2"] = NOT_SUPPORTED
        set_temperatures(g, 30, {0: 93, 1: 90, 3: 88}, hbm=False, margin=False)
        set_clocks(g, 210, 2520, 9001)
        g["values"]["nvmlDeviceGetMaxPcieLinkGeneration"] = g["values"]["nvmlDeviceGetCurrPcieLinkGeneration"] = 4
        no_nvlink(g)
        del g["values"]["nvmlDeviceGetMigMode"]  # no MIG on Ada: NOT_SUPPORTED
        g["values"]["nvmlDeviceGetRemappedRows"] = NOT_SUPPORTED
        g["values"]["nvmlDeviceGetEncoderUtilization"] = cycle([0, 100_000], [35, 100_000], [35, 100_000], [0, 100_000])
        no_gpm(g)
        g["values"]["nvmlDeviceGetSupportedEventTypes"] = EVENTS_WITHOUT_RECOVERY
        gpus.append(g)
    desc = (
        "Two L40S (ada) on an R550 driver, from docs/capabilities.md's recipe (examples/scenarios/"
        "generate.py l40sx2_r550); NOT MEASURED. driver_branch R550: no nvmlDeviceGetTemperatureV (the"
        " legacy call answers), no margin call, field ids from 200 unknown. Documented or inferred (the"
        " capability table): architecture 8, no MIG, no NVLink (every NVLink call and field 91"
        " NOT_SUPPORTED), no fabric, no GPM, GDDR6 so no memory temperature (field 82) and no memory"
        " maximum, a passive board without fans, 350 W limit and 2520 MHz boost (the L40S datasheet),"
        " PCIe gen 4, encoder in use while loaded. SYNTHETIC (picked): identities, memory total"
        " 48305799168 B, reserved 603979776 B, 24 GiB used while loaded, ECC on, row remapping"
        " NOT_SUPPORTED, field 185 at the memory scope NOT_SUPPORTED, temperature thresholds shutdown"
        " 93 / slowdown 90 / GPU max 88 C, idle 36 W and 345 W loaded, the H200 load model; no"
        " confidential computing (not CC-capable)."
    )
    return branch_scenario(desc, "R550", "550.163.01", gpus, system={})


def h100x2_r550():
    model = "H100 80GB HBM3"
    domain = domain_uuid("hgx-h100")
    gpus = []
    for i, bus in enumerate(("18", "2A")):
        g = base_gpu(synthetic_identity(model, i, bus), idle_mw=72_000, power_limit_mw=700_000)
        g["name"], g["architecture"] = "NVIDIA H100 80GB HBM3", 9
        set_memory(g, 85_520_809_984, 552_599_552, MEM_USED_LOAD_TRAINING // 2)
        set_power(g, 72_000, 690_000)
        set_temperatures(g, 33, {0: 92, 1: 89, 2: 95, 3: 87}, margin=False)
        g["values"]["nvmlDeviceGetGpuFabricInfoV"] = fabric_of(1, domain, FABRIC_ALL_FALSE)
        g["values"]["nvmlDeviceGetConfComputeProtectedMemoryUsage"] = {
            "total": 85_520_809_984 - 552_599_552,
            "used": 0,
            "free": 85_520_809_984 - 552_599_552,
        }
        g["values"]["nvmlDeviceGetSupportedEventTypes"] = EVENTS_WITHOUT_RECOVERY
        gpus.append(g)
    cc_on = {"environment": 2, "ccFeature": 1, "devToolsMode": 0}
    ready = {"sequence": [{"until_s": 30, "value": 0}, {"value": 1}]}
    system = {"nvmlSystemGetConfComputeState": cc_on, "nvmlSystemGetConfComputeGpusReadyState": ready}
    desc = (
        "Two H100 80GB HBM3 (hopper) of an HGX board on an R550 driver, from docs/capabilities.md's"
        " recipe (examples/scenarios/generate.py h100x2_r550); NOT MEASURED: the H200's measured"
        " values (h200x2) where the two boards agree. driver_branch R550: fabric info v3 answers"
        " ARGUMENT_VERSION_MISMATCH, so v2 (no health summary); no nvmlDeviceGetTemperatureV, no"
        " margin call, no nvmlDeviceGetGpuInstanceProfileInfoById; field ids from 200 unknown (no"
        " recovery action field). Documented: the name string (leptonai/gpud), architecture 9, 18"
        " NVLink4 links (fields 161-163 per link), GPM, MIG, 700 W limit (the H100 SXM datasheet)."
        " Fabric registered (state 3, status 0) in clique 1 of a cluster whose UUID is SYNTHETIC, the"
        " health mask decodable with every condition false. Confidential computing on, production,"
        " and the GPUs ready to accept work only from t = 30 s (an attestation that takes 30 s:"
        " SYNTHETIC), protected memory the whole framebuffer. SYNTHETIC (picked): identities, memory"
        " total 85520809984 B, reserved 552599552 B, idle 72 W and 690 W loaded, temperature thresholds"
        " shutdown 92 / slowdown 89 / GPU max 87 / memory max 95 C, temperatures, the H200 load model."
    )
    return branch_scenario(desc, "R550", "550.163.01", gpus, system=system)


def gh200x1_r570():
    g = base_gpu(synthetic_identity("GH200 480GB", 0, "09"), nvlink=False, idle_mw=95_000, power_limit_mw=900_000)
    g["name"], g["architecture"] = "NVIDIA GH200 480GB", 9
    set_memory(g, 102_005_473_280, 658_505_728, 64 << 30)
    set_power(g, 95_000, 620_000)
    set_module_power(g, 260_000, 880_000, 1_000_000)
    set_temperatures(g, 31, {0: 92, 1: 89, 2: 95, 3: 87})
    g["fields"]["230"] = 0
    set_c2c(g, links=1)
    g["values"]["nvmlDeviceGetSupportedEventTypes"] = SUPPORTED_EVENT_TYPES
    desc = (
        "One GH200 480GB (hopper_gh200: a Hopper GPU joined to a Grace CPU by NVLink-C2C) on an R570"
        " driver, from docs/capabilities.md's recipe (examples/scenarios/generate.py gh200x1_r570); NOT"
        " MEASURED. driver_branch R570: fabric info v2 only, field ids from 269 and the C2C error"
        " fields 231-234 unknown (R575+). Documented: architecture 9, module power through field 185"
        " with the module scope (SC-SGS/hardware_sampling#5) and a module limit apart from the GPU's"
        " (field 190 scope 1; NVIDIA/k8s-test-infra#676), the energy counter counting the whole module"
        " (ml-energy/zeus#172: it ramps at the module's mean power here), temperature V and margin,"
        " field 230 (recovery action 0), GPM, MIG. A single-node board: no NVLink and no fabric"
        " (picked). SYNTHETIC (picked): identity, memory total 102005473280 B, reserved 658505728 B,"
        " one C2C link up with no errors (no public GH200 values), GPU power 95 W idle / 620 W loaded,"
        " module 260 / 880 W, module limit 1000 W, GPU limit 900 W, PCIe gen 5 x16 (what NVML answers"
        " on a C2C-attached GPU is unknown), temperature thresholds as the H100's, confidential"
        " computing off."
    )
    return branch_scenario(desc, "R570", "570.172.08", [g])


def blackwell_gpu(model, name, i, bus, *, domain, clique, fabric_mask, summary, degrading_link=None):
    g = base_gpu(synthetic_identity(model, i, bus), idle_mw=140_000, power_limit_mw=1_000_000)
    g["name"], g["architecture"] = name, 10
    set_memory(g, 192_265_846_784, 1_073_741_824, 160 << 30)
    set_power(g, 140_000, 980_000)
    set_temperatures(g, 30, {0: 97, 1: 92, 2: 95, 3: 90})
    set_clocks(g, 345, 1965, 3996)
    g["values"]["nvmlDeviceGetMaxPcieLinkGeneration"] = g["values"]["nvmlDeviceGetCurrPcieLinkGeneration"] = 6
    nvlink5(g, degrading_link=degrading_link)
    g["values"]["nvmlDeviceGetGpuFabricInfoV"] = fabric_of(clique, domain, fabric_mask, summary)
    g["values"]["nvmlDeviceGetSupportedEventTypes"] = SUPPORTED_EVENT_TYPES
    return g


def b200x2_r570():
    domain = domain_uuid("hgx-b200")
    gpus = [
        blackwell_gpu(
            "B200",
            "NVIDIA B200",
            i,
            bus,
            domain=domain,
            clique=1,
            fabric_mask=FABRIC_ALL_FALSE,
            summary=None,
            degrading_link=7 if i == 0 else None,
        )
        for i, bus in enumerate(("1B", "43"))
    ]
    desc = (
        "Two B200 (blackwell) of an HGX board on an R570 driver, from docs/capabilities.md's recipe"
        " (examples/scenarios/generate.py b200x2_r570); NOT MEASURED. driver_branch R570: fabric info v2"
        " (registered in clique 1, health mask with every condition false, no summary), field ids from"
        " 269 unknown. Documented: architecture 10, 18 NVLink5 links whose legacy error fields 161-163"
        " answer NOT_SUPPORTED (nvml.h 12.8+: 'unsupported for Blackwell+'), the NVLink5 counters"
        " NVML_FI_DEV_NVLINK_COUNT_* per link; link 7 of GPU 0 counts link recovery events from 505,"
        " growing by 3 in 21 minutes (the marin-community/marin#9086 report of a link that failed with"
        " Xid 149 five days later), symbol errors on every link; temperature V and margin, field 230,"
        " events with GpuUnavailable/GpuRecoveryAction, GPM, MIG, 1000 W limit (B200 datasheet)."
        " SYNTHETIC or picked: nvmlDeviceGetNvLinkErrorCounter and fields 138/139 NOT_SUPPORTED (no"
        " public source either way; the NVLink5 byte counters 202/204 carry the traffic), identities,"
        " the cluster UUID, memory total 192265846784 B and reserved 1 GiB, clocks 1965/3996 MHz, PCIe"
        " gen 6, idle 140 W and 980 W loaded, temperature thresholds shutdown 97 / slowdown 92 / GPU max"
        " 90 / memory max 95 C, confidential computing off, the H200 load model."
    )
    return branch_scenario(desc, "R570", "570.172.08", gpus)


def gb200x2_r580():
    domain = domain_uuid("gb200-nvl72-rack-1")
    gpus = []
    for i, bus in enumerate(("01", "02")):
        g = blackwell_gpu(
            "GB200",
            "NVIDIA GB200",
            i,
            bus,
            domain=domain,
            clique=32766,
            fabric_mask=(FABRIC_DEGRADED_BW if i == 1 else FABRIC_ALL_FALSE) | FABRIC_CONFIGURATION_NONE,
            summary=3 if i == 1 else 1,
            degrading_link=7 if i == 0 else None,
        )
        set_module_power(g, 420_000, 1_650_000, 2_700_000)
        set_c2c(g, links=1)
        recovery = {"sequence": [{"until_s": 41, "value": 0}, {"value": 1}]} if i == 0 else 0
        g["fields"]["230"] = recovery
        gpus.append(g)
    events = [
        {"at_s": 40, "gpu": 0, "event_type": "XidCriticalError", "data": 149},
        {"at_s": 40.5, "gpu": 1, "event_type": "XidCriticalError", "data": 145},
        {"at_s": 41, "gpu": 0, "event_type": "XidCriticalError", "data": 154},
    ]
    desc = (
        "Two GPUs of one GB200 superchip (blackwell_gb200: two Blackwell GPUs and a Grace CPU) of an"
        " NVL72 rack on an R580 driver, from docs/capabilities.md's recipe (examples/scenarios/"
        "generate.py gb200x2_r580); NOT MEASURED. As b200x2-r570 for NVLink5 (link 7 of GPU 0"
        " degrading from 505 recovery events), plus: fabric info v3 in the rack's NVLink domain (clique"
        " 32766 and a cluster UUID shared by both GPUs: SYNTHETIC), GPU 0 healthy (summary 1), GPU 1"
        " with degraded bandwidth (health mask DEGRADED_BW true, the other conditions false, summary 3"
        " LIMITED_CAPACITY: the recipe's degraded variant), the configuration check 'none'; the name"
        " string (NVIDIA/dcgm-exporter#581); module power and module limit with the module scope and"
        " the energy counter counting the module (taken to be as on GH200: no public source for"
        " GB200); NVLink-C2C with its error fields (R575+). At t = 40 s GPU 0 logs Xid 149 (NETIR"
        " link down) and GPU 1, its peer, Xid 145 (the downstream pattern of the marin report); at"
        " t = 41 s GPU 0 logs Xid 154 and its recovery action (field 230) moves from 0 to 1 (GPU"
        " reset). SYNTHETIC (picked): identities, module power 420 W idle / 1650 W loaded, module"
        " limit 2700 W, one C2C link, the rest as b200x2-r570."
    )
    return branch_scenario(desc, "R580", "580.95.05", gpus, events=events)


GENERATIONS = {
    "a100x2-r535.json": a100x2_r535,
    "l40sx2-r550.json": l40sx2_r550,
    "h100x2-r550.json": h100x2_r550,
    "gh200x1-r570.json": gh200x1_r570,
    "b200x2-r570.json": b200x2_r570,
    "gb200x2-r580.json": gb200x2_r580,
}


SCENARIOS = {
    "h200x1.json": h200x1,
    "h200x2.json": h200x2,
    "h200x8.json": h200x8,
    "h200x2-mig.json": h200x2_mig,
    **GENERATIONS,
}


def render(doc, indent=1, width=100):
    """JSON with `indent`, but any list/object that fits on one line within `width` stays inline."""

    def dump(v, level):
        flat = json.dumps(v, separators=(", ", ": "))
        if not isinstance(v, (dict, list)) or len(flat) + indent * level <= width:
            return flat
        pad, inner = " " * (indent * level), " " * (indent * (level + 1))
        if isinstance(v, list):
            items = [inner + dump(x, level + 1) for x in v]
            return "[\n" + ",\n".join(items) + "\n" + pad + "]"
        items = [inner + json.dumps(k) + ": " + dump(x, level + 1) for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"

    return dump(doc, 0) + "\n"


# --- validation against docs/scenarios.md --------------------------------------------------------

UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def validate(name, doc):
    """The exporter's own scenario check (docs/scenarios.md), plus the real UUID and bus-id forms."""
    sys.path.insert(0, str(HERE.parent.parent))
    from exporter.common.scenarios.scenario import validate as validate_scenario  # stdlib only

    validate_scenario(name, doc)
    for gi, g in enumerate(doc["gpus"]):
        if not UUID.match(g["uuid"]) or not BUS_ID.match(g["pci_bus_id"]):
            raise ValueError(f"{name}: gpus[{gi}]: bad uuid or pci_bus_id")
        for layout in g.get("mig", {}).get("layouts", []):
            for inst in layout["instances"]:
                if not MIG_UUID.match(inst["uuid"]):
                    raise ValueError(f"{name}: gpus[{gi}]: bad MIG uuid {inst['uuid']}")


def main(argv):
    check = "--check" in argv
    stale = []
    for fname, make in SCENARIOS.items():
        doc = make()
        validate(fname, doc)
        text = render(doc)
        validate(fname, json.loads(text))
        path = OUT / fname
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(fname)
        else:
            path.write_text(text)
    if stale:
        print("stale (re-run generate.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
