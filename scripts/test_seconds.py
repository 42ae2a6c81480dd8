"""Write tests/module_seconds.json, the seconds each slow test module took, from the output of a whole-suite run
with ``--durations=0`` (``pytest -n 2 --durations=0 > suite.log``): tests/conftest.py hands modules to the xdist
workers longest first by this table, so that no long module starts last while the other worker idles.

    .venv/bin/python scripts/test_seconds.py suite.log
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter

ROW = re.compile(r"^(\d+\.\d+)s (?:call|setup|teardown)\s+(\S+?)::")
SMALLEST = 20.0  # modules quicker than this are estimated from their test count


def module_seconds(lines) -> dict[str, int]:
    seconds = Counter()
    for line in lines:
        match = ROW.match(line)
        if match:
            seconds[match.group(2)] += float(match.group(1))
    return {module: round(total) for module, total in seconds.most_common() if total >= SMALLEST}


def main() -> None:
    with open(sys.argv[1]) as handle:
        table = module_seconds(handle)
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "module_seconds.json")
    with open(path, "w") as out:
        json.dump(table, out, indent=1)
        out.write("\n")
    print(f"{len(table)} modules, {sum(table.values())} s: {path}")


if __name__ == "__main__":
    main()
