"""``python -m coati COMMAND``: the same as the ``coati`` console script."""

import sys

from coati.cli import main

sys.exit(main())
