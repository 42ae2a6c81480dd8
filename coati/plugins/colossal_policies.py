"""Our shardformer policy for Qwen2 causal LMs under transformers 5 (ColossalAI 0.5.0 targets 4.51).

Passed to ``HybridParallelPlugin(custom_policy=...)``. It keeps ColossalAI's Qwen2 policy (TP layer
replacements, held layers per stage, tied-weight sharing across stages) and changes two things:

- LM head: ``VocabParallelLMHead1D`` (TP) or ``PaddingLMHead`` (tied, no TP) instead of ``Linear1D_Col``,
  so vocabularies that the TP size does not divide are padded (``make_vocab_size_divisible_by``) like the
  embedding, and the gathered logits are cut back to the real vocabulary.
- Pipeline forward: ColossalAI's ``qwen2_for_causal_lm_forward`` calls ``Qwen2DecoderLayer.forward`` with
  the transformers-4.51 argument list; ``pipeline_causal_lm_forward`` below follows transformers 5.19's
  ``Qwen2Model.forward`` (rotary embeddings and the causal mask built on every stage from the micro-batch's
  ``attention_mask``, which every stage receives) and ignores the extra micro-batch keys the loss needs.
"""

from __future__ import annotations

from functools import partial

import torch


def pipeline_causal_lm_forward(self, input_ids=None, attention_mask=None, hidden_states=None, stage_manager=None,
                               stage_index=None, shard_config=None, **unused):
    """One pipeline stage of a decoder causal LM: a dict of hidden states, or the logits on the last stage (the
    family's head shaping applied: coati.models.families.decoder_stage)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    from coati.models.families import decoder_stage

    first, last = stage_manager.is_first_stage(), stage_manager.is_last_stage()
    start, end = stage_index
    layers = {index: self.model.layers[index] for index in range(start, end)}
    out = decoder_stage(self.model, layers, input_ids if first else hidden_states, attention_mask, first, last,
                        self.lm_head if last else None)
    return CausalLMOutputWithPast(logits=out) if last else {"hidden_states": out}


def _qwen2_policy_cls():
    from colossalai.shardformer.layer import PaddingLMHead, VocabParallelLMHead1D
    from colossalai.shardformer.policies.base_policy import SubModuleReplacementDescription
    from colossalai.shardformer.policies import qwen2 as colossal_qwen2
    from colossalai.shardformer.policies.qwen2 import Qwen2ForCausalLMPolicy

    # ColossalAI's policy module falls back to class *names* as policy keys when its transformers-4.51
    # imports fail (they do under transformers 5); use the same key it uses.
    Qwen2ForCausalLM = colossal_qwen2.Qwen2ForCausalLM

    class CoatiQwen2ForCausalLMPolicy(Qwen2ForCausalLMPolicy):
        def module_policy(self):
            policy = super().module_policy()
            config = self.shard_config
            if config.enable_tensor_parallelism:
                head = SubModuleReplacementDescription(
                    suffix="lm_head", target_module=VocabParallelLMHead1D,
                    kwargs=dict(gather_output=not config.parallel_output,
                                make_vocab_size_divisible_by=config.make_vocab_size_divisible_by))
            elif self.tie_weight:
                head = SubModuleReplacementDescription(
                    suffix="lm_head", target_module=PaddingLMHead,
                    kwargs=dict(make_vocab_size_divisible_by=config.make_vocab_size_divisible_by))
            else:
                head = None
            if head is not None:
                self.append_or_create_submodule_replacement(description=head, policy=policy,
                                                            target_key=Qwen2ForCausalLM)
                replacements = policy[Qwen2ForCausalLM].sub_module_replacement
                policy[Qwen2ForCausalLM].sub_module_replacement = (
                    [r for r in replacements if r.suffix != "lm_head"] + [head])
            description = policy.get(Qwen2ForCausalLM)
            if description is not None and description.method_replacement:
                description.method_replacement.pop("forward", None)  # the 4.51 dist-cross-entropy forward
            if self.pipeline_stage_manager is not None:
                stage_manager = self.pipeline_stage_manager
                layers_per_stage = stage_manager.distribute_layers(len(self.model.model.layers))
                stage_index = stage_manager.get_stage_index(layers_per_stage)
                self.append_or_create_method_replacement(
                    description={"forward": partial(pipeline_causal_lm_forward, stage_manager=stage_manager,
                                                    stage_index=stage_index, shard_config=config)},
                    policy=policy, target_key=Qwen2ForCausalLM)
            return policy

    return CoatiQwen2ForCausalLMPolicy


def policy_for(model_config):
    """The custom policy for ``model_config``'s family; ValueError when we have none."""
    family = getattr(model_config, "model_type", None)
    if family == "qwen2":
        return _qwen2_policy_cls()()
    raise ValueError(f"no ColossalAI policy of ours for {family!r} models (supported: qwen2)")
