"""What producers and the learner-side generator share: their prompt shards, prompt tokenisation, and
turning G completions per prompt into scored ``RolloutGroup``s.

Prompt shards: the training set is split into disjoint contiguous shards, one per producer and (with
``--learner-chunk-size N`` > 0) one for the learner. A round consumes ``ibs`` prompts of every producer's
shard and ``N`` of the learner's, so the shards are sized in proportion (``ibs`` each, then ``N``): every
generator then has the same number of rounds per episode.
"""

from __future__ import annotations

import time

from coati.dataset.jsonl import build_prompt
from coati.rollout.group import RolloutGroup


def prompt_shard(total: int, num_inferencers: int, inference_batch_size: int, learner_chunk_size: int,
                 index: int) -> tuple[int, int]:
    """[start, end) of shard ``index`` of ``total`` prompts: producers 0..num_inferencers-1, then the learner
    (``index == num_inferencers``, only when ``learner_chunk_size`` > 0).

    Without learner generation every producer takes ``total // num_inferencers`` prompts (the remainder is
    unused), as it always has. With it, shard k ends at ``total * (weights up to k) // (sum of weights)``
    for weights ``ibs`` per producer and ``N`` for the learner: disjoint, covering the data, in proportion.
    """
    if not 0 <= index < num_inferencers + (learner_chunk_size > 0):
        raise ValueError(f"no prompt shard {index} with {num_inferencers} producers, learner chunk {learner_chunk_size}")
    if learner_chunk_size == 0:
        size = total // num_inferencers
        return index * size, (index + 1) * size
    weight_sum = num_inferencers * inference_batch_size + learner_chunk_size

    def bound(k: int) -> int:  # end of the first k shards
        weight = min(k, num_inferencers) * inference_batch_size + (learner_chunk_size if k > num_inferencers else 0)
        return total * weight // weight_sum

    return bound(index), bound(index + 1)


def tokenise_prompts(tokenizer, examples, system_prompt: str, max_prompt_tokens: int, template: str | None = None):
    """([(example, prompt text, prompt ids)], number skipped because longer than ``max_prompt_tokens``);
    ``template``: a base model's prompt template (``--prompt-template``)."""
    kept, skipped = [], 0
    for example in examples:
        text = build_prompt(tokenizer, example.messages, system_prompt, template)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) > max_prompt_tokens:
            skipped += 1
            continue
        kept.append((example, text, ids))
    return kept, skipped


def rollout_groups(backend, scorer, batch, sampling, version: int, learner: bool = False,
                   reward_model=None) -> list[RolloutGroup]:
    """Generate ``sampling.n`` completions for each (example, text, ids) of ``batch`` with ``backend``, score
    them, and build one group per prompt tagged with the weights ``version`` that generated it.

    ``reward_model``: a callable (prompt ids list, response ids list) -> scores; its scores go to
    ``RolloutGroup.scores`` (PPO), timed with the verifiable scoring."""
    start = time.perf_counter()
    outputs = backend.generate([ids for _, _, ids in batch], sampling)
    generate_s = (time.perf_counter() - start) / max(1, len(batch))
    start = time.perf_counter()
    scored = scorer.score_groups([[c.text for c in completions] for completions in outputs],
                                 [example for example, _, _ in batch])
    model_scores = [[] for _ in batch]
    if reward_model is not None:
        flat = reward_model([ids for (_, _, ids), completions in zip(batch, outputs) for _ in completions],
                            [c.token_ids for completions in outputs for c in completions])
        at = 0
        for index, completions in enumerate(outputs):
            model_scores[index], at = flat[at : at + len(completions)], at + len(completions)
    score_s = (time.perf_counter() - start) / max(1, len(batch))
    groups = []
    for (example, text, ids), completions, results, rm_scores in zip(batch, outputs, scored, model_scores):
        texts = [c.text for c in completions]
        groups.append(RolloutGroup(
            prompt_ids=ids,
            responses=[c.token_ids for c in completions],
            logprobs=[c.logprobs for c in completions],
            rewards=[r.reward for r in results],
            correct=[r.correct for r in results],
            format_ok=[r.format_ok for r in results],
            finish_reasons=[c.finish_reason for c in completions],
            policy_version=version,
            texts=texts,
            prompt_text=text,
            source=example.source,
            learner=learner,
            generate_s=generate_s,
            score_s=score_s,
            scores=rm_scores,
            reward_parts=[r.parts for r in results] if results and results[0].parts is not None else [],
            reasons=[r.reason_code for r in results],
        ))
    return groups
