"""``python -m benchmarks``: see :mod:`benchmarks`."""

import sys

from . import main

sys.exit(main())
