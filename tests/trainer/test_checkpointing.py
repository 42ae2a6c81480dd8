"""Pure parts of run checkpoints: round seeds, the data order of a resumed producer, next rounds, metrics,
--resume's check of the settings that shape rounds."""

import json
import random
from types import SimpleNamespace

import pytest

from coati.cluster.schedule import round_seed
from coati.config.cli import build_parser, config_from_args
from coati.launcher.checkpoints import (
    FORMAT,
    check_resume,
    most_steps,
    producer_rounds,
    round_settings,
    trim_metrics,
    write_run_state,
)
from coati.rollout.round_generator import RoundGenerator
from coati.train import placeholder_demo
from coati.utils.checkpoint import COMPLETE_MARKER


def test_round_seeds_are_deterministic_and_distinct():
    seeds = {(rank, r): round_seed(42, rank, r) for rank in range(4) for r in range(500)}
    assert len(set(seeds.values())) == len(seeds)  # no (rank, round) pair shares a stream
    assert round_seed(42, 1, 7) == seeds[(1, 7)] and round_seed(43, 1, 7) != seeds[(1, 7)]


def test_resumed_producer_rebuilds_the_episode_order():
    """A producer restarted in episode e shuffles as the uninterrupted one did: cumulatively, once per episode."""
    producer = RoundGenerator.__new__(RoundGenerator)
    producer.config = SimpleNamespace(run=SimpleNamespace(seed=5))
    producer.stream, producer.examples = 1, list(range(20))
    order = list(range(20))
    for episode in range(3):
        random.Random(5 * 7919 + episode * 31 + 1).shuffle(order)  # what run() did before resumable rounds
        assert producer.episode_order(episode) == order


def test_producer_rounds_from_the_buffer_counts():
    assert producer_rounds({0: 3, 1: 2}, 3) == [3, 2, 0]  # producer 2 has put nothing yet
    assert producer_rounds({}, 1) == [0]


def test_trim_metrics_drops_the_rows_a_resumed_run_redoes(tmp_path):
    rows = [{"step": 0, "kind": "eval"}] + [{"step": s, "kind": "train"} for s in range(1, 7)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert trim_metrics(str(tmp_path), 3) == 3
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in kept] == [0, 1, 2, 3]
    assert trim_metrics(str(tmp_path / "missing"), 3) == 0


def test_a_resume_that_moves_the_prompt_shards_is_refused_in_one_line(tmp_path):
    """--learner-chunk-size changes how a round's prompts are split between the producers and the learner: a
    resume that changes it would train other prompts than the checkpoint's run, so it is refused like -ibs."""
    def config(*flags):
        argv = ["-sd", str(tmp_path), "-p", "r", "-ibs", "8", "-imbs", "8", "-g", "4", "-tbs", "4", "-tMbs", "4",
                "-tmbs", "8", *flags]
        return config_from_args(build_parser().parse_args(argv), placeholder_demo())

    step = tmp_path / "r" / "step_2"
    step.mkdir(parents=True)
    (step / COMPLETE_MARKER).write_text("{}")
    write_run_state(str(step), {"format": FORMAT, "round_settings": round_settings(config())})
    with pytest.raises(ValueError) as refused:
        check_resume(config("--learner-chunk-size", "4", "--resume", "latest"))
    message = str(refused.value)
    assert message.endswith("changed: learner_chunk_size 0 -> 4") and "\n" not in message, message
    with pytest.raises(FileNotFoundError):  # the same settings pass, on to the (absent) trainer state
        check_resume(config("--resume", "latest"))


def test_a_resume_with_no_step_left_is_refused_in_one_line(tmp_path):
    """32 prompts, -ibs 8, -e 1: 4 rounds of 8 groups, 4 a step: 8 steps. A checkpoint at step 8 has nothing left
    to train (the run would have evaluated and exited 0 having trained nothing); more epochs or steps go on."""
    def config(*flags):
        argv = ["-sd", str(tmp_path), "-p", "r", "-ibs", "8", "-imbs", "8", "-g", "4", "-tbs", "4", "-tMbs", "4",
                "-tmbs", "8", "-e", "1", *flags]
        return config_from_args(build_parser().parse_args(argv), placeholder_demo())

    assert most_steps(config(), 32) == 8 and most_steps(config("-e", "3"), 32) == 24
    assert most_steps(config("--max-steps", "5"), 32) == 5 and most_steps(config(), 39) == 8  # 7 left over
    step = tmp_path / "r" / "step_8"
    step.mkdir(parents=True)
    (step / COMPLETE_MARKER).write_text("{}")
    write_run_state(str(step), {"format": FORMAT, "step": 8, "round_settings": round_settings(config())})
    with pytest.raises(ValueError) as refused:
        check_resume(config("--resume", "latest"), prompts=32)
    assert str(refused.value) == (
        f"--resume {step}: the run has no step left to train (the checkpoint is at step 8; this run plans at most "
        "8): raise -e/--epochs or --max-steps to train on, or drop --resume to start a new run")
    for flags, prompts in ((("-e", "2"), 32), ((), 64), ((), None)):  # steps left, or not known: on to the state
        with pytest.raises(FileNotFoundError):
            check_resume(config("--resume", "latest", *flags), prompts=prompts)
