"""``coati export --merge CKPT OUT``: a LoRA checkpoint (a PEFT adapter directory, as ``--lora-rank`` runs save
them) as a plain HF model directory with the adapter merged into the base weights; ``transformers``,
vLLM and ``coati evaluate`` load it like any model."""

from __future__ import annotations

import os
import sys

DESCRIPTION = ("Merge a LoRA checkpoint (adapter_config.json + adapter_model.safetensors, e.g. a --lora-rank run's "
               "step_N) into its base model and write a plain HF model directory with the tokenizer.")


def build_parser(prog: str):
    from coati.utils.flag_parser import FlagParser

    parser = FlagParser(prog=prog, description=DESCRIPTION)
    parser.add_argument("checkpoint", help="the adapter directory (a run's step_N or final checkpoint)")
    parser.add_argument("out", help="the new model directory (must not exist, or be empty)")
    parser.add_argument("--merge", action="store_true", help="merge the adapter into the base weights (required: "
                                                            "the one export there is)")
    parser.add_argument("--base", default=None, help="the base model directory (default: the one the adapter "
                                                     "names, base_model_name_or_path)")
    return parser


def problem(checkpoint: str, out: str, base: str | None, merge: bool) -> str | None:
    """Why the export cannot run, in one line (None: it can)."""
    from coati.models.lora import adapter_base, is_adapter_dir

    if not merge:
        return "say what to export: --merge (the adapter merged into its base model)"
    if not is_adapter_dir(checkpoint):
        return (f"{checkpoint} is not a LoRA adapter directory (no adapter_config.json); a full-model checkpoint "
                "already loads with from_pretrained")
    base = base or adapter_base(checkpoint)
    if not os.path.isfile(os.path.join(base, "config.json")):
        return (f"the base model of {checkpoint} ({base or 'not named'}) is not an HF directory here: pass it with "
                "--base DIR")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        return f"{out} already exists and is not an empty directory: choose a new output directory"
    return None


def main(argv: list[str] | None = None, prog: str = "coati export") -> int:
    args = build_parser(prog).parse_args(argv)
    why = problem(args.checkpoint, args.out, args.base, args.merge)
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    from coati.models.lora import export_merged

    export_merged(args.checkpoint, args.out, args.base)
    print(f"merged {args.checkpoint} into a full model: {args.out}")
    return 0
