"""``python -m exporter`` is the same as the ``nvgpu-exporter`` command."""

import sys

from exporter.cli import main

sys.exit(main())
