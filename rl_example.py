"""Distributed RL post-training over Ray: ``python rl_example.py --help`` lists the flags.

The same program as ``coati train`` (coati/train.py). With no arguments it runs the embedded demo: a tiny
Qwen2 (built and warm-started locally, cached) learns 2-digit addition with GRPO, and held-out accuracy is
printed before and after.
"""

from __future__ import annotations

import sys

from coati.train import main, placeholder_demo as _placeholder_demo  # noqa: F401 - tests build configs with it

if __name__ == "__main__":
    sys.exit(main())
