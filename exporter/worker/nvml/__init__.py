"""The real NVML path: with the fake (:mod:`exporter.worker.fakenvml`), the only package of the
product that imports the ``pynvml`` binding.

``backend`` loads the binding (or, lazily, the fake), ``client`` makes every call (breadcrumb,
counting, capability cache) and ``structs`` fills caller-allocated structs. What each return code
means is :mod:`exporter.common.nvml.errors` (standard library only, so the supervisor's scenario
check can read error names too). Nothing is imported here.
"""
