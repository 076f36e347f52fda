"""``python -m hospital_agent``: the same as ``medsplit-agent``."""

import sys

from hospital_agent.cli import main

sys.exit(main())
