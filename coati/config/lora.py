"""LoRA adapters on the trained models (ModelConfig's ``lora`` section): each field is a flag, a YAML key and a
pipeline key, with the meaning peft's ``LoraConfig`` gives it. Rank 0 (the default) trains every weight.

What changes with a rank: the base weights are frozen and only the adapters (and a critic's value head) train;
the KL term's reference is the policy with its adapters switched off; a weight version is the adapter tensors
(engines that take adapters load them in place, others get merged full weights); checkpoints hold a PEFT adapter
directory. The machinery: coati/models/lora.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from coati.utils.dataclass_cli import option

# peft's name for "every linear layer but the output head": the attention and MLP projections of a decoder.
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoraConfig:
    lora_rank: int = option(0, "LoRA rank r of the adapters on the trained models (0: full fine-tuning). Base "
                               "weights freeze, optimizer states exist only for the adapters, and weight syncs "
                               "carry the adapters alone")
    lora_alpha: float = option(16.0, "LoRA scaling numerator: an adapter adds (alpha / r) * B A to its weight")
    lora_dropout: float = option(0.0, "dropout on the adapters' input while training")
    lora_target_modules: tuple[str, ...] = option(
        (), "module names that get adapters, e.g. q_proj v_proj (repeatable; default all-linear: every linear "
            "projection of the attention and MLP blocks, not the LM head)",
        kind=str, repeat=True, metavar="NAME")

    @property
    def enabled(self) -> bool:
        return self.lora_rank > 0

    @property
    def targets(self) -> tuple[str, ...]:
        """The module names to adapt; ``all-linear`` when none were named."""
        return self.lora_target_modules or (ALL_LINEAR,)

    @property
    def scaling(self) -> float:
        """The factor of ``B @ A`` in a merged weight (peft's ``lora_alpha / r``)."""
        return self.lora_alpha / self.lora_rank

    def check(self) -> None:
        from coati.config.errors import require

        require(self.lora_rank >= 0, f"--lora-rank must be >= 0 (got {self.lora_rank}); 0 turns LoRA off")
        if not self.enabled:
            return
        require(self.lora_alpha > 0, f"--lora-alpha must be > 0 (got {self.lora_alpha:g})")
        require(0.0 <= self.lora_dropout < 1.0, f"--lora-dropout must be in [0, 1) (got {self.lora_dropout:g})")
