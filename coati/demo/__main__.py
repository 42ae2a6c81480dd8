"""Build (or rebuild) the cached demo assets: ``python -m coati.demo [--code | --tool] [--rebuild]``.

Prints where the model and the task's files are, and the warm start's chosen checkpoint.
"""

from __future__ import annotations

import argparse
import json
import shutil

from coati.demo.code_demo import CodeDemoRecipe, ensure_code_demo_assets
from coati.demo.assets import demo_root
from coati.demo.math_demo import DemoRecipe, ensure_demo_assets
from coati.demo.tool_demo import ToolDemoRecipe, ensure_tool_demo_assets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", default=None, help="default: $COATI_CACHE or ~/.cache/coati")
    parser.add_argument("--rebuild", action="store_true", help="delete the cached demo assets first")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--code", action="store_true", help="the code demo's assets (rl_example.py -rt code)")
    which.add_argument("--tool", action="store_true", help="the tool demo's assets (rl_example.py --env tool_demo)")
    args = parser.parse_args()
    if args.code:
        recipe, build = CodeDemoRecipe(), ensure_code_demo_assets
    elif args.tool:
        recipe, build = ToolDemoRecipe(), ensure_tool_demo_assets
    else:
        recipe, build = DemoRecipe(), ensure_demo_assets
    root = demo_root(args.cache_dir, recipe)
    if args.rebuild:
        shutil.rmtree(root, True)
    assets = build(args.cache_dir)
    print(json.dumps({"model_dir": assets.model_dir, "train": assets.train_path, "eval": assets.eval_path,
                      "chosen": assets.report["chosen"]}, indent=1))


if __name__ == "__main__":
    main()
