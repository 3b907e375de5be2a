import sys

from labctl.cli import main

sys.exit(main())
