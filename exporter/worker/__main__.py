"""``python -m exporter.worker``: the worker process (:func:`exporter.worker.main.main`), as the supervisor
starts it. Leaves with ``os._exit``: no interpreter teardown while NVML threads may be alive. After
a SIGTERM (stopped in order) it ends by SIGTERM, so its parent sees who ended it
(``exporter/supervisor/deaths.py``)."""

import os
import signal
import sys

from exporter.common import protocol
from exporter.worker.main import TERMINATED, main

try:
    code = main()
except BaseException:  # noqa: BLE001 - report, then leave without interpreter teardown
    import traceback

    traceback.print_exc()
    code = protocol.EXIT_ERROR
sys.stdout.flush()
sys.stderr.flush()
if TERMINATED.is_set():  # a SIGTERM ended it: say so in the exit status, as an unhandled SIGTERM would
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
os._exit(code)  # do not run interpreter teardown with NVML threads possibly alive
