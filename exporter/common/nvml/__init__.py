"""What both processes know of NVML without the binding: its return codes and what each means
(``errors``, standard library only). The worker classifies every failed call with it; the
supervisor's scenario check (``Config``) reads NVML error names in fake scenarios with it. The
binding itself is reached only under :mod:`exporter.worker.nvml`. Nothing is imported here.
"""
