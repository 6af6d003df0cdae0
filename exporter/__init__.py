"""nvgpu-exporter: a Prometheus exporter for NVIDIA GPUs with a supervised NVML worker.

Nothing here imports third-party modules or starts anything: `guards` and the self-check import
this package before any dependency is known to be healthy.
"""

__version__ = "0.1.0"
