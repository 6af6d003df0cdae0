# ruff: noqa: E501 - a table of rules: one source string per line reads better than wrapped
"""Builds docs/capabilities.json from the rules below: one rule per feature, generation and branch.

Edit the rules here, then run ``python3 docs/generate_capabilities.py``;
``tests/test_capabilities.py`` fails when the JSON and this generator disagree (``--check``).
"""

import json
import pathlib
import re
import sys

BRANCHES = ["R535", "R550", "R570", "R580", "R590"]
GENS = [
    "ampere_ga100",
    "ampere_ga10x",
    "ada",
    "hopper",
    "hopper_gh200",
    "blackwell",
    "blackwell_gb200",
    "blackwell_rtx",
]

GO = "https://github.com/NVIDIA/go-nvml/blob/{c}/pkg/nvml/nvml.h"
SOURCES = {
    "h12.2": {"kind": "header", "what": "nvml.h NVML 12.2.140 (CUDA 12.2, R535)", "url": GO.format(c="075f45f")},
    "h12.4": {"kind": "header", "what": "nvml.h NVML 12.4.127 (CUDA 12.4, R550)", "url": GO.format(c="f7ceebd")},
    "h12.6": {"kind": "header", "what": "nvml.h NVML 12.6.77 (CUDA 12.6, R560)", "url": GO.format(c="7ec3ff8")},
    "h12.8": {"kind": "header", "what": "nvml.h NVML 12.8.90 (CUDA 12.8, R570)", "url": GO.format(c="f420a32")},
    "h12.9": {"kind": "header", "what": "nvml.h NVML 12.9.40 (CUDA 12.9, R575)", "url": GO.format(c="62ce1e3")},
    "h13.0": {"kind": "header", "what": "nvml.h NVML 13.0.39 (CUDA 13.0, R580)", "url": GO.format(c="9da9e13")},
    "h13.1": {"kind": "header", "what": "nvml.h NVML 13.1.115 (CUDA 13.1, R590)", "url": GO.format(c="2a1f6c3")},
    "h13.3": {"kind": "header", "what": "nvml.h NVML 13.3.29 (newest copy in go-nvml)", "url": GO.format(c="8b8585b")},
    "py12.535": {
        "kind": "binding",
        "what": "nvidia-ml-py 12.535.161 pynvml.py",
        "url": "https://pypi.org/project/nvidia-ml-py/12.535.161/",
    },
    "py12.550": {
        "kind": "binding",
        "what": "nvidia-ml-py 12.550.89 pynvml.py",
        "url": "https://pypi.org/project/nvidia-ml-py/12.550.89/",
    },
    "py12.560": {
        "kind": "binding",
        "what": "nvidia-ml-py 12.560.30 pynvml.py",
        "url": "https://pypi.org/project/nvidia-ml-py/12.560.30/",
    },
    "py12.570": {
        "kind": "binding",
        "what": "nvidia-ml-py 12.570.172 pynvml.py",
        "url": "https://pypi.org/project/nvidia-ml-py/12.570.172/",
    },
    "py12.575": {
        "kind": "binding",
        "what": "nvidia-ml-py 12.575.51 pynvml.py",
        "url": "https://pypi.org/project/nvidia-ml-py/12.575.51/",
    },
    "py13.580.82": {
        "kind": "binding",
        "what": "nvidia-ml-py 13.580.82 pynvml.py",
        "url": "https://pypi.org/project/nvidia-ml-py/13.580.82/",
    },
    "py13.580.126": {
        "kind": "binding",
        "what": "nvidia-ml-py 13.580.126 pynvml.py",
        "url": "https://pypi.org/project/nvidia-ml-py/13.580.126/",
    },
    "py13.590": {
        "kind": "binding",
        "what": "nvidia-ml-py 13.590.48 pynvml.py",
        "url": "https://pypi.org/project/nvidia-ml-py/13.590.48/",
    },
    "py13.615": {
        "kind": "binding",
        "what": "nvidia-ml-py 13.615.71 pynvml.py",
        "url": "https://pypi.org/project/nvidia-ml-py/13.615.71/",
    },
    "measured-h200-580": {
        "kind": "measurement",
        "what": "H200 SXM, driver 580.159.04, NVML 13.580.159.04, nvidia-ml-py 13.610.43, one GPU and a pair joined by 18 NVLinks, 2026-11-29/30",
        "file": "docs/validation/h200.md",
    },
    "measured-h200-580-fabric-power": {
        "kind": "measurement",
        "what": "H200 pair, 580.159.04: fabric v3, power fields 185/186 by scope, ECC mode",
        "file": "docs/validation/2026-11-30-h200x2/scope_fabric_ecc.json",
    },
    "measured-h200-580-nvlink": {
        "kind": "measurement",
        "what": "H200 pair, 580.159.04: NVLink error counters per call and fields 161-163 per link",
        "file": "docs/validation/2026-11-30-h200x2/nvlink_batched.json",
    },
    "measured-h200-580-x1": {
        "kind": "measurement",
        "what": "one H200, 580.159.04: fabric v3 state 0 (no NVLink), GPM, MIG off",
        "file": "docs/validation/h200x8.md",
    },
    "measured-h200-580-mig": {
        "kind": "measurement",
        "what": "H200, 580.159.04: MIG mode reads with MIG off",
        "file": "docs/validation/mig.md",
    },
    "measured-h200-580-gpm": {
        "kind": "measurement",
        "what": "H200 pair, 580.159.04: GPM idle",
        "file": "docs/validation/2026-11-30-h200x2/gpm_idle.json",
    },
    "nvml-api-fabric-v3": {
        "kind": "document",
        "what": "NVML API reference: nvmlGpuFabricInfo_v3_t",
        "url": "https://docs.nvidia.com/deploy/nvml-api/structnvmlGpuFabricInfo__v3__t.html",
    },
    "nvml-api-changelog": {
        "kind": "document",
        "what": "NVML API reference: change log",
        "url": "https://docs.nvidia.com/deploy/nvml-api/change-log.html",
    },
    "nvml-api-fields": {
        "kind": "document",
        "what": "NVML API reference: field value enums",
        "url": "https://docs.nvidia.com/deploy/nvml-api/group__nvmlFieldValueEnums.html",
    },
    "mig-guide-gpus": {
        "kind": "document",
        "what": "NVIDIA MIG user guide: supported GPUs",
        "url": "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html",
    },
    "mig-guide-drivers": {
        "kind": "document",
        "what": "NVIDIA MIG user guide: minimum driver per GPU (H20 535.161.07, H200 550.90.07, B200/GB200 570.133.20, RTX PRO 6000 Blackwell 575.51.03)",
        "url": "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/620/deployment-considerations.html",
    },
    "rn-535": {
        "kind": "document",
        "what": "NVIDIA data center driver 535.104.05 release notes (CUDA Toolkit 12.2.2)",
        "url": "https://docs.nvidia.com/datacenter/tesla/tesla-release-notes-535-104-05/index.html",
    },
    "xid-catalog": {
        "kind": "document",
        "what": "NVIDIA: Analyzing Xid Errors with the Xid Catalog (sheets Catalog and XID 144-150 Decode)",
        "url": "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html",
    },
    "gpud-fabric": {
        "kind": "code",
        "what": "leptonai/gpud pkg/nvidia/nvml/device/fabric_state.go at 4a8de33a: V call skipped before driver 550 (symbol lookup error), v1 fallback; H100 80GB HBM3 answers health summary NOT_SUPPORTED",
        "url": "https://github.com/leptonai/gpud/blob/main/pkg/nvidia/nvml/device/fabric_state.go",
    },
    "gpud-margin": {
        "kind": "code",
        "what": "leptonai/gpud pkg/nvidia/nvml/device/margin_temperature.go: nvmlDeviceGetMarginTemperature from 570 (NVML change log, v565 to v570)",
        "url": "https://github.com/leptonai/gpud/blob/main/pkg/nvidia/nvml/device/margin_temperature.go",
    },
    "gpud-clock-events": {
        "kind": "code",
        "what": "leptonai/gpud components/accelerator/nvidia/hw-slowdown/clock_events.go: clock events supported from 535",
        "url": "https://github.com/leptonai/gpud/blob/main/components/accelerator/nvidia/hw-slowdown/clock_events.go",
    },
    "gpud-xid-decode": {
        "kind": "code",
        "what": "leptonai/gpud catalog_generated.go and scripts/xid-gen-catelog.py: NVIDIA's XID 144-150 Decode sheet (unit, error status, severity, resolution; IntrInfo layout V1 before R575, V2 from R575)",
        "url": "https://github.com/leptonai/gpud/blob/main/scripts/xid-gen-catelog.py",
    },
    "gpud-pr-1160": {
        "kind": "issue",
        "what": "leptonai/gpud PR #1160: per-subcode fatality of Xid 144-150",
        "url": "https://github.com/leptonai/gpud/pull/1160",
    },
    "marin-9086": {
        "kind": "issue",
        "what": "marin-community/marin #9086: GB200 link with 505 link-recovery events, still growing, failed 5 days later with Xid 149 NETIR_LINK_DOWN",
        "url": "https://github.com/marin-community/marin/issues/9086",
    },
    "dcgm-265": {
        "kind": "issue",
        "what": "NVIDIA/DCGM #265: GB200, DCGM_FI_DEV_NVLINK_COUNT_* fields N/A when watched with ECC fields",
        "url": "https://github.com/NVIDIA/DCGM/issues/265",
    },
    "dcgm-exporter-581": {
        "kind": "issue",
        "what": "NVIDIA/dcgm-exporter #581: GB200 exposition with DCGM_FI_DEV_NVLINK_COUNT_* link recovery counters",
        "url": "https://github.com/NVIDIA/dcgm-exporter/issues/581",
    },
    "datadog-55966": {
        "kind": "issue",
        "what": "DataDog/datadog-agent PR #55966: legacy NVLink error field values answer SUCCESS with 0 on Hopper while nvmlDeviceGetNvLinkErrorCounter counts (what nvidia-smi uses)",
        "url": "https://github.com/DataDog/datadog-agent/pull/55966",
    },
    "nre-302": {
        "kind": "issue",
        "what": "NVIDIA/nvidia-resiliency-ext PR #302: fields 161/162 documented unsupported for Blackwell+",
        "url": "https://github.com/NVIDIA/nvidia-resiliency-ext/pull/302",
    },
    "trtllm-17060": {
        "kind": "issue",
        "what": "NVIDIA/TensorRT-LLM PR #17060: GB200 has 18 links, indices 18-35 answer INVALID_ARGUMENT",
        "url": "https://github.com/NVIDIA/TensorRT-LLM/pull/17060",
    },
    "trtllm-19210": {
        "kind": "issue",
        "what": "NVIDIA/TensorRT-LLM PR #19210: B200 18 links, capability TRUE for all 36 indices, state rejects the surplus",
        "url": "https://github.com/NVIDIA/TensorRT-LLM/pull/19210",
    },
    "zeus-172": {
        "kind": "issue",
        "what": "ml-energy/zeus PR #172: on GH200 the cumulative energy counter covers the whole module (CPU, GPU, memory)",
        "url": "https://github.com/ml-energy/zeus/pull/172",
    },
    "k8s-test-infra-676": {
        "kind": "issue",
        "what": "NVIDIA/k8s-test-infra #676: Grace-Blackwell module and GPU-memory power scopes (module limits differ from GPU limits; memory instantaneous unsupported)",
        "url": "https://github.com/NVIDIA/k8s-test-infra/issues/676",
    },
    "hardware-sampling-5": {
        "kind": "issue",
        "what": "SC-SGS/hardware_sampling PR #5: GH200/GB200 module power only through the field API with the module scope",
        "url": "https://github.com/SC-SGS/hardware_sampling/pull/5",
    },
    "nvitop-79": {
        "kind": "issue",
        "what": "XuehaiPan/nvitop PR #79: early R535 drivers fill a 32-byte _v3 process struct without a version bump",
        "url": "https://github.com/XuehaiPan/nvitop/pull/79",
    },
    "nvitop-226": {
        "kind": "issue",
        "what": "XuehaiPan/nvitop PR #226 (closed): a 16-byte stride from _v3 reported on 550.127.08/Hopper, not reproduced",
        "url": "https://github.com/XuehaiPan/nvitop/pull/226",
    },
    "nvmex-1": {
        "kind": "issue",
        "what": "jelmd/nvmex #1: NVML exposes memory temperature on V100/A100 but not on A40 (GA102, GDDR6) or RTX 2080 Ti",
        "url": "https://github.com/jelmd/nvmex/issues/1",
    },
    "gddr6-19": {
        "kind": "issue",
        "what": "olealgoritme/gddr6 PR #19: L40S VRAM temperature read outside NVML (PCI BAR)",
        "url": "https://github.com/olealgoritme/gddr6/pull/19",
    },
    "cloud-native-docs-6": {
        "kind": "issue",
        "what": "NVIDIA/cloud-native-docs PR #6: GH200 systems require the open GPU kernel modules",
        "url": "https://github.com/NVIDIA/cloud-native-docs/pull/6",
    },
    "repo-collectors": {
        "kind": "repository",
        "what": "this repository: exporter/common/collectors/*.py and exporter/worker/nvml/structs.py (what the exporter calls today)",
        "file": "exporter/common/collectors/",
    },
    "repo-features": {
        "kind": "repository",
        "what": "this repository: guards/featuretable.py FEATURES",
        "file": "guards/featuretable.py",
    },
    "repo-xid-catalog": {
        "kind": "repository",
        "what": "this repository: exporter/supervisor/xid/catalog.json",
        "file": "exporter/supervisor/xid/catalog.json",
    },
}

HDR = {"R535": "h12.2", "R550": "h12.4", "R570": "h12.8", "R580": "h13.0", "R590": "h13.1"}
PY = {"R535": "py12.535", "R550": "py12.550", "R570": "py12.570", "R580": "py13.580.126", "R590": "py13.590"}
ORDER = {b: i for i, b in enumerate(BRANCHES)}

GENERATIONS = {
    "ampere_ga100": {
        "architecture": "Ampere",
        "nvml_arch": 7,
        "products": ["A100 SXM4", "A100 PCIe", "A30"],
        "memory": "HBM2/HBM2e",
        "mig": "A100 7 instances, A30 4",
        "nvlink": "NVLink3: A100 SXM4 12 links (NVSwitch on HGX A100); A100 PCIe and A30 by bridge",
        "c2c": False,
        "gpm": False,
        "sources": ["mig-guide-gpus"],
    },
    "ampere_ga10x": {
        "architecture": "Ampere",
        "nvml_arch": 7,
        "products": ["A10"],
        "memory": "GDDR6",
        "mig": "no",
        "nvlink": "none",
        "c2c": False,
        "gpm": False,
        "sources": ["mig-guide-gpus"],
    },
    "ada": {
        "architecture": "Ada Lovelace",
        "nvml_arch": 8,
        "products": ["L40S", "L4"],
        "memory": "GDDR6",
        "mig": "no",
        "nvlink": "none",
        "c2c": False,
        "gpm": False,
        "sources": ["mig-guide-gpus"],
    },
    "hopper": {
        "architecture": "Hopper",
        "nvml_arch": 9,
        "products": ["H100 SXM5", "H100 PCIe", "H200 SXM", "H200 NVL", "H20"],
        "memory": "HBM3/HBM3e",
        "mig": "7 instances",
        "nvlink": "NVLink4: 18 links on SXM (NVSwitch on HGX 8-GPU boards; measured: two H200 joined directly, NV18)",
        "c2c": False,
        "gpm": True,
        "sources": ["mig-guide-gpus", "measured-h200-580"],
    },
    "hopper_gh200": {
        "architecture": "Hopper",
        "nvml_arch": 9,
        "products": ["GH200 (H100 on GH200)"],
        "memory": "HBM3/HBM3e + Grace LPDDR5X",
        "mig": "7 instances",
        "nvlink": "NVLink4 18 links (NVL32 / multi-node), NVLink-C2C to Grace",
        "c2c": True,
        "gpm": True,
        "sources": ["mig-guide-gpus"],
    },
    "blackwell": {
        "architecture": "Blackwell",
        "nvml_arch": 10,
        "products": ["B200 (HGX B200)"],
        "memory": "HBM3e",
        "mig": "7 instances",
        "nvlink": "NVLink5: 18 links, NVSwitch",
        "c2c": False,
        "gpm": True,
        "sources": ["mig-guide-gpus", "trtllm-19210"],
    },
    "blackwell_gb200": {
        "architecture": "Blackwell",
        "nvml_arch": 10,
        "products": ["GB200 (NVL72 / NVL4)"],
        "memory": "HBM3e + Grace LPDDR5X",
        "mig": "7 instances",
        "nvlink": "NVLink5: 18 links to NVSwitch trays (multi-node NVLink, IMEX), NVLink-C2C to Grace",
        "c2c": True,
        "gpm": True,
        "sources": ["mig-guide-gpus", "trtllm-17060"],
    },
    "blackwell_rtx": {
        "architecture": "Blackwell",
        "nvml_arch": 10,
        "products": ["RTX PRO 6000 Blackwell Server Edition"],
        "memory": "GDDR7",
        "mig": "4 instances (R575+)",
        "nvlink": "none",
        "c2c": False,
        "gpm": "unknown",
        "sources": ["mig-guide-gpus", "mig-guide-drivers"],
    },
}

BRANCH_INFO = {
    "R535": {
        "cuda": "12.2",
        "nvml_header": "12.2.140",
        "nvidia_ml_py": "12.535.161",
        "header_source": "h12.2",
        "note": "long-term branch; 535.104.05 release notes give CUDA Toolkit 12.2.2",
        "sources": ["rn-535", "h12.2", "py12.535"],
    },
    "R550": {
        "cuda": "12.4",
        "nvml_header": "12.4.127",
        "nvidia_ml_py": "12.550.89",
        "header_source": "h12.4",
        "note": "",
        "sources": ["h12.4", "py12.550"],
    },
    "R570": {
        "cuda": "12.8",
        "nvml_header": "12.8.90",
        "nvidia_ml_py": "12.570.172",
        "header_source": "h12.8",
        "note": "R575 (CUDA 12.9, nvidia-ml-py 12.575.51) sits between R570 and R580; where it matters the cells say so",
        "sources": ["h12.8", "py12.570"],
    },
    "R580": {
        "cuda": "13.0",
        "nvml_header": "13.0.39",
        "nvidia_ml_py": "13.580.82 / 13.580.126",
        "header_source": "h13.0",
        "note": "NVML API 13; measured: H200, 580.159.04",
        "sources": ["h13.0", "py13.580.82", "py13.580.126", "measured-h200-580"],
    },
    "R590": {
        "cuda": "13.1",
        "nvml_header": "13.1.115",
        "nvidia_ml_py": "13.590.48",
        "header_source": "h13.1",
        "note": "",
        "sources": ["h13.1", "py13.590"],
    },
}


def branch_support(g, b):
    """Whether branch b drives GPU generation g: (status, note, sources)."""
    if g in ("blackwell", "blackwell_gb200"):
        if b in ("R535", "R550"):
            return (
                "no",
                "the branch predates Blackwell: NVML_DEVICE_ARCH_BLACKWELL first appears in the 12.6 (R560) header; B200/GB200 need R570 (>= 570.133.20 for MIG)",
                ["h12.6", "mig-guide-drivers"],
            )
        return ("yes", "", ["mig-guide-drivers"])
    if g == "blackwell_rtx":
        if b in ("R535", "R550"):
            return (
                "no",
                "the branch predates Blackwell (NVML_DEVICE_ARCH_BLACKWELL first in the R560 header)",
                ["h12.6", "mig-guide-drivers"],
            )
        if b == "R570":
            return (
                "unknown",
                "no public source found here that R570 drives RTX PRO 6000 Blackwell; NVIDIA lists MIG on it from 575.51.03",
                ["mig-guide-drivers"],
            )
        return ("yes", "", ["mig-guide-drivers"])
    if g == "hopper":
        if b == "R535":
            return (
                "partial",
                "H100 and H20 (H20 from 535.161.07); H200 needs R550 (>= 550.90.07)",
                ["mig-guide-drivers"],
            )
        return ("yes", "", ["mig-guide-drivers"])
    if g == "hopper_gh200":
        if b in ("R535", "R550"):
            return (
                "unknown",
                "no public source found here naming the first branch that drives GH200 (GH200 needs the open kernel modules)",
                ["cloud-native-docs-6"],
            )
        return ("yes", "", ["mig-guide-gpus"])
    return ("yes", "", [])


# ---------------------------------------------------------------- helpers
def hb(b):
    return [HDR[b], PY[b]]


def cell(status, calls, uses, fallback=None, sources=(), note="", confidence="documented", measured=False):
    return {
        "status": status,
        "calls": calls,
        "uses": uses,
        "fallback": fallback,
        "measured": measured,
        "confidence": confidence,
        "sources": sorted(set(sources)),
        "note": note,
    }


def is_measured(g, b):
    return g == "hopper" and b == "R580"


MEAS = ["measured-h200-580"]


def na_cell(g, b, feature):
    st, note, src = branch_support(g, b)
    return cell("not_applicable", {}, [], None, src, "branch does not drive this GPU: " + note, "documented")


def feat_identity(g, b):
    calls = {
        c: "supported"
        for c in (
            "nvmlDeviceGetName",
            "nvmlDeviceGetPciInfo",
            "nvmlDeviceGetArchitecture",
            "nvmlSystemGetDriverVersion",
            "nvmlSystemGetNVMLVersion",
            "nvmlSystemGetCudaDriverVersion",
        )
    }
    calls["nvmlDeviceGetSerial"] = "supported"
    note = "nvmlDeviceGetSerial needs an inforom (all data-centre boards listed have one; NOT_SUPPORTED on most RTX per header)"
    if g == "blackwell_rtx":
        calls["nvmlDeviceGetSerial"] = "unknown"
        note = "nvmlDeviceGetSerial: 'all products with an inforom' (header); whether RTX PRO 6000 Blackwell Server Edition answers is unknown, no public source"
    if g in ("blackwell", "blackwell_gb200", "blackwell_rtx") and b in ("R535", "R550"):
        pass
    src = hb(b) + (MEAS if is_measured(g, b) else [])
    return cell(
        "supported",
        calls,
        ["nvmlDeviceGetName", "nvmlDeviceGetPciInfo", "nvmlDeviceGetSerial", "nvmlDeviceGetArchitecture"],
        None,
        src,
        note
        + "; nvmlDeviceGetArchitecture answers NVML_DEVICE_ARCH_{} ({})".format(
            GENERATIONS[g]["architecture"].split()[0].upper(), GENERATIONS[g]["nvml_arch"]
        ),
        "measured" if is_measured(g, b) else "documented",
        is_measured(g, b),
    )


def has_mig(g):
    return g in ("ampere_ga100", "hopper", "hopper_gh200", "blackwell", "blackwell_gb200", "blackwell_rtx")


def feat_mig(g, b):
    src = hb(b) + ["mig-guide-gpus"]
    if not has_mig(g):
        return cell(
            "unsupported",
            {"nvmlDeviceGetMigMode": "NOT_SUPPORTED"},
            [],
            None,
            src,
            "not a MIG GPU (MIG user guide list); the exporter reads MIG mode once per re-probe and caches NOT_SUPPORTED",
            "documented",
        )
    calls = {
        "nvmlDeviceGetMigMode": "supported",
        "nvmlDeviceGetMaxMigDeviceCount": "supported",
        "nvmlDeviceGetMigDeviceHandleByIndex": "supported",
        "nvmlDeviceGetGpuInstanceId": "supported",
        "nvmlDeviceGetComputeInstanceId": "supported",
        "nvmlDeviceGetUUID": "supported",
        "nvmlDeviceGetGpuInstanceById": "NO_PERMISSION unless privileged",
        "nvmlGpuInstanceGetInfo": "supported",
        "nvmlDeviceGetGpuInstanceProfileInfo": "supported",
        "nvmlDeviceGetMemoryInfo": "supported",
        "nvmlDeviceGetComputeRunningProcesses_v3": "supported",
    }
    if ORDER[b] < ORDER["R580"]:
        calls["nvmlDeviceGetGpuInstanceProfileInfoById"] = "FUNCTION_NOT_FOUND"
        fb = "nvmlDeviceGetGpuInstanceProfileInfoById (C nvmlDeviceGetGpuInstanceProfileInfoByIdV, first in the R580 header; pynvml wrapper from 13.580.82) -> nvmlDeviceGetGpuInstanceProfileInfo by profile index"
    else:
        calls["nvmlDeviceGetGpuInstanceProfileInfoById"] = "supported"
        fb = None
    calls["nvmlDeviceGetComputeRunningProcesses_v2"] = (
        "supported" if b != "R535" else "supported (driver); absent from nvidia-ml-py 12.535.161"
    )
    note = "MIG profiles differ per product (A30 4, RTX PRO 6000 Blackwell 4, others 7 instances)"
    if g == "blackwell_rtx":
        note += "; MIG on RTX PRO 6000 Blackwell needs >= 575.51.03"
        src.append("mig-guide-drivers")
    if g == "hopper" and b == "R535":
        note += "; H200 is not driven by R535"
    if is_measured(g, b):
        note += "; measured with MIG off only: mode [0, 0], max MIG devices 0"
        src += ["measured-h200-580-mig"]
    return cell(
        "supported",
        calls,
        ["nvmlDeviceGetMigMode", "nvmlDeviceGetMigDeviceHandleByIndex"],
        fb,
        src,
        note,
        "measured" if is_measured(g, b) else "documented",
        is_measured(g, b),
    )


def feat_utilization(g, b):
    calls = {
        "nvmlDeviceGetUtilizationRates": "supported",
        "nvmlDeviceGetEncoderUtilization": "supported",
        "nvmlDeviceGetDecoderUtilization": "supported",
    }
    note = "all three answer NOT_SUPPORTED on a GPU in MIG mode (header); the exporter then skips them"
    src = hb(b) + (MEAS if is_measured(g, b) else [])
    if g == "ampere_ga100":
        note += "; A100 has no NVENC: nvmlDeviceGetEncoderUtilization unknown (no public source of its answer)"
        calls["nvmlDeviceGetEncoderUtilization"] = "unknown"
    return cell(
        "supported",
        calls,
        list(calls),
        None,
        src,
        note,
        "measured" if is_measured(g, b) else "documented",
        is_measured(g, b),
    )


def feat_memory(g, b):
    calls = {
        "nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2)": "supported",
        "nvmlDeviceGetMemoryInfo": "supported",
        "nvmlDeviceGetBAR1MemoryInfo": "supported",
    }
    note = (
        "v2 (nvmlDeviceGetMemoryInfo_v2, in every header from 12.2) reports reserved separately and its used excludes it; v1 used includes the reserved memory"
        " (measured on H200: v1 used 644,939,776 B = v2 reserved, v2 used 0 at idle)"
    )
    src = hb(b) + (MEAS if is_measured(g, b) else [])
    if g in ("hopper_gh200", "blackwell_gb200"):
        note += "; GPU framebuffer only (Grace memory is host memory); accuracy on coherent systems depends on OS accounting (header note on NUMA GPUs) - values unknown, no public measurement"
    return cell(
        "supported",
        calls,
        ["nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2)"],
        "v2 -> v1 when v2 answers FUNCTION_NOT_FOUND / ARGUMENT_VERSION_MISMATCH; on v1 'used' includes reserved memory and no reserved series is possible",
        src,
        note,
        "measured" if is_measured(g, b) else "documented",
        is_measured(g, b),
    )


def feat_power(g, b):
    calls = {
        "nvmlDeviceGetPowerUsage": "supported",
        "nvmlDeviceGetEnforcedPowerLimit": "supported",
        "nvmlDeviceGetTotalEnergyConsumption": "supported",
    }
    src = hb(b) + ["nvml-api-fields"]
    notes = []
    if g in ("hopper_gh200", "blackwell_gb200"):
        calls["field 185 scope 1 (module)"] = "supported (reported)"
        src += ["hardware-sampling-5", "k8s-test-infra-676", "zeus-172"]
        calls["field 190 scope 1 (module limit)"] = "supported (reported)"
        notes.append(
            "module scope answers only with a Grace CPU ('x86 or non-NVIDIA ARM is not supported', header); on GH200 the energy counter covers the whole module (zeus PR #172), so the exporter files it under nvgpu_module_energy_consumption_joules_total where the module power answers: its scope on GB200 has no public source and is taken to be the same"
        )
    else:
        calls["field 185 scope 1 (module)"] = "NOT_SUPPORTED"
        notes.append("module scope needs an NVIDIA CPU (header)")
    if g == "ampere_ga100":
        calls["field 185 scope 0/2"] = (
            "NOT_SUPPORTED (documented for scope 0: 'supported on Ampere (except GA100) or newer')"
        )
        notes.append("GA100: nvmlDeviceGetPowerUsage is the instantaneous reading, not a 1 s average (header)")
    elif g in ("hopper",) and b == "R580":
        calls["field 185 scope 2 (memory)"] = "supported"
        notes.append(
            "measured: scope 0 = nvmlDeviceGetPowerUsage, scope 2 memory about 39-44 W idle, scope 1 NOT_SUPPORTED, field 186 scope 2 NOT_SUPPORTED"
        )
        src += ["measured-h200-580-fabric-power"]
    else:
        calls["field 185 scope 2 (memory)"] = (
            "unknown"
            if b != "R535"
            else "INVALID_ARGUMENT or NOT_SUPPORTED (NVML_POWER_SCOPE_MEMORY not in the R535 header)"
        )
        notes.append(
            "memory scope (NVML_POWER_SCOPE_MEMORY 2, header from 12.4): answered on H200/580 (measured); on this GPU/branch unknown, no public source"
        )
    if b == "R535":
        notes.append("R535 header names scope 2 'GPU base' only for the limit fields")
    return cell(
        "supported",
        calls,
        ["nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTotalEnergyConsumption"],
        None,
        src + (MEAS if is_measured(g, b) else []),
        "; ".join(notes),
        "measured" if is_measured(g, b) else "documented",
        is_measured(g, b),
    )


def feat_temperature(g, b):
    src = hb(b)
    calls = {}
    if ORDER[b] < ORDER["R570"]:
        calls["nvmlDeviceGetTemperatureV"] = "FUNCTION_NOT_FOUND"
        calls["nvmlDeviceGetTemperature"] = "supported"
        uses = ["nvmlDeviceGetTemperature"]
        fb = (
            "nvmlDeviceGetTemperatureV (first in the 12.8 header, R570; pynvml from 12.570) -> nvmlDeviceGetTemperature"
        )
        note = "nvidia-ml-py older than 12.570 has no nvmlDeviceGetTemperatureV at all (AttributeError)"
    else:
        calls["nvmlDeviceGetTemperatureV"] = "supported"
        calls["nvmlDeviceGetTemperature"] = (
            "supported, deprecated (DEPRECATED(13.0) from the R580 header)"
            if ORDER[b] >= ORDER["R580"]
            else "supported"
        )
        uses = ["nvmlDeviceGetTemperatureV"]
        fb = None
        note = ""
    if g in ("ampere_ga10x", "ada", "blackwell_rtx"):
        calls["field 82 NVML_FI_DEV_MEMORY_TEMP"] = "NOT_SUPPORTED (inferred)"
        note += "; GDDR board: memory temperature not exposed by NVML (reported for A40, GA102, in jelmd/nvmex#1, and L40S VRAM temperature is read outside NVML in olealgoritme/gddr6#19), not measured"
        src += ["nvmex-1", "gddr6-19"]
        conf = "inferred"
    else:
        calls["field 82 NVML_FI_DEV_MEMORY_TEMP"] = "supported"
        conf = "documented"
        src += ["nvmex-1"] if g == "ampere_ga100" else []
    calls["nvmlDeviceGetTemperatureThreshold"] = "supported"
    calls["nvmlDeviceGetMarginTemperature"] = "supported" if ORDER[b] >= ORDER["R570"] else "FUNCTION_NOT_FOUND"
    note += "; margins: nvmlDeviceGetMarginTemperature (R570+), else the slowdown threshold minus the temperature"
    src += ["gpud-margin"]
    if is_measured(g, b):
        conf = "measured"
        src += MEAS
    return cell(
        "supported",
        calls,
        uses + ["field 82", "nvmlDeviceGetTemperatureThreshold"],
        fb,
        src,
        note.strip("; "),
        conf,
        is_measured(g, b),
    )


def feat_fan(g, b):
    src = hb(b)
    if g == "blackwell_rtx":
        return cell(
            "unknown",
            {"nvmlDeviceGetNumFans": "unknown", "nvmlDeviceGetFanSpeed_v2": "unknown"},
            [],
            None,
            src,
            "Server Edition is passively cooled, Workstation Edition has a fan; NVML answer unknown, no public source",
            "unknown",
        )
    st = "unsupported"
    note = "passively cooled data-centre board: fan count 0 or every fan NOT_SUPPORTED (measured on H200); the exporter marks the feature unsupported"
    conf = "measured" if is_measured(g, b) else "inferred"
    if is_measured(g, b):
        src += MEAS
    return cell(
        st,
        {"nvmlDeviceGetNumFans": "0 or NOT_SUPPORTED", "nvmlDeviceGetFanSpeed_v2": "NOT_SUPPORTED"},
        [],
        None,
        src,
        note,
        conf,
        is_measured(g, b),
    )


def feat_clocks(g, b):
    calls = {
        "nvmlDeviceGetClockInfo": "supported",
        "nvmlDeviceGetMaxClockInfo": "supported",
        "nvmlDeviceGetPerformanceState": "supported",
        "nvmlDeviceGetCurrentClocksEventReasons": "supported",
    }
    note = (
        "nvmlDeviceGetCurrentClocksEventReasons is in every header from 12.2 (R535; undefined symbol on 525 per gpud); "
        "nvmlDeviceGetCurrentClocksThrottleReasons is DEPRECATED(13.0) with the same bits"
    )
    if ORDER[b] >= ORDER["R580"]:
        calls["nvmlDeviceGetCurrentClocksThrottleReasons"] = "supported, deprecated"
    else:
        calls["nvmlDeviceGetCurrentClocksThrottleReasons"] = "supported (deprecated name in the header comment)"
    src = hb(b) + ["gpud-clock-events"] + (MEAS if is_measured(g, b) else [])
    return cell(
        "supported",
        calls,
        [
            "nvmlDeviceGetClockInfo",
            "nvmlDeviceGetMaxClockInfo",
            "nvmlDeviceGetPerformanceState",
            "nvmlDeviceGetCurrentClocksEventReasons",
        ],
        "clock event reasons -> throttle reasons only for drivers before R535 (out of range here)",
        src,
        note,
        "measured" if is_measured(g, b) else "documented",
        is_measured(g, b),
    )


def feat_throttle_time(g, b):
    calls = {
        "fields 74-81 NVML_FI_DEV_PERF_POLICY_*": "supported",
        "nvmlDeviceGetViolationStatus": "supported"
        if ORDER[b] < ORDER["R580"]
        else "supported, deprecated (DEPRECATED(13.0))",
    }
    if ORDER[b] >= ORDER["R580"]:
        calls["fields 269-271 NVML_FI_DEV_CLOCKS_EVENT_REASON_*"] = "supported (from 580.82)"
        uses = ["fields 74-81", "fields 269-271"]
        note = "269-271 are asked only from driver 580.82 (the exporter reads the driver version once)"
    else:
        calls["fields 269-271 NVML_FI_DEV_CLOCKS_EVENT_REASON_*"] = (
            "not asked (other meaning or unknown id on this branch)"
        )
        uses = ["fields 74-81"]
        note = (
            "SW thermal, HW thermal and HW power brake durations have no per-reason field before 580.82: in the 575 header and nvidia-ml-py 12.575.51 "
            "they were 251-253 (power smoothing ids from 580.82); nvmlDeviceGetViolationStatus has no policy for them either"
        )
    src = hb(b) + ["py12.575", "py13.580.82"] + (MEAS if is_measured(g, b) else [])
    st = "supported" if ORDER[b] >= ORDER["R580"] else "partial"
    return cell(
        st,
        calls,
        uses,
        "field missing -> nvmlDeviceGetViolationStatus for the eight perf policies",
        src,
        note,
        "measured" if is_measured(g, b) else "documented",
        is_measured(g, b),
    )


def feat_pcie(g, b):
    calls = {
        c: "supported"
        for c in (
            "nvmlDeviceGetCurrPcieLinkGeneration",
            "nvmlDeviceGetMaxPcieLinkGeneration",
            "nvmlDeviceGetCurrPcieLinkWidth",
            "nvmlDeviceGetMaxPcieLinkWidth",
            "nvmlDeviceGetPcieReplayCounter",
        )
    }
    note = ""
    conf = "documented"
    if g in ("hopper_gh200", "blackwell_gb200"):
        for k in calls:
            calls[k] = "unknown"
        note = "the GPU attaches to Grace over NVLink-C2C; what the PCIe link calls answer there is unknown, no public source"
        conf = "unknown"
        return cell("unknown", calls, [], None, hb(b), note, conf)
    src = hb(b) + (MEAS if is_measured(g, b) else [])
    return cell(
        "supported", calls, list(calls), None, src, note, "measured" if is_measured(g, b) else conf, is_measured(g, b)
    )


def feat_ecc(g, b):
    calls = {"nvmlDeviceGetEccMode": "supported", "nvmlDeviceGetTotalEccErrors": "supported"}
    note = "counters need ECC enabled"
    conf = "measured" if is_measured(g, b) else "documented"
    if g in ("ampere_ga10x", "ada", "blackwell_rtx"):
        note = "GDDR board with optional ECC: counters answer only while ECC is enabled; default ECC state unknown, no public source here"
        conf = "inferred"
    src = hb(b) + (MEAS if is_measured(g, b) else [])
    return cell("supported", calls, list(calls), None, src, note, conf, is_measured(g, b))


def feat_remapped_rows(g, b):
    calls = {"nvmlDeviceGetRemappedRows": "supported"}
    note = "NOT_SUPPORTED while MIG has active instances (header)"
    conf = "measured" if is_measured(g, b) else "documented"
    if g in ("ampere_ga10x", "ada", "blackwell_rtx"):
        calls["nvmlDeviceGetRemappedRows"] = "unknown"
        note = "row remapping on GDDR boards: unknown, no public source ('Ampere or newer' in the header, memory type not stated)"
        conf = "unknown"
    if ORDER[b] >= ORDER["R570"]:
        calls["field 230 NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"] = "supported"
    else:
        calls["field 230 NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"] = "INVALID_ARGUMENT (unknown id before the 12.8 header)"
        note += "; recovery action field 230 first in the 12.8 (R570) header"
    src = hb(b) + (MEAS if is_measured(g, b) else [])
    st = "supported" if conf != "unknown" else ("partial" if ORDER[b] >= ORDER["R570"] else "unknown")
    return cell(st, calls, list(calls), None, src, note, conf, is_measured(g, b))


def has_nvlink(g):
    return g in ("ampere_ga100", "hopper", "hopper_gh200", "blackwell", "blackwell_gb200")


def feat_nvlink(g, b):
    src = hb(b)
    if not has_nvlink(g):
        return cell(
            "unsupported",
            {"nvmlDeviceGetNvLinkState": "NOT_SUPPORTED", "fields 161-163": "NOT_SUPPORTED"},
            [],
            None,
            src,
            "no NVLink on this board: every per-link call answers NOT_SUPPORTED (measured on a single H200 for the same situation)",
            "inferred",
        )
    if g in ("blackwell", "blackwell_gb200"):
        calls = {
            "nvmlDeviceGetNvLinkState": "supported",
            "fields 161-163 NVML_FI_DEV_NVLINK_ERROR_DL_*": "NOT_SUPPORTED (documented: 'unsupported for Blackwell+')",
            "nvmlDeviceGetNvLinkErrorCounter": "unknown (no public source for real GB200/B200; the fake answers NOT_SUPPORTED)",
            "fields 206-221 NVML_FI_DEV_NVLINK_COUNT_*": "supported",
        }
        return cell(
            "supported",
            calls,
            ["nvmlDeviceGetNvLinkState", "fields 206-221 NVML_FI_DEV_NVLINK_COUNT_*"],
            "fields 161-163 unsupported -> NVML_FI_DEV_NVLINK_COUNT_* per link in a field-value call of their own: 215 LINK_RECOVERY_EVENTS as error_type recovery (Hopper's meaning), 214, 219, 221 as recovery_failed, effective, symbol (206-212 with details); no NVLink5 field means replay or flit/data CRC",
            src + ["nre-302", "dcgm-exporter-581", "marin-9086", "dcgm-265", "nvml-api-fields"],
            "18 links, indices 18-35 INVALID_ARGUMENT; a GPU whose links answer no error counter at all has the feature unsupported (link state alone is not NVLink monitoring)",
            "documented",
        )
    calls = {
        "nvmlDeviceGetNvLinkState": "supported",
        "fields 161-163 NVML_FI_DEV_NVLINK_ERROR_DL_*": "supported",
        "nvmlDeviceGetNvLinkErrorCounter": "supported",
    }
    note = "A100 SXM4 12 links (PCIe boards with a bridge fewer)" if g == "ampere_ga100" else "18 links on SXM/GH200"
    if g == "hopper" and b == "R535":
        note += "; H200 not driven by R535"
    if is_measured(g, b):
        note += (
            "; measured on the H200 pair: fields 161-163 and the per-call counters agree (all replay/recovery/flit-CRC 0), data CRC 6-375 per link by call only, "
            "all-lane totals 38/45/52/59 NOT_SUPPORTED; DataDog reports the fields answering 0 on Hopper while the call counts (not disproved here: all counts were 0)"
        )
        src += ["measured-h200-580-nvlink", "datadog-55966"]
    elif g in ("ampere_ga100", "hopper", "hopper_gh200"):
        src += ["datadog-55966"]
        note += "; DataDog reports the legacy fields answering SUCCESS with 0 on Hopper where nvmlDeviceGetNvLinkErrorCounter counts"
    if ORDER[b] < ORDER["R570"]:
        note += "; 'unsupported for Blackwell+' comment first in the 12.8 header"
    return cell(
        "supported",
        calls,
        list(calls),
        "fields 161-163 unsupported -> nvmlDeviceGetNvLinkErrorCounter per link",
        src,
        note,
        "measured" if is_measured(g, b) else "documented",
        is_measured(g, b),
    )


def feat_nvlink_throughput(g, b):
    src = hb(b)
    if not has_nvlink(g):
        return cell(
            "unsupported",
            {"field 91": "NOT_SUPPORTED", "fields 138/139": "NOT_SUPPORTED"},
            [],
            None,
            src,
            "no NVLink",
            "inferred",
        )
    calls = {
        "field 91 NVML_FI_DEV_NVLINK_LINK_COUNT": "supported",
        "fields 138/139 NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX": "supported",
    }
    note = "cumulative KiB counters; scope 0xFFFFFFFF = all links"
    conf = "measured" if is_measured(g, b) else "documented"
    if g in ("blackwell", "blackwell_gb200"):
        calls["fields 138/139 NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX"] = "unknown"
        calls["fields 202/204 NVML_FI_DEV_NVLINK_COUNT_XMIT/RCV_BYTES"] = "supported (header: 'in NVLink5')"
        note = "whether 138/139 still answer on NVLink5 is unknown, no public source; where every 138/139 entry is unsupported the exporter sums 202/204 (per link, bytes)"
        return cell(
            "supported",
            calls,
            ["field 91 NVML_FI_DEV_NVLINK_LINK_COUNT"],
            "138/139 unsupported -> 202/204 per link, summed",
            src + ["nvml-api-fields"],
            note,
            "documented",
        )
    if is_measured(g, b):
        note += "; measured: deltas equal the bytes copied over NVLink (ratio 1.0000)"
        src += MEAS
    return cell("supported", calls, list(calls), None, src, note, conf, is_measured(g, b))


def feat_fabric(g, b):
    src = hb(b) + PY_ALL_FABRIC
    fabric_gpu = g in ("hopper", "hopper_gh200", "blackwell", "blackwell_gb200")
    if ORDER[b] >= ORDER["R580"]:
        v = {
            "nvmlDeviceGetGpuFabricInfoV v3": "supported",
            "nvmlDeviceGetGpuFabricInfoV v2": "supported, deprecated struct",
            "nvmlDeviceGetGpuFabricInfo v1": "supported, deprecated (DEPRECATED(13.0))",
        }
        uses = ["nvmlDeviceGetGpuFabricInfoV v3"]
    elif ORDER[b] >= ORDER["R550"]:
        v = {
            "nvmlDeviceGetGpuFabricInfoV v3": "ARGUMENT_VERSION_MISMATCH (inferred: v3 first in the R580 header)",
            "nvmlDeviceGetGpuFabricInfoV v2": "supported",
            "nvmlDeviceGetGpuFabricInfo v1": "supported",
        }
        uses = ["nvmlDeviceGetGpuFabricInfoV v2"]
    else:
        v = {"nvmlDeviceGetGpuFabricInfoV": "FUNCTION_NOT_FOUND", "nvmlDeviceGetGpuFabricInfo v1": "supported"}
        uses = ["nvmlDeviceGetGpuFabricInfo v1"]
    fb = "V v3 -> V v2 (R550-R575) -> nvmlDeviceGetGpuFabricInfo v1 (R535), in struct layouts of the exporter's own (the bindings' v1 up to 13.610 and 12.550/12.560 v2 are wrong); chosen once per worker, nvgpu_nvml_api_info{call=\"fabric\"}"
    if not fabric_gpu:
        v = {
            k: "NOT_SUPPORTED (state NOT_SUPPORTED)" if "FUNCTION_NOT_FOUND" not in val else val for k, val in v.items()
        }
        return cell(
            "unsupported",
            v,
            [],
            fb,
            src,
            "fabric info is 'for Hopper or newer' (header); no NVSwitch fabric on this board",
            "documented",
        )
    note = "state/status meaningful on NVSwitch systems (HGX 8-GPU, NVL); a GPU without a fabric answers state NOT_SUPPORTED"
    if ORDER[b] < ORDER["R580"]:
        note += "; no healthSummary before v3"
    if b == "R535":
        note += "; v1 struct: clusterUuid[16], status, partitionId (renamed cliqueId in 12.4), state (uchar): nvidia-ml-py's c_nvmlGpuFabricInfo_t is 92 bytes (clusterUuid[80]) up to 13.610, 28 bytes only from 13.615.71"
    conf = "documented"
    if g == "hopper":
        note += "; H100 answers healthSummary NOT_SUPPORTED (gpud)"
        src += ["gpud-fabric"]
    if is_measured(g, b):
        note += "; measured: pair joined directly: v3 state 3, status 0, clique 0, healthMask 0, healthSummary 0; single H200: state 0"
        src += ["measured-h200-580-fabric-power", "measured-h200-580-x1"]
        conf = "measured"
    if g == "blackwell_gb200":
        note += "; clique id and cluster UUID identify the NVL72 domain (IMEX)"
        src += ["nvml-api-fabric-v3"]
    if g == "blackwell_rtx":
        pass
    return cell("supported", v, uses, fb, src, note, conf, is_measured(g, b))


PY_ALL_FABRIC = ["py12.550", "py12.570", "py13.580.82", "py13.615"]


def has_gpm(g):
    return g in ("hopper", "hopper_gh200", "blackwell", "blackwell_gb200")


def feat_gpm(g, b, pipes=False):
    src = hb(b)
    if g in ("ampere_ga100", "ampere_ga10x", "ada"):
        return cell(
            "unsupported",
            {"nvmlGpmQueryDeviceSupport": "isSupportedDevice 0 (documented: 'Hopper or newer')"},
            [],
            None,
            src,
            "GPM is Hopper+: profiling families absent with the reason",
            "documented",
        )
    if g == "blackwell_rtx":
        return cell(
            "unknown",
            {"nvmlGpmQueryDeviceSupport": "unknown"},
            [],
            None,
            src,
            "'Hopper or newer fully supported devices' (header); whether RTX PRO 6000 Blackwell counts is unknown, no public source",
            "unknown",
        )
    calls = {
        "nvmlGpmQueryDeviceSupport": "supported",
        "nvmlGpmSampleAlloc": "supported",
        "nvmlGpmSampleGet": "supported",
        "nvmlGpmMetricsGet": "supported",
        "nvmlGpmSampleFree": "supported",
        "nvmlDeviceGetMigMode": "supported",
    }
    if not pipes:
        calls["nvmlGpmMigSampleGet"] = "supported"
    note = "NVLink GPM metrics answer NOT_SUPPORTED without NVLink peers (measured single H200)"
    if is_measured(g, b):
        src += ["measured-h200-580-gpm"]
        if pipes:
            note = "pipe metric ids not in the measured set (ids 1, 2, 3, 5, 7, 10, 12, 20, 21, 60, 61)"
    conf = "measured" if is_measured(g, b) and not pipes else "documented"
    return cell(
        "supported",
        calls,
        ["nvmlGpmSampleGet", "nvmlGpmMetricsGet"],
        None,
        src,
        note,
        conf,
        is_measured(g, b) and not pipes,
    )


def feat_processes(g, b):
    calls = {
        "nvmlDeviceGetComputeRunningProcesses_v3": "supported",
        "nvmlDeviceGetGraphicsRunningProcesses_v3": "supported",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3": "supported",
        "nvmlDeviceGetProcessUtilization": "supported",
        "nvmlDeviceGetMemoryInfo": "supported",
    }
    src = hb(b)
    note = ""
    if b == "R535":
        for k in (
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetGraphicsRunningProcesses_v2",
            "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        ):
            calls[k] = (
                "supported by the driver; nvidia-ml-py 12.535.161 has no _v2 wrapper (FUNCTION_NOT_FOUND through the binding)"
            )
        note = (
            "535.43-535.86 fill a 32-byte _v3 record (usedGpuCcProtectedMemory) that nvidia-ml-py reads as 24 bytes: records fail validation; "
            "535.104.05+ back to 24 bytes (nvitop PR #79)"
        )
        src += ["nvitop-79", "py12.535"]
    else:
        for k in (
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetGraphicsRunningProcesses_v2",
            "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        ):
            calls[k] = "supported"
    if b == "R550":
        note = "a 16-byte _v3 stride was reported on 550.127.08/Hopper (nvitop PR #226, not reproduced)"
        src += ["nvitop-226"]
    if is_measured(g, b):
        note = "measured: _v3 (24-byte), _v2 and the detail list give the same record"
        src += MEAS
    return cell(
        "supported",
        calls,
        [
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
            "nvmlDeviceGetMPSComputeRunningProcesses_v3",
            "nvmlDeviceGetProcessUtilization",
        ],
        "_v3 -> _v2 when _v3 is missing or its records fail validation",
        src,
        note,
        "measured" if is_measured(g, b) else "documented",
        is_measured(g, b),
    )


def feat_events(g, b):
    calls = {
        "nvmlEventSetCreate": "supported",
        "nvmlDeviceGetSupportedEventTypes": "supported",
        "nvmlDeviceRegisterEvents": "supported",
        "nvmlEventSetWait_v2": "supported",
    }
    note = "Xid critical events everywhere; GpuUnavailableError 0x4000 and GpuRecoveryAction 0x8000 event types first in the 12.8 (R570) header"
    if is_measured(g, b):
        note += "; measured: supported mask 0xff9f"
    src = hb(b) + (MEAS if is_measured(g, b) else [])
    return cell(
        "supported",
        calls,
        list(calls),
        None,
        src,
        note,
        "measured" if is_measured(g, b) else "documented",
        is_measured(g, b),
    )


def feat_nonnvml(kind):
    def f(g, b):
        notes = {
            "nvlink_links": (
                "switch only (no NVML call of its own): per-link series of nvlink and nvlink_throughput",
                "follows nvlink",
            ),
            "details": (
                "switch only: extra series of clocks, throttle_time, memory, ecc, pcie, utilization, nvlink_throughput",
                "follows those features",
            ),
            "process_usage": ("switch only: per-process series from the processes feature", "follows processes"),
            "kernel_xid": (
                "reads /dev/kmsg, no NVML; Blackwell lines for Xid 144-150 carry unit, severity and IntrInfo whose layout changed at R575 (V1 before, V2 from R575)",
                "",
            ),
            "pod_attribution": ("kubelet PodResources API, no NVML", ""),
        }[kind]
        src = ["repo-features"] + (["gpud-xid-decode"] if kind == "kernel_xid" else [])
        st = "supported"
        if kind == "nvlink_links" and not has_nvlink(g):
            st = "unsupported"
        return cell(st, {}, [], None, src, notes[0] + ("; " + notes[1] if notes[1] else ""), "documented")

    return f


def feat_c2c(g, b):
    return planned_c2c(g, b)


def feat_confidential_computing(g, b):
    return planned_cc(g, b)


FEATURE_RULES = {
    "identity": feat_identity,
    "mig": feat_mig,
    "utilization": feat_utilization,
    "memory": feat_memory,
    "power": feat_power,
    "temperature": feat_temperature,
    "fan": feat_fan,
    "clocks": feat_clocks,
    "throttle_time": feat_throttle_time,
    "pcie": feat_pcie,
    "ecc": feat_ecc,
    "remapped_rows": feat_remapped_rows,
    "nvlink": feat_nvlink,
    "nvlink_throughput": feat_nvlink_throughput,
    "c2c": feat_c2c,
    "nvlink_links": feat_nonnvml("nvlink_links"),
    "details": feat_nonnvml("details"),
    "fabric": feat_fabric,
    "confidential_computing": feat_confidential_computing,
    "gpm": feat_gpm,
    "gpm_pipes": lambda g, b: feat_gpm(g, b, pipes=True),
    "processes": feat_processes,
    "process_usage": feat_nonnvml("process_usage"),
    "events": feat_events,
    "kernel_xid": feat_nonnvml("kernel_xid"),
    "pod_attribution": feat_nonnvml("pod_attribution"),
}


# --------------------------------------------- capabilities added inside the features for the newer generations
def planned_nvlink5(g, b):
    if g not in ("blackwell", "blackwell_gb200"):
        return cell(
            "unsupported",
            {"fields 201-222": "NOT_SUPPORTED (NVLink5 only, header)"},
            [],
            None,
            hb(b),
            "NVLink5 counters: 'in NVLink5' (header)",
            "inferred",
        )
    fec = "supported" if ORDER[b] >= ORDER["R570"] else "INVALID_ARGUMENT"
    return cell(
        "supported",
        {
            "fields 213-215 LINK_RECOVERY_*": "supported",
            "field 219 EFFECTIVE_ERRORS": "supported",
            "field 221 SYMBOL_ERRORS": "supported",
            "fields 220/222 *_BER": "supported",
            "fields 235-250 FEC_HISTORY_0..15": fec,
            "fields 202/204 XMIT/RCV_BYTES": "supported",
        },
        [
            "fields 213-215 LINK_RECOVERY_*",
            "field 219 EFFECTIVE_ERRORS",
            "field 221 SYMBOL_ERRORS",
            "fields 235-250 FEC_HISTORY_0..15",
        ],
        None,
        hb(b) + ["nvml-api-fields", "dcgm-exporter-581", "marin-9086", "dcgm-265"],
        "fields 201-222 in the 12.6 header (R560), FEC history 235-250 from the 12.8 header (R570)",
        "documented",
    )


def planned_fabric_health(g, b):
    fab = g in ("hopper", "hopper_gh200", "blackwell", "blackwell_gb200")
    if not fab:
        return cell(
            "unsupported",
            {
                "healthMask": "NOT_SUPPORTED (state NOT_SUPPORTED)",
                "healthSummary": "NOT_SUPPORTED",
                "cliqueId": "NOT_SUPPORTED",
                "clusterUuid": "NOT_SUPPORTED",
            },
            [],
            None,
            hb(b),
            "no fabric: fabric info is 'for Hopper or newer' and needs NVSwitch/NVL",
            "documented",
        )
    if b == "R535":
        return cell(
            "unsupported",
            {
                "healthMask": "absent (v1 struct)",
                "healthSummary": "absent",
                "cliqueId": "supported (named partitionId in the 12.2 header)",
                "clusterUuid": "supported",
            },
            ["cliqueId", "clusterUuid"],
            None,
            hb(b) + ["gpud-fabric"],
            "v1 has clique (partitionId) and cluster UUID but no health",
            "documented",
        )
    if ORDER[b] < ORDER["R580"]:
        return cell(
            "partial",
            {
                "healthMask": "supported (v2: degraded BW, route recovery, route unhealthy, and access timeout recovery from the 12.8 header)",
                "healthSummary": "absent (v3 is R580+)",
                "cliqueId": "supported",
                "clusterUuid": "supported",
            },
            ["healthMask", "cliqueId", "clusterUuid"],
            None,
            hb(b),
            "incorrect-configuration bits 8-11 first in the 13.0 header",
            "documented",
        )
    st = "supported"
    note = "healthSummary 0 NOT_SUPPORTED, 1 HEALTHY, 2 UNHEALTHY, 3 LIMITED_CAPACITY"
    conf = "documented"
    if g == "hopper":
        note += "; H100 answers healthSummary NOT_SUPPORTED (gpud); measured H200 pair: healthMask 0, healthSummary 0"
        if is_measured(g, b):
            conf = "measured"
    return cell(
        st,
        {
            "healthMask": "supported",
            "healthSummary": "supported" if g != "hopper" else "NOT_SUPPORTED (H100 per gpud, H200 pair measured 0)",
            "cliqueId": "supported",
            "clusterUuid": "supported",
        },
        ["healthMask", "healthSummary", "cliqueId", "clusterUuid"],
        None,
        hb(b)
        + ["nvml-api-fabric-v3", "gpud-fabric"]
        + (["measured-h200-580-fabric-power"] if is_measured(g, b) else []),
        note,
        conf,
        is_measured(g, b),
    )


def planned_c2c(g, b):
    if g not in ("hopper_gh200", "blackwell_gb200"):
        return cell(
            "unsupported",
            {"field 170 C2C_LINK_COUNT": "NOT_SUPPORTED or 0 (inferred: no C2C)"},
            [],
            None,
            hb(b) + (["measured-h200-580"] if is_measured(g, b) else []),
            "no NVLink-C2C (nvidia-smi -q on H200: 'GPU C2C Mode: Disabled')",
            "inferred" if not is_measured(g, b) else "measured",
            is_measured(g, b),
        )
    calls = {
        "fields 170-172 C2C_LINK_COUNT/GET_STATUS/GET_MAX_BW": "supported",
        "nvmlDeviceGetC2cModeInfoV": "supported" if ORDER[b] >= ORDER["R550"] else "FUNCTION_NOT_FOUND",
    }
    calls["fields 231-234 C2C_LINK_ERROR_INTR/REPLAY/REPLAY_B2B/POWER_STATE"] = (
        "supported (R575+)" if ORDER[b] >= ORDER["R580"] else "INVALID_ARGUMENT (first in the 12.9 / R575 header)"
    )
    return cell(
        "supported" if ORDER[b] >= ORDER["R580"] else "partial",
        calls,
        ["fields 170-172", "fields 231-234"],
        None,
        hb(b) + ["h12.9"],
        "values on real GH200/GB200: unknown, no public measurement",
        "documented",
    )


def planned_cc(g, b):
    calls = {
        "nvmlSystemGetConfComputeState": "supported",
        "nvmlSystemGetConfComputeGpusReadyState": "supported",
        "nvmlSystemGetConfComputeCapabilities": "supported",
        "nvmlDeviceGetConfComputeMemSizeInfo": "supported",
        "nvmlDeviceGetConfComputeProtectedMemoryUsage": "supported",
        "nvmlSystemGetConfComputeSettings": "supported" if ORDER[b] >= ORDER["R550"] else "FUNCTION_NOT_FOUND",
        "nvmlDeviceGetConfComputeGpuReadyState": "does not exist (no such symbol in any header 12.2-13.3)",
    }
    note = "system-wide, not per GPU; 'For Ampere or newer' (header); CC mode itself is Hopper+ hardware: on Ampere/Ada ccFeature reads DISABLED or NOT_SUPPORTED (unknown which)"
    conf = "documented"
    if g in ("ampere_ga100", "ampere_ga10x", "ada"):
        conf = "unknown"
    if is_measured(g, b):
        note += "; nvidia-smi -q on H200/580 shows 'Conf Compute Protected Memory Usage' 0 MiB (CC off)"
    return cell(
        "supported" if conf != "unknown" else "unknown",
        calls,
        ["nvmlSystemGetConfComputeState", "nvmlSystemGetConfComputeGpusReadyState"],
        "none needed: the exporter reads nvmlSystemGetConfComputeState and nvmlSystemGetConfComputeGpusReadyState (every header from 12.2); the settings call (R550+) and a per-GPU ready state (no such symbol) are not called",
        hb(b),
        note,
        conf,
    )


def planned_temp_thresholds(g, b):
    calls = {
        "nvmlDeviceGetTemperatureThreshold SHUTDOWN(0)/SLOWDOWN(1)/GPU_MAX(3)": "supported",
        "nvmlDeviceGetTemperatureThreshold MEM_MAX(2)": "supported",
        "fields 193-196 *_TLIMIT": "supported (Ada and later)",
        "nvmlDeviceGetMarginTemperature": "supported" if ORDER[b] >= ORDER["R570"] else "FUNCTION_NOT_FOUND",
    }
    note = "the header says the threshold call is no longer preferred on Ada+ and support there 'would be removed' in favour of fields 193-196"
    conf = "documented"
    if g in ("ampere_ga100", "ampere_ga10x"):
        calls["fields 193-196 *_TLIMIT"] = "NOT_SUPPORTED (inferred: 'supported on Ada and later')"
    if g in ("ampere_ga10x", "ada", "blackwell_rtx"):
        calls["nvmlDeviceGetTemperatureThreshold MEM_MAX(2)"] = "unknown (GDDR board)"
    if is_measured(g, b):
        note += "; measured H200: shutdown 95, slowdown 89, GPU max 87 C; T.Limit fields -8/-2/0; margin 50 idle"
        conf = "measured"
    return cell(
        "supported",
        calls,
        list(calls),
        "fields 193-196 (Ada+) or nvmlDeviceGetTemperatureThreshold; margin call R570+",
        hb(b) + ["gpud-margin"] + (MEAS if is_measured(g, b) else []),
        note,
        conf,
        is_measured(g, b),
    )


def planned_module_power(g, b):
    if g not in ("hopper_gh200", "blackwell_gb200"):
        return cell(
            "unsupported",
            {"field 185/186 scope 1": "NOT_SUPPORTED"},
            [],
            None,
            hb(b) + (["measured-h200-580-fabric-power"] if is_measured(g, b) else []),
            "module scope needs an NVIDIA CPU (header)",
            "measured" if is_measured(g, b) else "documented",
            is_measured(g, b),
        )
    return cell(
        "supported",
        {
            "field 185 scope 1 (module average)": "supported (reported)",
            "field 186 scope 1 (module instant)": "supported (reported)",
            "fields 187-190 scope 1 (module limits)": "supported (reported)",
            "nvmlDeviceGetTotalEnergyConsumption": "module-wide on GH200 (reported); GB200 unknown",
        },
        ["field 185 scope 1"],
        None,
        hb(b) + ["hardware-sampling-5", "k8s-test-infra-676", "zeus-172"],
        "values and whether R535/R550 answer: unknown",
        "reported",
    )


# capability -> its rule; each lives inside a feature (nvlink, fabric, temperature, power): c2c and
# confidential_computing became features of their own (FEATURE_RULES)
CAPABILITIES = {
    "nvlink5_counters": planned_nvlink5,
    "fabric_health": planned_fabric_health,
    "temperature_thresholds": planned_temp_thresholds,
    "module_power": planned_module_power,
}


CODES = [
    ("supported, deprecated", "deprecated"),
    ("supported by the driver", "not_in_binding"),
    ("supported", "supported"),
    ("NOT_SUPPORTED", "NOT_SUPPORTED"),
    ("0 or NOT_SUPPORTED", "NOT_SUPPORTED"),
    ("isSupportedDevice 0", "NOT_SUPPORTED"),
    ("FUNCTION_NOT_FOUND", "FUNCTION_NOT_FOUND"),
    ("does not exist", "FUNCTION_NOT_FOUND"),
    ("ARGUMENT_VERSION_MISMATCH", "ARGUMENT_VERSION_MISMATCH"),
    ("INVALID_ARGUMENT", "INVALID_ARGUMENT"),
    ("NO_PERMISSION", "NO_PERMISSION"),
    ("unknown", "unknown"),
    ("not asked", "not_called"),
    ("absent", "absent"),
    ("module-wide", "supported"),
]


def split_note(text):
    """'a; b (c; d)' -> ['a', 'b (c; d)']: split on '; ' outside parentheses."""
    parts, depth, cur = [], 0, ""
    i = 0
    while i < len(text):
        ch = text[i]
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and text.startswith("; ", i):
            parts.append(cur)
            cur = ""
            i += 2
            continue
        cur += ch
        i += 1
    parts.append(cur)
    return [p for p in (x.strip() for x in parts) if p]


def short_key(name):
    m = re.match(r"fields? (\d[\d/\-]*(?:, \d[\d/\-]*)*)(.*)", name)
    if not m:
        return name
    return (
        "field "
        + m.group(1).replace(", ", ",")
        + (" scope" + m.group(2).split("scope", 1)[1].split("(")[0].rstrip() if "scope" in m.group(2) else "")
    )


def normalize(table):
    """Short answer codes in the cells; the explanations once per feature (call_notes); a fallback shared by all cells once per feature."""
    out = {}
    for f, gens in table.items():
        call_notes = {}
        long_names = {}
        fallbacks = set()
        for bs in gens.values():
            for c in bs.values():
                if c["fallback"]:
                    fallbacks.add(c["fallback"])
        shared_fb = fallbacks.pop() if len(fallbacks) == 1 else None
        cells = {}
        for g, bs in gens.items():
            cells[g] = {}
            for b, c in bs.items():
                answers = {}
                for call, text in c["calls"].items():
                    code = next((v for k, v in CODES if text.startswith(k)), None)
                    assert code, (f, call, text)
                    key = short_key(call)
                    long_names.setdefault(key, call)
                    if code != "supported":
                        answers[key] = code
                    rest = text[len(next(k for k, v in CODES if text.startswith(k))) :].strip(" ,;()")
                    if rest or code in ("not_in_binding",):
                        call = short_key(call)
                        call_notes.setdefault(call, [])
                        if rest and rest not in call_notes[call]:
                            call_notes[call].append(rest)
                new = {"status": c["status"], "answers": answers, "uses": [short_key(u) for u in c["uses"]]}
                if c["fallback"] and c["fallback"] != shared_fb:
                    new["fallback"] = c["fallback"]
                if c["measured"]:
                    new["measured"] = True
                if c["confidence"] != "documented":
                    new["confidence"] = c["confidence"]
                new["sources"] = c["sources"]
                if c["note"]:
                    new["note"] = c["note"]
                cells[g][b] = new
        gen_notes = {}
        for g, bs in cells.items():
            live = [c for c in bs.values() if c["status"] != "not_applicable"]
            if not live:
                continue
            sets = [set(s for s in split_note(c.get("note", "")) if s) for c in live]
            shared = [s for s in split_note(live[0].get("note", "")) if s and all(s in x for x in sets)]
            if shared:
                gen_notes[g] = shared
                for c in live:
                    kept = [s for s in split_note(c["note"]) if s and s not in shared]
                    if kept:
                        c["note"] = "; ".join(kept)
                    else:
                        del c["note"]
        everywhere = [
            s
            for s in next(iter(gen_notes.values()), [])
            if len(gen_notes) == len(cells) and all(s in v for v in gen_notes.values())
        ]
        common = everywhere
        for g in list(gen_notes):
            gen_notes[g] = [s for s in gen_notes[g] if s not in everywhere]
            if not gen_notes[g]:
                del gen_notes[g]
        for g in cells.values():
            for c in g.values():
                default_uses = (
                    [k for k in long_names if c["answers"].get(k, "supported") in ("supported", "deprecated")]
                    if c["status"] != "not_applicable"
                    else []
                )
                if c["uses"] == default_uses:
                    del c["uses"]
        out[f] = {
            "fallback": shared_fb,
            "notes": common,
            "notes_by_generation": gen_notes,
            "calls": long_names,
            "call_notes": call_notes,
            "cells": cells,
        }
    return out


def build(feature_names):
    cells = {}
    for f in feature_names:
        cells[f] = {}
        for g in GENS:
            cells[f][g] = {}
            for b in BRANCHES:
                st, _, _ = branch_support(g, b)
                if st == "no" and f not in (
                    "nvlink_links",
                    "details",
                    "process_usage",
                    "kernel_xid",
                    "pod_attribution",
                ):
                    c = na_cell(g, b, f)
                elif st == "no":
                    c = na_cell(g, b, f)
                else:
                    c = FEATURE_RULES[f](g, b)
                    if st == "unknown":
                        if c["status"] not in ("unsupported",):
                            c["status"] = "unknown"
                        c["note"] = (
                            "GPU on this branch: unknown ("
                            + branch_support(g, b)[1]
                            + "); answers if it is driven: "
                            + c["note"]
                        ).strip()
                        c["sources"] = sorted(set(c["sources"] + branch_support(g, b)[2]))
                        if c["confidence"] == "measured":
                            c["confidence"] = "documented"
                cells[f][g][b] = c
    planned = {}
    for p, rule in CAPABILITIES.items():
        planned[p] = {}
        for g in GENS:
            planned[p][g] = {}
            for b in BRANCHES:
                st, _, _ = branch_support(g, b)
                c = na_cell(g, b, p) if st == "no" else rule(g, b)
                if st == "unknown":
                    if c["status"] != "unsupported":
                        c["status"] = "unknown"
                    c["note"] = (
                        "GPU on this branch: unknown ("
                        + branch_support(g, b)[1]
                        + "); answers if it is driven: "
                        + c["note"]
                    ).strip()
                    c["sources"] = sorted(set(c["sources"] + branch_support(g, b)[2]))
                planned[p][g][b] = c
    return cells, planned


def main():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    from guards.featuretable import FEATURES

    names = list(FEATURES)
    missing = set(names) - set(FEATURE_RULES)
    assert not missing, missing
    cells, planned = build(names)
    used = set()
    for table in (cells, planned):
        for f in table.values():
            for g in f.values():
                for c in g.values():
                    used.update(c["sources"])
    for g in GENERATIONS.values():
        used.update(g["sources"])
    for b in BRANCH_INFO.values():
        used.update(b["sources"])
    unknown = used - set(SOURCES)
    assert not unknown, unknown
    doc = {
        "schema": 2,
        "date": "2026-12-01",
        "description": "Capability table of nvgpu-exporter (docs/capabilities.md): per feature (guards/featuretable.py FEATURES), GPU generation and driver branch, "
        "the NVML calls and fields used, what they answer there, the fallback, and the source of every cell. 'capabilities' holds the capabilities inside "
        "features added for the newer generations (NVLink5 counters, fabric health, temperature thresholds, module power), with the same shape.",
        "statuses": {
            "supported": "the feature gives values with the calls listed",
            "partial": "some of the feature's calls or series answer, others do not",
            "unsupported": "every call of the feature answers NOT_SUPPORTED / FUNCTION_NOT_FOUND (or the hardware lacks the unit): an explained absence",
            "not_applicable": "the driver branch does not drive this GPU",
            "unknown": "no public source found and not measured",
        },
        "confidence": {
            "measured": "measured on H200 / 580.159.04 (the only hardware measured)",
            "documented": "nvml.h, nvidia-ml-py source or an NVIDIA document says so",
            "reported": "a public issue or third-party code reports it",
            "inferred": "follows from documented facts, not stated anywhere",
            "unknown": "no public source",
        },
        "branches": BRANCH_INFO,
        "generations": GENERATIONS,
        "sources": {k: SOURCES[k] for k in sorted(used)},
        "features": normalize(cells),
        "capabilities": normalize(planned),
    }
    json.dumps(doc, indent=1, sort_keys=False, ensure_ascii=False)
    # one cell per line: collapse the innermost objects

    json.dumps(doc, ensure_ascii=False, indent=None)

    # pretty-print with cells on one line each
    def dump(obj, depth, path):
        pad = " " * depth
        if (
            isinstance(obj, dict)
            and path
            and (
                path[0] in ("features", "capabilities")
                and len(path) == 5
                and path[2] == "cells"
                or path[0] in ("sources",)
                and len(path) == 2
                or path[0] in ("branches", "generations")
                and len(path) == 2
            )
        ):
            return json.dumps(obj, ensure_ascii=False)
        if isinstance(obj, dict):
            items = [pad + " " + json.dumps(k) + ": " + dump(v, depth + 1, path + [k]) for k, v in obj.items()]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        return json.dumps(obj, ensure_ascii=False)

    text = dump(doc, 0, []) + "\n"
    json.loads(text)
    if "--check" in sys.argv:
        current = (pathlib.Path(__file__).parent / "capabilities.json").read_text()
        sys.exit(
            0
            if current == text
            else "docs/capabilities.json differs from its generator: run python3 docs/generate_capabilities.py"
        )
    (pathlib.Path(__file__).parent / "capabilities.json").write_text(text)
    print(len(text), "bytes")


if __name__ == "__main__":
    main()
