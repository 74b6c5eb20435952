"""``python -m pyfastensor``: see ``python -m pyfastensor --help``."""

from .cli import main

raise SystemExit(main())
