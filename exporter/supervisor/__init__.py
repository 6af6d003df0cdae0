"""The supervisor process: runs the worker, keeps what survives it, and serves HTTP. Code here runs
only in the supervisor (``python -m exporter``, ``nvgpu-exporter``); the worker never imports it
(``tests/test_process_modules.py``). Nothing is imported here.

The worker's life (``supervisor``, ``workerproc``, ``probes``, ``policy``, ``accounting``,
``unavailable``, ``quarantine``, ``gpuhealth``), what is served (``served``, ``xids``, ``exposition``,
``selfmetrics``, ``procmetrics``, ``statuspage``), the extensions (``extensions``, ``stuck``,
``kernel_xid`` with ``xid/``, ``pods`` with ``podresources/``) and the HTTP side (``http/``).
"""
