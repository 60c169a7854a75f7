"""``python -m turngym.cli``: the same command as ``turngym``."""

import sys

from turngym.cli import main

sys.exit(main())
