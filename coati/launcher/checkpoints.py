"""Run checkpoints, the driver's side: writing ``step_N`` with the trainer ranks, ``--resume``'s checks and
restoring a run from one, so that it continues exactly where ``step_N`` left it.

``<save-dir>/<project>/step_N/`` holds what every trainer rank writes (coati/trainer/checkpointing.py: the
policy as an HF directory, ``trainer_state/<role>/``, ``consumer_state/rank_R.pt``), and from the driver
- ``pending_rollouts.json``: the groups producers had put into the buffer that were not drawn yet, with their
  (round, slot) places in the draw order;
- ``run_state.json``: the driver's step and skipped-step counts, the weight version, each producer's next round,
  the held-out results before training, the settings a resumed run must share, and the option values the run
  was built from (``RLConfig.options``: ``--resume`` rebuilds the config from them, flags given again on top);
- ``checkpoint_complete.json``, written last; the directory is staged beside its final name and renamed into
  place only when all of this is on disk (``coati.utils.checkpoint.atomic_directory``), so a crash mid-save
  leaves the previous checkpoint as the newest complete one.

What is pending: the trainer saves between steps, so every group it has drawn has been trained on (or
filtered), or belongs to the round it is training, which the consumer state keeps. The buffer's ``snapshot``
gives, at one instant, the groups put but not drawn and how many whole rounds each producer has put. Those
groups are stored and put back into the buffer on resume, and each producer restarts at its first round not
put (a round it was generating is generated again from the start), so every group is trained on exactly once.
Producers reseed from (seed, rank, round) at every round (``coati.cluster.schedule.round_seed``); in sync mode
(``--max-staleness 0``) a round is generated with exactly the weights of its version, so the rounds after the
resume sample exactly what the uninterrupted run sampled. In async mode the version a round starts with depends
on timing, so a resumed run trains on the same prompts but not on the same samples. The driver renames the
staging directory once every rank has finished.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import ray

from coati.rollout.group import RolloutGroup
from coati.trainer.checkpointing import TRAINER_STATE
from coati.utils.checkpoint import atomic_directory, changed_settings, mark_complete

FORMAT = 2  # 2: per-producer next rounds (producer_rounds), pending groups by (round, slot)
RUN_STATE = "run_state.json"
PENDING = "pending_rollouts.json"


def round_settings(config) -> dict:
    """The settings that shape producer rounds and the data order (how the prompts are sharded among the
    generators, learner-side generation included), by name: a checkpoint keeps them and a resumed run must use
    the same ones. The one list: ``check_resume`` compares every key."""
    p, b = config.parallel, config.batch
    return {"num_inferencers": p.num_inferencers, "rollout_sources": p.rollout_sources, "colocate": bool(p.colocate),
            "inference_batch_size": b.inference_batch_size,
            "num_generations": b.num_generations, "seed": config.run.seed,
            "learner_chunk_size": config.algo.learner_chunk_size,
            "train_path": os.path.abspath(config.data.train_path)}


def producer_rounds(rounds_put: dict, num_sources: int) -> list[int]:
    """Each generator's next round from the buffer's per-source counts (one that put nothing: 0)."""
    return [rounds_put.get(rank, 0) for rank in range(num_sources)]


def save_checkpoint(path: str, consumers, buffer, config, driver: dict, gather) -> str:
    """Write checkpoint ``path`` atomically; ``driver``: the driver's own state (step, skipped, eval_before).
    ``gather`` waits for the trainer ranks' calls (a run's supervisor: a rank dying mid-save stops the run)."""
    with atomic_directory(path) as staging:
        counters = gather([c.save_checkpoint.remote(staging) for c in consumers])[0]
        snapshot = ray.get(buffer.snapshot.remote())
        with open(os.path.join(staging, PENDING), "w") as handle:
            json.dump([{"round": round_index, "slot": slot, "group": asdict(group)}
                       for round_index, slot, group in snapshot["items"]], handle)
        next_rounds = producer_rounds(snapshot["rounds_put"], config.parallel.rollout_sources)
        write_run_state(staging, {"format": FORMAT, **driver, "policy_version": counters["version"],
                                  "producer_rounds": next_rounds, "next_round": min(next_rounds),
                                  "pending_groups": len(snapshot["items"]), "next_draw": snapshot["next"],
                                  "consumer": counters,
                                  "layout": _layout(config), "round_settings": round_settings(config),
                                  "options": config.options})
        mark_complete(staging, {"step": driver["step"], "policy_version": counters["version"]})
    return path


def write_run_state(staging: str, state: dict) -> None:
    with open(os.path.join(staging, RUN_STATE), "w") as handle:
        json.dump(state, handle, indent=1)


def read_run_state(path: str) -> dict:
    with open(os.path.join(path, RUN_STATE)) as handle:
        return json.load(handle)


def pending_rollouts(path: str) -> list[tuple[int | None, int | None, RolloutGroup]]:
    """The checkpoint's undrawn groups with their rounds and slots, in draw order."""
    with open(os.path.join(path, PENDING)) as handle:
        return [(row["round"], row["slot"], RolloutGroup.from_dict(row["group"])) for row in json.load(handle)]


def pending_groups(path: str) -> list[RolloutGroup]:
    return [group for _, _, group in pending_rollouts(path)]


def _layout(config) -> dict:
    p = config.parallel
    return {"plugin": p.plugin_name, "num_trainers": p.num_trainers, "tp": p.tensor_parallel_size,
            "pp": p.pipeline_parallel_size, "zero": p.zero_stage, "precision": p.precision}


def trim_metrics(run_dir: str, step: int) -> int:
    """Drop the rows after ``step`` from ``run_dir/metrics.jsonl`` (the steps a resumed run redoes); how many."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return 0
    with open(path) as handle:
        lines = [line for line in handle if line.strip()]
    kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
    if len(kept) < len(lines):
        with open(path + ".tmp", "w") as handle:
            handle.writelines(kept)
        os.replace(path + ".tmp", path)
    return len(lines) - len(kept)


class NothingToResume(RuntimeError):
    """--resume of a run with no step left to train; the message is the one line to show."""


def most_steps(config, prompts: int) -> int:
    """The most steps a run of ``prompts`` training prompts can take: as if one generator held every prompt and
    -mpt dropped none (more generators, -mpt and DAPO's filter only shorten a run), each step training -tbs groups
    per data-parallel rank, within --max-steps."""
    rounds = prompts // config.batch.inference_batch_size * config.run.num_episodes
    return config.run_length(rounds)[1] // (config.parallel.dp_size * config.batch.train_batch_size)


def nothing_left_line(path: str, step: int, planned: int | None = None) -> str:
    """The one line of a --resume whose run has no step left: the checkpoint at ``step`` and, known before the
    start, the most steps the run plans."""
    why = f"this run plans at most {planned}" if planned is not None else "every group of its data was drawn"
    return (f"--resume {path}: the run has no step left to train (the checkpoint is at step {step}; {why}): "
            "raise -e/--epochs or --max-steps to train on, or drop --resume to start a new run")


def check_resume(config, prompts: int | None = None) -> str:
    """Start-up checks of ``--resume``: the checkpoint (path or ``latest``) is complete and this run can continue
    it, with a step left to train when the count of training ``prompts`` is given (``most_steps``). Returns its
    path; raises ValueError with one line otherwise."""
    from coati.utils.checkpoint import resolve_resume

    try:
        path = resolve_resume(config.run.resume, config.run.run_dir)
    except FileNotFoundError as err:
        raise ValueError(str(err)) from None
    try:
        state = read_run_state(path)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--resume {path}: no readable {RUN_STATE} ({err}); it is not a run checkpoint") from None
    if state.get("format") != FORMAT:
        raise ValueError(f"--resume {path}: checkpoint format {state.get('format')!r}, this version reads {FORMAT}")
    saved, now = state["round_settings"], round_settings(config)
    # checkpoints written before colocation: their rounds came from the inferencers
    saved = {"rollout_sources": saved.get("num_inferencers"), "colocate": False, **saved}
    changed = changed_settings(saved, now)
    if changed:
        raise ValueError(f"--resume {path}: the run must keep the settings that shape producer rounds and the data "
                         f"order; changed: {', '.join(changed)}")
    if prompts is not None and state.get("step", 0) >= most_steps(config, prompts):
        raise ValueError(nothing_left_line(path, state["step"], most_steps(config, prompts)))
    _check_state_format(path, config)
    return path


def _check_state_format(path: str, config) -> None:
    """The plugin families read each other's trainer state only in part (``coati.plugins.state``)."""
    from coati.plugins.state import COLOSSAL_FORMAT, DCP_FORMAT, MANIFEST
    from coati.trainer.roles import ACTOR, role_state_dir

    with open(os.path.join(role_state_dir(os.path.join(path, TRAINER_STATE), ACTOR), MANIFEST)) as handle:
        saved = json.load(handle)
    p = config.parallel
    if p.plugin_spec.reads_state(saved["format"], p.precision):
        return
    if saved["format"] == DCP_FORMAT:
        raise ValueError(f"--resume {path}: its trainer state was written by {saved['plugin']} (torch DCP); "
                         f"{p.plugin_name} ({p.precision}) cannot read it: use --plugin torch or colossalai DDP in fp32")
    if saved["format"] == COLOSSAL_FORMAT:
        raise ValueError(f"--resume {path}: its trainer state was written by {saved['plugin']} (ColossalAI "
                         "checkpoint); resume it with --plugin colossalai")


def restore_run(path: str, consumers, buffer, gather) -> dict:
    """Driver side of a resume, before the producers start: every trainer rank loads the checkpoint (which
    publishes its weights again), and the pending groups go back into the buffer first. The run state.
    ``gather``: as in save_checkpoint."""
    state = read_run_state(path)
    gather([c.load_checkpoint.remote(path) for c in consumers])
    ray.get(buffer.restore.remote({"items": pending_rollouts(path), "next": state["next_draw"],
                                   "rounds_put": dict(enumerate(state["producer_rounds"]))}))
    return state
