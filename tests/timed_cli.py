"""``python tests/timed_cli.py FLAGS...`` runs rl_example.py's main with FLAGS and writes the seconds main took,
imports excluded, to the file $TIMED_CLI_OUT: a test can bound the time a failure takes to report without
counting Python's start-up on a loaded machine. Its output is rl_example.py's own."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import coati.distributed.launch  # noqa: E402,F401 - the imports main makes, done before the clock starts
from coati.train import main  # noqa: E402

start = time.time()
code = main(sys.argv[1:])
with open(os.environ["TIMED_CLI_OUT"], "w") as handle:
    handle.write(f"{time.time() - start:.3f}")
sys.exit(code)
