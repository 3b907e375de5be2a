"""``python -m scheduler.simulate``: see ``scheduler.simulate.cli``."""

import sys

from scheduler.simulate.cli import main

sys.exit(main())
