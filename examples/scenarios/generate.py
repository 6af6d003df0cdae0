#!/usr/bin/env python3
"""Generate the H200 fake-NVML scenarios (h200x1.json, h200x2.json, h200x8.json,
h200x2-mig.json) in exporter/common/scenarios/.

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


def scenario(description, gpus):
    return {
        "description": description,
        "driver_version": DRIVER_VERSION,
        "nvml_version": NVML_VERSION,
        "cuda_driver_version": CUDA_DRIVER_VERSION,
        "missing_functions": [],
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
    " idle/+4/+8/+5 C (temperatures under load are synthetic). Energy is a ramp from the measured"
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
    " GPM NVLink rates equal the field 138/139 ramps."
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


SCENARIOS = {
    "h200x1.json": h200x1,
    "h200x2.json": h200x2,
    "h200x8.json": h200x8,
    "h200x2-mig.json": h200x2_mig,
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
