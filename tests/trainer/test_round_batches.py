"""Round-level minibatches (coati/trainer/round_batches.py): the permutation, the split of a round into steps and
data-parallel shares, and a real ``Consumer`` training rounds this way against the simulated producer side of
test_dapo_e2e.py (publishes after a round's last step, DAPO's pools, resume inside a round)."""

import dataclasses

import pytest

from coati.algorithm.pipeline import GroupStages
from coati.trainer.checkpointing import load_consumer, save_consumer
from coati.trainer.group_algorithm import group_tensors
from coati.trainer.round_batches import RoundPool, parts_of_round, round_part, round_permutation, sample_view
from tests.trainer.test_dapo_e2e import G, build, make_group, run_all, tiny_dir  # noqa: F401 (a fixture)


def test_permutation_is_a_function_of_seed_and_round():
    assert round_permutation(42, 0, 8) == [3, 4, 2, 7, 6, 1, 5, 0]  # numpy's PCG64 from SeedSequence([42, 0])
    assert round_permutation(42, 0, 8) == round_permutation(42, 0, 8)
    assert sorted(round_permutation(42, 3, 50)) == list(range(50))
    assert round_permutation(42, 1, 8) != round_permutation(42, 0, 8)
    assert round_permutation(43, 0, 8) != round_permutation(42, 0, 8)


def test_parts_of_round_by_hand():
    # (kept groups, groups per step, steps per round) -> steps
    assert [parts_of_round(n, 4, 2) for n in (8, 5, 4, 3, 1, 0, 20)] == [2, 2, 1, 1, 1, 1, 2]
    assert parts_of_round(12, 4, 3) == 3 and parts_of_round(9, 4, 3) == 3


def test_sample_view_is_one_response_with_its_share_of_the_seconds():
    group = dataclasses.replace(make_group(3, 0), rewards=[1.0, 0.5, 0.2, 0.1], generate_s=2.0, score_s=1.0,
                                texts=["a", "b", "c", "d"])
    view = sample_view(group, 2)
    assert (view.rewards, view.correct, view.texts, view.responses) == ([0.2], [True], ["c"], [group.responses[2]])
    assert (view.generate_s, view.score_s, view.scores, view.loss_masks) == (0.5, 0.25, [], [])


@pytest.mark.parametrize("groups, parts, dp", [(4, 2, 1), (4, 2, 2), (5, 3, 2), (3, 2, 4)])
def test_every_sample_of_a_round_is_used_once_across_steps_and_ranks(groups, parts, dp):
    kept = [make_group(2, 0) for _ in range(groups)]
    samples = groups * G
    used = []
    pools = [RoundPool.build(7, 42, kept, kept, {"draws": 1}, [0] * groups, parts, 0) for _ in range(dp)]
    for step in range(parts):
        works = [round_part(pool, dp, rank) for rank, pool in enumerate(pools)]
        assert len({len(w.share) for w in works}) == 1  # padded to the same size on every rank
        assert len({tuple(w.rows.kept) for w in works}) == 1  # every rank holds the same part
        assert [w.info["draws"] for w in works] == [int(step == 0)] * dp
        for work in works:
            used += work.rows.share[: len(work.share) - work.padding]
    assert all(pool.done for pool in pools)
    assert sorted(used) == list(range(samples))
    assert used == round_permutation(42, 7, samples)  # parts, then ranks, in permutation order


def whole_group_advantages(groups, consumer):
    """Each group's advantages computed over that group alone, flattened in draw order."""
    config = consumer.config.algo.groups
    stages = GroupStages.from_config(config)
    return [float(a) for g in groups for a in stages.run(group_tensors([g]), config, 100)[1].reshape(-1)]


def record_rows(consumer, monkeypatch):
    """Wrap build_batches: per step, (round sample indices this rank trains, their advantages in the batches)."""
    seen = []
    original = consumer.algorithm.build_batches

    def build_batches(share, kept, padding, rows=None):
        batches = original(share, kept, padding, rows)
        advantages = [float(a) for batch in batches for a in batch["advantages"]]
        seen.append((list(rows.share), advantages, consumer.state.round_serial))
        return batches

    monkeypatch.setattr(consumer.algorithm, "build_batches", build_batches)
    return seen


def test_grpo_rounds_split_into_random_parts_and_publish_after_the_last(tiny_dir, monkeypatch):
    consumer, buffer, store = build(tiny_dir, monkeypatch, [1, 2, 3, 0, 4, 2, 1, 3], 3, round_minibatches=True)
    seen = record_rows(consumer, monkeypatch)
    rows = run_all(consumer)
    assert consumer.feed.round_steps == 2 and len(rows) == 6
    assert [r["weight_version"] for r in rows] == [0, 1, 1, 2, 2, 3]  # published after each round's 2nd step
    assert [r["draws"] for r in rows] == [1, 0] * 3 and buffer.requests == [8, 8, 8]
    assert all(r["samples"] == 16 and r["groups_drawn"] == r["groups_kept"] == 4 for r in rows)
    assert all(4 <= r["prompts"] <= 8 for r in rows) and max(r["prompts"] for r in rows) > 4
    for round_index, round_groups in enumerate(buffer.rounds):
        steps = [(indices, advantages) for indices, advantages, serial in seen if serial == round_index + 1]
        indices = [i for step_indices, _ in steps for i in step_indices]
        assert sorted(indices) == list(range(8 * G))  # every sample of the round once over its 2 steps
        assert indices == round_permutation(consumer.config.run.seed, round_index, 8 * G)
        expected = whole_group_advantages(round_groups, consumer)
        trained = [a for _, advantages in steps for a in advantages]
        assert trained == pytest.approx([expected[i] for i in indices], abs=1e-6)


def test_whole_groups_flag_and_one_step_rounds_keep_draw_order(tiny_dir, monkeypatch):
    consumer, _, _ = build(tiny_dir, monkeypatch, [2], 1, round_minibatches=True, ibs=4)
    assert consumer.feed.round_steps == 1  # a round of one step: whole groups (the order is all a permutation changes)
    rows = run_all(consumer)
    assert [(r["prompts"], r["samples"]) for r in rows] == [(4, 16)]
    consumer, _, _ = build(tiny_dir, monkeypatch, [2], 1)
    assert consumer.feed.round_steps == 1 and not consumer.config.batch.round_minibatches


def test_dapo_pools_the_kept_groups_of_rounds_it_assembled(tiny_dir, monkeypatch):
    # One group in three survives: a pool of 2 steps x 4 kept groups needs 22 draws (2.75 rounds), publishing
    # in between (the simulated buffer raises on a deadlock); groups 46 and 47 are filtered: a skipped last step.
    consumer, buffer, store = build(tiny_dir, monkeypatch, [2, 0, 4], 6, "-a", "DAPO", round_minibatches=True)
    seen = record_rows(consumer, monkeypatch)
    rows = run_all(consumer)
    assert [r.get("samples") for r in rows] == [16, 16, 16, 16, None] and "no data left" in rows[-1]["skipped"]
    assert sum(r["groups_drawn"] for r in rows) == 48 and store.version == 6
    assert max(buffer.requests) <= 8  # never more than the round's rest
    for serial in (1, 2):
        indices = [i for step_indices, _, s in seen if s == serial for i in step_indices]
        assert sorted(indices) == list(range(8 * G))


def test_resume_inside_a_round_equals_the_uninterrupted_run(tiny_dir, monkeypatch, tmp_path):
    pattern, flags = [1, 2, 3, 0, 4, 2, 1, 3], ("-lr", "1e-2")
    reference, _, _ = build(tiny_dir, monkeypatch, pattern, 3, *flags, round_minibatches=True)
    expected = [value for r in run_all(reference) for value in (r["loss"], r["grad_norm"])]
    first, _, _ = build(tiny_dir, monkeypatch, pattern, 3, *flags, round_minibatches=True)
    first.step()  # step 1 of round 0: its second part is still to train
    save_consumer(first, str(tmp_path))
    assert first.state.round is not None and first.state.round.next_part == 1
    resumed, buffer, _ = build(tiny_dir, monkeypatch, pattern, 3, *flags, round_minibatches=True)
    buffer.rounds = buffer.rounds[1:]  # round 0 was drawn before the save
    load_consumer(resumed, str(tmp_path))
    rows = run_all(resumed)
    assert [value for r in rows for value in (r["loss"], r["grad_norm"])] == pytest.approx(expected[2:], abs=1e-7)
    assert [r["weight_version"] for r in rows] == [1, 1, 2, 2, 3]


def test_rollout_log_records_a_round_at_its_first_step(tiny_dir, monkeypatch, tmp_path):
    consumer, _, _ = build(tiny_dir, monkeypatch, [1, 2, 3, 0], 2, "-rsd", str(tmp_path), "--rollout-save-interval",
                           "2", round_minibatches=True)
    rows = run_all(consumer)
    assert ["rollouts" in r for r in rows] == [True, False, True, False]  # steps 1-2 and 3-4; 2 and 4 are due
    assert len(rows[0]["rollouts"]) == 8 * G and {r["step"] for r in rows[0]["rollouts"]} == {1}
    for group in range(8):
        records = rows[0]["rollouts"][group * G : (group + 1) * G]
        assert sum(r["advantage"] for r in records) == pytest.approx(0, abs=1e-5)


@pytest.mark.parametrize("flags", [[], ["-a", "DAPO"]], ids=["GRPO", "DAPO"])
def test_async_rounds_split_the_same_way(tiny_dir, monkeypatch, flags):
    """-nb 2 (the simulated producers run two rounds ahead): each round drawn once, split into its steps, within
    the staleness bound; nothing waits for an unpublished round."""
    consumer, _, store = build(tiny_dir, monkeypatch, [1, 2, 3, 0, 4], 5, *flags, "-nb", "2",
                               "--off-policy-correction", "decoupled", round_minibatches=True)
    seen = record_rows(consumer, monkeypatch)
    rows = [r for r in run_all(consumer) if "loss" in r]
    assert consumer.state.drawn_total == 5 * consumer.config.groups_per_sync and store.version == 5
    assert max(r["staleness_max"] for r in rows) == 2
    for serial in {s for _, _, s in seen}:
        indices = [i for step_indices, _, s in seen if s == serial for i in step_indices]
        assert sorted(indices) == list(range(len(indices)))
