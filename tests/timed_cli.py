"""``python tests/timed_cli.py FLAGS...`` is rl_example.py FLAGS, and also writes to the file $TIMED_CLI_OUT the
seconds spent in ``launch.run`` (joining the cluster, placing the actors, training) until it returned or
raised: a test can bound how long a cluster failure takes to report without counting Python's start-up and the
flag checks' imports, which a loaded 2-core machine stretches to tens of seconds. The output is rl_example.py's."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import coati.launcher.rl as launch  # noqa: E402
from coati.train import main  # noqa: E402

real_run = launch.run


def timed_run(*args, **kwargs):
    start = time.time()
    try:
        return real_run(*args, **kwargs)
    finally:
        with open(os.environ["TIMED_CLI_OUT"], "w") as handle:
            handle.write(f"{time.time() - start:.3f}")


launch.run = timed_run
sys.exit(main(sys.argv[1:]))
