"""DAPO / PG in the trainer: dynamic batching, the sync cadence that keeps it deadlock-free, skipped steps,
ppo epochs; then end to end on a real local Ray cluster with the tiny demo model.

The fast tests drive a real ``Consumer`` (tiny random model, single-process plugin) against a simulated
producer side: round r of groups only exists once weights version r are published, exactly as the real
producers wait for version r. A consumer that waited for an unpublished round would hang in a real run;
here the simulated buffer raises instead.
"""

import dataclasses
import json

import pytest

import ray

from coati.config.cli import build_parser, config_from_args
from coati.rollout.group import RolloutGroup
from coati.trainer.consumer import Consumer

G = 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from coati.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model, save_tiny

    path = str(tmp_path_factory.mktemp("algo_tiny"))
    tokenizer = build_char_tokenizer()
    save_tiny(build_tiny_model(TinyModelSpec(hidden_size=32, intermediate_size=64), tokenizer, seed=3), tokenizer, path)
    return path


class Deadlock(RuntimeError):
    pass


class Remote:
    def __init__(self, fn):
        self.remote = fn


class SimulatedStore:
    def __init__(self):
        self.version = 0
        self.publish = Remote(self._publish)

    def _publish(self, version, refs):
        assert version == self.version + 1
        self.version = version


class SimulatedBuffer:
    """Rounds of groups; round r becomes available once the schedule admits it (sync mode: version >= r)."""

    def __init__(self, rounds: list[list[RolloutGroup]], store: SimulatedStore, schedule):
        self.rounds, self.store, self.schedule = rounds, store, schedule
        self.queue, self.released = [], 0
        self.get = Remote(self._get)
        self.requests = []
        self.note = Remote(lambda who, value: None)  # a rank's steps begun, for the driver's stuck line

    def _get(self, count, request_id=None, readers=1):
        self.requests.append(count)
        # Fast producers: every admitted round is in, generated with the newest weights at its admission.
        while self.released < len(self.rounds) and self.schedule.may_start(self.released, self.store.version):
            self.queue.extend(dataclasses.replace(g, policy_version=self.store.version)
                              for g in self.rounds[self.released])
            self.released += 1
        if len(self.queue) < count:
            raise Deadlock(f"waiting for {count} groups; {len(self.queue)} queued, round {self.released} needs "
                           f"weights v{self.schedule.min_version(self.released)}, store has v{self.store.version}")
        out, self.queue = self.queue[:count], self.queue[count:]
        return out


def make_group(correct: int, version: int, truncated: int = 0) -> RolloutGroup:
    """A group of G responses to '12+34=' of which ``correct`` are right (reward 1) and the rest wrong (0.1)."""
    prompt = [1, 2, 10, 3, 4, 11]
    responses = [[12, 4, 6, 50, 1] for _ in range(G)]
    reasons = ["length" if i < truncated else "stop" for i in range(G)]
    return RolloutGroup(prompt_ids=prompt, responses=responses, logprobs=[[-1.0] * 5 for _ in range(G)],
                        rewards=[1.0 if i < correct else 0.1 for i in range(G)],
                        correct=[i < correct for i in range(G)], format_ok=[True] * G, finish_reasons=reasons,
                        policy_version=version)


def build(tiny_dir, monkeypatch, pattern, num_rounds, *flags, ibs=8, tbs=4, tmbs=2, round_minibatches=False):
    """A consumer over ``num_rounds`` rounds of ``ibs`` groups; ``pattern[i % len]`` = correct answers of group i.
    Whole groups per step unless ``round_minibatches`` (the draw mechanics these tests pin are those of a step;
    round-level minibatches draw a round at its first step: tests/trainer/test_round_batches.py)."""
    monkeypatch.setattr(ray, "get", lambda value: value)
    monkeypatch.setattr(ray, "put", lambda value: value)
    argv = ["-m", tiny_dir, "-d", "unused.jsonl", "-g", str(G), "-ibs", str(ibs), "-imbs", str(ibs), "-tbs", str(tbs),
            "-tMbs", str(tmbs), "-tmbs", str(tmbs * G), *flags]
    argv += [] if round_minibatches else ["--no-round-minibatches"]
    config = config_from_args(build_parser().parse_args(argv))
    store = SimulatedStore()
    rounds = [[make_group(pattern[(r * ibs + i) % len(pattern)], r) for i in range(ibs)] for r in range(num_rounds)]
    buffer = SimulatedBuffer(rounds, store, config.schedule)
    consumer = Consumer(config, 0, buffer, store, num_threads=1)
    consumer.setup()
    consumer.set_total_groups(num_rounds * config.groups_per_sync)
    return consumer, buffer, store


def run_all(consumer, limit=100):
    rows = []
    for _ in range(limit):
        metrics = consumer.step()
        if metrics is None:
            return rows
        rows.append(metrics)
    raise AssertionError("step() never returned None")


def test_grpo_keeps_the_fixed_cadence(tiny_dir, monkeypatch):
    consumer, buffer, store = build(tiny_dir, monkeypatch, [2], 3)
    rows = run_all(consumer)
    assert len(rows) == 3 * consumer.config.steps_per_sync == 6
    assert [r["weight_version"] for r in rows] == [0, 1, 1, 2, 2, 3]  # publish every 2 steps, after the step
    assert all(r["groups_drawn"] == r["groups_kept"] == 4 and r["draws"] == 1 for r in rows)
    assert all(r["policy_lag"] == 0 for r in rows) and store.version == 3


def test_dynamic_batching_fills_every_step_and_syncs_per_round(tiny_dir, monkeypatch):
    # Every other group is all-correct (filtered): 8 groups must be drawn for 4 survivors = one round per step.
    consumer, buffer, store = build(tiny_dir, monkeypatch, [4, 2], 3, "-a", "DAPO")
    rows = run_all(consumer)
    assert len(rows) == 3
    for row in rows:
        assert row["groups_kept"] == 4 and row["groups_drawn"] == 8 and row["groups_filtered"] == 4
        assert row["groups_filtered_high"] == 4 and row["groups_filtered_low"] == 0
        assert row["samples_in_loss"] == 16 and "skipped" not in row
    assert [r["weight_version"] for r in rows] == [1, 2, 3] and store.version == 3
    assert consumer.state.drawn_total == 24


def test_dynamic_batching_crosses_rounds_without_deadlock(tiny_dir, monkeypatch):
    # One group in three survives: a step needs 12 draws, 1.5 rounds. The consumer must publish in the middle
    # of the step (the simulated buffer raises Deadlock otherwise) and keep drawing exactly the deficit.
    consumer, buffer, store = build(tiny_dir, monkeypatch, [2, 0, 4], 6, "-a", "DAPO")
    rows = run_all(consumer)
    assert sum(r["groups_drawn"] for r in rows) == 48 and store.version == 6
    # survivors are groups 0, 3, ..., 45: four full steps; groups 46 and 47 are filtered: a skipped last step
    assert [r["groups_kept"] for r in rows] == [4, 4, 4, 4, 0]
    assert "no data left" in rows[-1]["skipped"]
    assert max(buffer.requests) <= 4  # never more than the deficit
    assert rows[0]["weight_version"] == 1 and rows[0]["policy_lag"] == 1  # mid-step publish: v0 then v1 groups


def test_draw_limit_trains_on_what_survived(tiny_dir, monkeypatch):
    # max_draw_multiple 1: at most 4 groups drawn per step; 1 in 4 survives -> steps of 1 group, flagged.
    consumer, buffer, store = build(tiny_dir, monkeypatch, [2, 4, 4, 0], 2, "-a", "DAPO",
                                    "--grpo-config", '{"max_draw_multiple": 1}')
    rows = run_all(consumer)
    assert len(rows) == 4
    assert all(r["groups_drawn"] == 4 and r["groups_kept"] == 1 and r["draw_limit_hit"] == 1 for r in rows)
    assert all(r["samples_in_loss"] == 4 and "loss" in r for r in rows) and store.version == 2


def test_everything_filtered_skips_steps_and_still_terminates(tiny_dir, monkeypatch):
    consumer, buffer, store = build(tiny_dir, monkeypatch, [4, 0], 2, "-a", "DAPO")
    before = consumer.full_state()
    rows = run_all(consumer)
    assert rows and all("skipped" in r and "loss" not in r for r in rows)
    assert "were filtered out" in rows[0]["skipped"] and "draw limit" in rows[0]["skipped"]
    assert sum(r["groups_drawn"] for r in rows) == 16 and store.version == 2  # producers were never starved
    after = consumer.full_state()
    assert all((before[k] == after[k]).all() for k in before)  # no optimizer step on an empty batch
    assert consumer.step() is None


def test_data_exhaustion_trains_the_short_remainder(tiny_dir, monkeypatch):
    # 16 groups, survivors at 0, 1, 2, 8, 9, 10: a full step (draws 0..8), then a short one of 2 once the
    # producers' data is used up, flagged data_exhausted; then step() returns None.
    consumer, buffer, store = build(tiny_dir, monkeypatch, [2, 2, 2, 4, 4, 4, 4, 4], 2, "-a", "DAPO")
    rows = run_all(consumer)
    assert [r["groups_kept"] for r in rows] == [4, 2] and [r["groups_drawn"] for r in rows] == [9, 7]
    assert rows[-1]["data_exhausted"] == 1 and "loss" in rows[-1] and rows[-1]["samples_in_loss"] == 8
    assert store.version == 2


def test_filter_without_dynamic_batching_trains_short_batches(tiny_dir, monkeypatch):
    consumer, buffer, store = build(tiny_dir, monkeypatch, [4, 2, 2, 2], 2, "-a", "DAPO",
                                    "--grpo-config", '{"dynamic_batching": false}')
    rows = run_all(consumer)
    assert len(rows) == 4 and all(r["groups_drawn"] == 4 and r["groups_kept"] == 3 for r in rows)


def test_ppo_epochs_reuse_reference_logprobs(tiny_dir, monkeypatch):
    consumer, buffer, store = build(tiny_dir, monkeypatch, [1, 2, 3], 1, "-a", "GRPO", "-kl", "0.1", "-lr", "1e-2",
                                    "--ppo-epochs", "3")
    calls = []
    reference = consumer.algorithm.objective.reference
    original = reference.logprobs
    monkeypatch.setattr(reference, "logprobs", lambda batch: calls.append(1) or original(batch))
    rows = run_all(consumer)
    assert len(rows) == 2 and all(r["optimizer_steps"] == 3 for r in rows)
    assert len(calls) == 2 * 2  # once per minibatch (tbs 4 / tMbs 2) per step, not per epoch
    # epoch 1 starts at the reference (KL 0); epochs 2 and 3 have moved away from it
    assert rows[0]["kl"] > 0


def test_metrics_have_the_algorithm_keys(tiny_dir, monkeypatch):
    consumer, buffer, store = build(tiny_dir, monkeypatch, [1, 3], 1, "-a", "DAPO", "--topk-samples", "2")
    row = run_all(consumer)[0]
    for key in ("groups_kept", "groups_filtered", "groups_drawn", "clip_fraction_low", "clip_fraction_high",
                "skipped_samples", "kl_behaviour", "entropy", "response_length", "truncation_rate", "loss",
                "shaped_reward", "samples_in_loss"):
        assert key in row, key
    assert row["samples_in_loss"] == 4 * 2  # top-2 of each of the 4 groups
    assert 0 < row["entropy"]


def test_rollout_records_carry_the_trained_advantages(tiny_dir, monkeypatch, tmp_path):
    # DAPO: every other group is all-correct (filtered out); the first sample of each group is truncated
    # (DAPO masks it from the loss). Records cover every drawn group of every 2nd trained step.
    consumer, buffer, store = build(tiny_dir, monkeypatch, [4, 2], 2, "-a", "DAPO", "-rsd", str(tmp_path),
                                    "--rollout-save-interval", "2")
    for round_groups in buffer.rounds:
        for group in round_groups:
            group.finish_reasons[0] = "length"
            group.texts, group.prompt_text = ["12+34=46"] * G, "12+34="
    rows = run_all(consumer)
    assert len(rows) == 2 and "rollouts" not in rows[0]
    records = rows[1]["rollouts"]
    assert len(records) == 8 * G and {r["step"] for r in records} == {2}
    assert {r["policy_version"] for r in records} == {1}  # step 2 trains on round 1, made by weights v1
    filtered = [r for r in records if not r["kept"]]
    kept = [r for r in records if r["kept"]]
    assert len(filtered) == len(kept) == 4 * G
    assert all(r["advantage"] is None and r["in_loss"] is False and r["correct"] for r in filtered)
    # A kept group: rewards [1, 1, 0.1, 0.1] -> group-normalised advantages +-0.45 / std (unbiased 0.5196)
    for r in kept:
        expected = 0.45 / 0.519615 * (1 if r["sample"] < 2 else -1)
        assert r["advantage"] == pytest.approx(expected, abs=1e-4)
        assert r["shaped_reward"] == pytest.approx(r["reward"])  # 5 tokens: far from the overlong zone
        assert r["in_loss"] == (r["sample"] != 0)  # the truncated first sample is masked
        assert r["prompt"] == "12+34=" and r["response"] == "12+34=46" and r["response_tokens"] == 5
    assert [r["group"] for r in records[::G]] == list(range(8))
    assert [r["finish_reason"] for r in records[:G]] == ["length", "stop", "stop", "stop"]


# ---------------------------------------------------------------------------------------------------------
# End to end on a real local Ray cluster


def run_demo(assets, tmp_path, *flags):
    from coati.launcher.preflight import check_inputs
    from run_helpers import head, run_in_module_ray

    train = head(assets.train_path, tmp_path / "train.jsonl", 64)
    evals = head(assets.eval_path, tmp_path / "eval.jsonl", 32)
    argv = ["-d", train, "-ed", json.dumps({"add": evals}), "-ibs", "16", "-imbs", "16", "-g", "4", "-tbs", "8",
            "-tMbs", "8", "-tmbs", "32", "-e", "1", "-sd", str(tmp_path / "runs"), "-p", "t", "--no-progress", *flags]
    config = config_from_args(build_parser().parse_args(argv), assets)
    check_inputs(config)
    result = run_in_module_ray(config)
    rows = [json.loads(line) for line in open(result.metrics_path)]
    return result, rows


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_dapo_run_terminates_with_dynamic_batching(demo_assets, tmp_path):
    result, rows = run_demo(demo_assets, tmp_path, "-a", "DAPO", "-ei", "2")
    train = [r for r in rows if r["kind"] == "train"]
    skipped = [r for r in rows if r["kind"] == "skipped"]
    assert 1 <= result.steps == len(train) <= 8
    assert sum(r["groups_drawn"] for r in train + skipped) == 64  # every group of the 4 rounds was drawn once
    for key in ("groups_kept", "groups_filtered", "groups_drawn", "clip_fraction_low", "clip_fraction_high",
                "skipped_samples", "entropy", "response_length", "truncation_rate", "kl_behaviour"):
        assert all(key in r for r in train), key
    assert all(r["groups_kept"] == 8 for r in train if not r["data_exhausted"] and not r["draw_limit_hit"])
    assert train[-1]["weight_version"] == 4  # one version per producer round, whatever the filter removed
    # -ei 2 counts trained steps only (skipped ones do not move the counter); 0 and the end always.
    evals = [r for r in rows if r["kind"] == "eval"]
    expected = sorted({0, result.steps, *range(2, result.steps + 1, 2)})
    assert [r["step"] for r in evals] == [s for s in expected for _ in ("sampled", "greedy")]
    version_at = {0: 0, **{r["step"]: r["weight_version"] for r in train}}
    assert all(r["version"] == version_at[r["step"]] for r in evals)  # the newest published at that step
    assert evals[-1]["version"] == 4 and evals[-1]["on_sync"]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_pg_run_with_kl_terminates(demo_assets, tmp_path):
    result, rows = run_demo(demo_assets, tmp_path, "-a", "PG", "-kl", "0.05", "--ppo-epochs", "2", "-ei", "100")
    train = [r for r in rows if r["kind"] == "train"]
    assert result.steps == len(train) == 8
    for key in ("kl", "entropy", "clip_fraction_low", "clip_fraction_high", "groups_drawn", "loss"):
        assert all(key in r for r in train), key
    assert all(r["clip_fraction"] == 0 and r["optimizer_steps"] == 2 for r in train)  # REINFORCE: no clipping
    assert train[-1]["kl"] > 0 and train[-1]["weight_version"] == 4
    # -ei larger than the run: the evaluator still evaluates step 0 and the end, once each
    evals = [(r["step"], r["version"], r["on_sync"]) for r in rows if r["kind"] == "eval"]
    assert evals == [(0, 0, True), (0, 0, True), (8, 4, True), (8, 4, True)]


# Losses and gradient norms of these runs measured with the implementation before the async schedule existed
# (commit 7c7a3e1, the same simulated rounds): -nb 0 must reproduce sync mode step for step.
SYNC_REFERENCE = {
    "GRPO": ([], [0.229137689, 0.223204613, 0.147269234, 0.129226975, 0.127760813, 0.166312706],
             [0.0290033, 0.0678459, 0.0358689, 0.0467206, 0.0847721, 0.1354435]),
    "DAPO": (["-a", "DAPO"], [0.301771432, 0.304902017, 0.284002319, 0.271687001],
             [0.0381969, 0.0926638, 0.0691206, 0.0986724]),
    "epochs+kl": (["--ppo-epochs", "2", "-kl", "0.1"],
                  [0.233219996, 0.23293069, 0.15880991, 0.146300536, 0.15660449, 0.229161583],
                  [0.0290033, 0.1156825, 0.0540682, 0.037598, 0.0113403, 0.018005]),
}


@pytest.mark.parametrize("name", sorted(SYNC_REFERENCE))
def test_staleness_zero_equals_the_sync_implementation(tiny_dir, monkeypatch, name):
    flags, losses, grad_norms = SYNC_REFERENCE[name]
    consumer, buffer, store = build(tiny_dir, monkeypatch, [1, 2, 3, 0, 4], 3, *flags, "-lr", "1e-2", "-nb", "0")
    rows = [r for r in run_all(consumer) if "loss" in r]
    assert [r["loss"] for r in rows] == pytest.approx(losses, abs=1e-6)
    assert [r["grad_norm"] for r in rows] == pytest.approx(grad_norms, abs=1e-5)
    assert all(r["staleness_max"] == 0 for r in rows)


@pytest.mark.parametrize("flags", [[], ["-a", "DAPO"], ["--ppo-epochs", "2"]], ids=["GRPO", "DAPO", "epochs"])
def test_async_rounds_train_with_bounded_staleness(tiny_dir, monkeypatch, flags):
    """-nb 2: producers run two rounds ahead (the simulated buffer releases round r at version r - 2), so a step
    trains on groups two versions old, with the decoupled correction; every group is drawn once, no deadlock."""
    consumer, buffer, store = build(tiny_dir, monkeypatch, [1, 2, 3, 0, 4], 5, *flags, "-lr", "1e-2", "-nb", "2",
                                    "--off-policy-correction", "decoupled")
    assert consumer.config.algo.loss.correction == "decoupled"
    rows = run_all(consumer)
    trained = [r for r in rows if "loss" in r]
    assert consumer.state.drawn_total == 5 * consumer.config.groups_per_sync and store.version == 5
    assert max(r["staleness_max"] for r in trained) == 2 and all(r["staleness_max"] <= 2 for r in trained)
    assert all(0 < r["is_weight"] and r["is_weight_max"] <= 2.0 for r in trained)  # capped at --tis-cap
