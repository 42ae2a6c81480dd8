import torch

from coati.config.sampling import SamplingParams
from coati.algorithm.batch import collate, token_logprobs
from coati.rollout.group import RolloutGroup
from coati.rollout.inference_backend import TransformersBackend, truncate_completion


def test_truncate_completion_eos_stop_string_and_length():
    decode = lambda tokens: "".join(chr(96 + t) for t in tokens)  # 1 -> "a", 2 -> "b", ...
    assert truncate_completion([3, 4, 9, 5], eos_id=9, stop_strings=(), decode=decode) == (3, "stop")
    assert truncate_completion([1, 2, 3, 4], eos_id=9, stop_strings=("bc",), decode=decode) == (3, "stop")
    assert truncate_completion([1, 2, 3], eos_id=9, stop_strings=("zz",), decode=decode) == (3, "length")


def test_behaviour_logprobs_match_trainer_recompute(tiny_model_dir):
    """The producer's logprobs equal a training forward's on right-padded prompt+response rows."""
    torch.manual_seed(0)
    backend = TransformersBackend.from_pretrained(tiny_model_dir, prompts_per_call=2)
    tokenizer = backend.tokenizer
    prompts = [tokenizer(text).input_ids for text in ("1+2=", "33+44=", "9+9=")]
    params = SamplingParams(n=4, temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=6)
    outputs = backend.generate(prompts, params)
    assert [len(group) for group in outputs] == [4, 4, 4]
    groups = [RolloutGroup(prompt_ids=p, responses=[c.token_ids for c in cs], logprobs=[c.logprobs for c in cs],
                           rewards=[0.0] * 4, correct=[False] * 4, format_ok=[False] * 4,
                           finish_reasons=[c.finish_reason for c in cs], policy_version=0)
              for p, cs in zip(prompts, outputs)]
    batch = collate(groups, tokenizer.pad_token_id)
    with torch.no_grad():
        logits = backend.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    recomputed = token_logprobs(logits, batch["input_ids"], temperature=0.7)
    mask = batch["action_mask"].bool()
    assert mask.sum() == sum(len(c.token_ids) for cs in outputs for c in cs)
    torch.testing.assert_close(recomputed[mask], batch["old_logprobs"][mask], atol=1e-5, rtol=0)
    for completions in outputs:
        for completion in completions:
            assert completion.finish_reason in ("stop", "length")
            assert (completion.finish_reason == "length") == (len(completion.token_ids) == 6 and
                                                             completion.token_ids[-1] != tokenizer.eos_token_id)


def test_greedy_is_deterministic_and_load_weights_changes_outputs(tiny_model_dir):
    backend = TransformersBackend.from_pretrained(tiny_model_dir)
    prompt = [backend.tokenizer("12+34=").input_ids]
    params = SamplingParams(temperature=0.0, max_new_tokens=5)
    first = backend.generate(prompt, params)[0][0]
    assert backend.generate(prompt, params)[0][0].token_ids == first.token_ids
    with torch.no_grad():
        changed = [(name, torch.randn_like(p)) for name, p in backend.model.named_parameters()]
    backend.load_weights(changed)
    assert dict(backend.model.named_parameters())[changed[0][0]].equal(changed[0][1])
    assert backend.generate(prompt, params)[0][0].logprobs != first.logprobs


def test_seeded_sampling_repeats_whatever_ran_before(tiny_model_dir):
    """A request's seed fixes its samples (producers seed every round, so resumed runs resample the same)."""
    backend = TransformersBackend.from_pretrained(tiny_model_dir)
    prompts = [backend.tokenizer(text).input_ids for text in ("1+2=", "33+44=")]
    seeded = SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=7)
    tokens = lambda outputs: [[c.token_ids for c in group] for group in outputs]
    first = tokens(backend.generate(prompts, seeded))
    backend.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=4))  # moves the global RNG
    assert tokens(backend.generate(prompts, seeded)) == first
    other = SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=8)
    assert tokens(backend.generate(prompts, other)) != first
