"""The fake NVML backend: a scenario-driven stand-in for ``pynvml`` with real faults (docs/scenarios.md).

Tests, demos and benchmarks run the real worker on it (``NVGPU_NVML_BACKEND=fake:<scenario>``).
It lives apart from :mod:`exporter.worker.nvml`, the real path; the only ways in are the backend loader
(:func:`exporter.worker.nvml.backend.load`, in the worker) and ``Config``'s scenario check, both importing
lazily. Nothing is imported here: :mod:`exporter.common.scenarios.scenario`, :mod:`~exporter.common.scenarios.spec`
and :mod:`~exporter.common.scenarios.records` are standard library only (the supervisor runs them), the
rest imports ``pynvml`` for its error class and struct types. ``FakeNvml`` is in
:mod:`exporter.worker.fakenvml.binding`.
"""
