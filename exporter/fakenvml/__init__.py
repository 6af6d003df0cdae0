"""The fake NVML backend: a scenario-driven stand-in for ``pynvml`` with real faults (docs/scenarios.md).

Tests, demos and benchmarks run the real worker on it (``NVGPU_NVML_BACKEND=fake:<scenario>``).
It lives apart from :mod:`exporter.nvml`, the real path; the only ways in are the backend loader
(:func:`exporter.nvml.backend.load`, in the worker) and ``Config``'s scenario check, both importing
lazily. Nothing is imported here: :mod:`exporter.fakenvml.scenario`, :mod:`~exporter.fakenvml.spec`
and :mod:`~exporter.fakenvml.records` are standard library only (the supervisor runs them), the
rest imports ``pynvml`` for its error class and struct types. ``FakeNvml`` is in
:mod:`exporter.fakenvml.binding`.
"""
