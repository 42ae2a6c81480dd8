"""Cost of one call of the sandboxed python tool (a fresh process per call in the tool's sandbox), as the model makes it.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_python_tool.py [--calls 30]

Prints wall seconds per call (median, p90) for a trivial program, a 3-digit product, and the hostile calls the
tests use (which end in an error observation), and calls/s of one worker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from coati.rollout.python_tool import PythonToolOptions, make_python_tool  # noqa: E402
from coati.rollout.tools import Toolbox  # noqa: E402

PROGRAMS = {
    "print": "print('hi')",
    "product": "print(123 * 456)",
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "network": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)",
    "memory": "x = bytearray(1 << 34)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    tool = make_python_tool(PythonToolOptions(cpu_time_s=1, wall_time_s=3.0))
    box = Toolbox([tool])
    for name, code in PROGRAMS.items():
        call = json.dumps({"name": "python", "arguments": {"code": code}})
        calls = args.calls if name in ("print", "product") else max(3, args.calls // 10)
        seconds, errors = [], 0
        start = time.perf_counter()
        for _ in range(calls):
            _, result = box.call(call)
            seconds.append(result.seconds)
            errors += result.error
        total = time.perf_counter() - start
        p90 = sorted(seconds)[int(0.9 * (len(seconds) - 1))]
        print(f"{name:10s} calls {calls:3d}  median {statistics.median(seconds) * 1000:6.1f} ms  p90 {p90 * 1000:6.1f} ms"
              f"  {calls / total:5.1f} calls/s  errors {errors}/{calls}")
    tool.close()


if __name__ == "__main__":
    main()
