"""``python -m training.importers``: see ``training.importers.cli``."""

from __future__ import annotations

import sys

from training.importers.cli import main

sys.exit(main())
