"""Pure parts of run checkpoints: round seeds, the data order of a resumed producer, pending counts, metrics."""

import json
import random
from types import SimpleNamespace

from coati.distributed.checkpointing import pending_count, round_seed, trim_metrics
from coati.distributed.producer import Producer


def test_round_seeds_are_deterministic_and_distinct():
    seeds = {(rank, r): round_seed(42, rank, r) for rank in range(4) for r in range(500)}
    assert len(set(seeds.values())) == len(seeds)  # no (rank, round) pair shares a stream
    assert round_seed(42, 1, 7) == seeds[(1, 7)] and round_seed(43, 1, 7) != seeds[(1, 7)]


def test_resumed_producer_rebuilds_the_episode_order():
    """A producer restarted in episode e shuffles as the uninterrupted one did: cumulatively, once per episode."""
    producer = Producer.__new__(Producer)
    producer.config = SimpleNamespace(run=SimpleNamespace(seed=5))
    producer.rank, producer.examples = 1, list(range(20))
    order = list(range(20))
    for episode in range(3):
        random.Random(5 * 7919 + episode * 31 + 1).shuffle(order)  # what run() did before resumable rounds
        assert producer._episode_order(episode) == order


def test_pending_count_is_the_rest_of_the_round_and_zero_at_the_end():
    config = SimpleNamespace(groups_per_sync=8, algo=SimpleNamespace(learner_chunk_size=0))
    assert pending_count({"drawn_since_sync": 4, "drawn_total": 12}, config, total_groups=32) == 4
    assert pending_count({"drawn_since_sync": 0, "drawn_total": 16}, config, total_groups=32) == 8
    assert pending_count({"drawn_since_sync": 0, "drawn_total": 32}, config, total_groups=32) == 0


def test_pending_count_leaves_out_learner_groups_not_generated_yet():
    # 8 producer groups + 2 learner groups per round; the learner fills a round at the round's first draw
    config = SimpleNamespace(groups_per_sync=10, algo=SimpleNamespace(learner_chunk_size=2))
    assert pending_count({"drawn_since_sync": 0, "drawn_total": 10}, config, total_groups=40) == 8
    assert pending_count({"drawn_since_sync": 4, "drawn_total": 14}, config, total_groups=40) == 6
    assert pending_count({"drawn_since_sync": 0, "drawn_total": 40}, config, total_groups=40) == 0


def test_trim_metrics_drops_the_rows_a_resumed_run_redoes(tmp_path):
    rows = [{"step": 0, "kind": "eval"}] + [{"step": s, "kind": "train"} for s in range(1, 7)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert trim_metrics(str(tmp_path), 3) == 3
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in kept] == [0, 1, 2, 3]
    assert trim_metrics(str(tmp_path / "missing"), 3) == 0
