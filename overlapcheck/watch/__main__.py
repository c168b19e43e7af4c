"""``python -m overlapcheck.watch [options] -- python script.py [args...]``."""
import sys

from .command import main

sys.exit(main())
