"""``python -m exporter.worker``: the worker process (:func:`exporter.worker.main.main`), as the supervisor
starts it. Leaves with ``os._exit``: no interpreter teardown while NVML threads may be alive."""

import os
import sys

from exporter.common import protocol
from exporter.worker.main import main

try:
    code = main()
except BaseException:  # noqa: BLE001 - report, then leave without interpreter teardown
    import traceback

    traceback.print_exc()
    code = protocol.EXIT_ERROR
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)  # do not run interpreter teardown with NVML threads possibly alive
