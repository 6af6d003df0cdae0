"""Code both processes run: the contract between them (``protocol``, ``snapshot``, ``workerconfig``,
``decode``, ``breadcrumb``), logging, the self-check, ``metric``, the collectors (``read()`` runs in the
worker, ``families()`` in the supervisor), the per-GPU state kinds collectors declare (``gpustate``) and
the fake-NVML scenarios with their standard-library-only check (``scenarios/``, which ``Config`` runs).
Nothing is imported here.
"""
