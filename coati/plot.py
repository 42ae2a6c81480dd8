"""``python -m coati.plot RUN_DIR``: PNG plots of a training run (see coati.utils.plot)."""

import sys

from coati.utils.plot import main

if __name__ == "__main__":
    sys.exit(main())
