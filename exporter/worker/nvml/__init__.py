"""The real NVML path, and the only package of the product that imports the ``pynvml`` binding.

``backend`` loads the binding (or, lazily, the fake in :mod:`exporter.worker.fakenvml`), ``client`` makes
every call (breadcrumb, counting, capability cache), ``structs`` fills caller-allocated structs, and
``errors`` is the one table of what each return code means. Nothing is imported here.
"""
