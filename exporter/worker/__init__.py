"""The worker process: the only process that imports ``pynvml``. Code here runs only in the worker
(``python -m exporter.worker``, and the supervisor's expendable probe workers); the supervisor never
imports it (``tests/test_process_modules.py``). Nothing is imported here.

``main`` (the process: pipe, init, sampling loop, orderly shutdown), ``sampler`` and ``gpuslot`` (one
thread per GPU), ``nvml_events`` (the event thread), ``nvml/`` (the real NVML path), ``fakenvml/`` (the
scenario-driven fake, for tests and demos), and what the processes collector's ``read()`` needs on
the host: ``process_records``, ``process_attribution``, ``procfs``, ``containerlogs``.
"""
