"""The fake NVML backend: a scenario-driven stand-in for ``pynvml`` with real faults (docs/scenarios.md).

Tests, demos and benchmarks run the real worker on it (``NVGPU_NVML_BACKEND=fake:<scenario>``). It
lives apart from :mod:`exporter.worker.nvml`, the real path; the only way in is the backend loader
(:func:`exporter.worker.nvml.backend.load`), importing lazily. Its standard-library-only half, the
scenario check ``Config`` runs in the supervisor and the value kinds and record layouts the fake
evaluates, is :mod:`exporter.common.scenarios`. The modules here import ``pynvml`` for its error
class and struct types. Nothing is imported here; ``FakeNvml`` is in
:mod:`exporter.worker.fakenvml.binding`.
"""
