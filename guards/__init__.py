"""Guards: decide what the exporter may do before any third-party code is trusted.

Standard library only, in every module and every type hint: this package is imported by both the
supervisor and the worker *before* `pynvml`, `prometheus_client`, `aiohttp` or `psutil` is known to
be healthy (a shadowed or mismatched dependency is one of the things it detects). Importing it runs
nothing except building constant tables.

Modules:
    featuretable: the feature registry (`FEATURES`), as data.
    features: `NVGPU_FEATURE_<NAME>=auto|on|off` parsing and the resolution of each feature's
        effective state and the reason for it.
    known_issues: data-driven known-issue rules (`known_issues.json`) matched by GPU model, driver
        and nvidia-ml-py version ranges.
    versions: the self-check of the modules a process actually imported, and the nvidia-ml-py
        binding branch against the driver branch.

See docs/design.md, sections "Features and guards" and "Self-check".
"""
