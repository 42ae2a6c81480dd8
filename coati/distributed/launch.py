"""Builds the Ray actors for a run, wires buffer and weight sync, drives training and evaluation.

The driver only orchestrates: producers run their own generation loop; the driver calls ``step()`` on
the trainers, logs what they return, and evaluates before and after training.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace

import ray

from coati.distributed.config import RLConfig
from coati.distributed.grpo_consumer import GRPOConsumer
from coati.distributed.producer import Producer
from coati.distributed.weight_sync import WeightStore
from coati.distributed.buffer import RolloutBuffer
from coati.utils.metrics import MetricsLogger


@dataclass
class RunResult:
    steps: int
    eval_before: dict  # "task/sampling" -> accuracy
    eval_after: dict
    final_model_dir: str
    metrics_path: str
    wall_s: float


def init_ray(config: RLConfig) -> None:
    """Join the cluster named by RAY_ADDRESS (see launch/), else start a local one."""
    if ray.is_initialized():
        return
    kwargs = dict(include_dashboard=False, logging_level="ERROR", log_to_driver=True)
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], **kwargs)
        return
    actors = config.parallel.num_inferencers + config.parallel.num_trainers
    ray.init(num_cpus=max(actors, os.cpu_count() or 1), _temp_dir=config.run.ray_dir, **kwargs)


def _eval_all(producer, config: RLConfig, logger: MetricsLogger, step: int, log) -> dict:
    results = {}
    eval_dir = config.run.eval_save_dir or os.path.join(config.run.run_dir, "eval")
    os.makedirs(eval_dir, exist_ok=True)
    for task, path in config.data.eval_paths.items():
        for mode, params in config.eval_sampling:
            out = ray.get(producer.evaluate.remote(path, params))
            key = f"{task}/{mode}"
            results[key] = out["accuracy"]
            with open(os.path.join(eval_dir, f"{task}_{mode}_step{step}.jsonl"), "w") as handle:
                for record in out["records"]:
                    handle.write(json.dumps(record) + "\n")
            logger.log(step, {"task": task, "mode": mode, "accuracy": out["accuracy"], "format_rate":
                              out["format_rate"], "count": out["count"], "version": out["version"]}, kind="eval")
            log(f"eval step {step} {key}: accuracy {out['accuracy']:.3f} format {out['format_rate']:.3f} "
                f"(n={out['count']}, weights v{out['version']})")
    return results


def run(config: RLConfig, log=print) -> RunResult:
    from tqdm import tqdm

    start = time.time()
    init_ray(config)
    p = config.parallel
    # Sync mode: producers and trainers take turns on the cores; the trainer ranks share them.
    cores = max(1, os.cpu_count() or 1)
    store = ray.remote(WeightStore).options(num_cpus=0).remote()
    # Room for two rounds: sync mode never holds more than one, so neither producers nor the learner's put block.
    buffer = ray.remote(RolloutBuffer).options(num_cpus=0).remote(2 * config.groups_per_sync)
    producers = [ray.remote(Producer).options(num_cpus=1).remote(config, rank, buffer, store, cores)
                 for rank in range(p.num_inferencers)]
    consumers = [ray.remote(GRPOConsumer).options(num_cpus=1).remote(config, rank, buffer, store,
                                                                      max(1, cores // p.num_trainers))
                 for rank in range(p.num_trainers)]
    address, port = ray.get(consumers[0].rendezvous_address.remote())
    ray.get([consumer.setup.remote(address, port) for consumer in consumers])  # joins the group together
    infos = ray.get([producer.info.remote() for producer in producers])
    # --learner-chunk-size: the sending trainer's generator has its own shard, and as many rounds to fill.
    learner_infos = [info for info in ray.get([consumer.learner_info.remote() for consumer in consumers]) if info]
    for info in learner_infos:
        if info["skipped_too_long"]:
            log(f"learner: skipped {info['skipped_too_long']} prompts longer than -mpt tokens")
    for rank, info in enumerate(infos):
        if info["skipped_too_long"]:
            log(f"inferencer {rank}: skipped {info['skipped_too_long']} prompts longer than -mpt tokens")
    rounds = min(info["rounds_per_episode"] for info in infos + learner_infos) * config.run.num_episodes
    if rounds == 0:
        raise RuntimeError("no full inference batch of prompts fits -mpt; raise -mpt/--max-prompt-tokens or lower -ibs")
    # Every trainer rank draws its share of all rounds; a step returns None once its share is used up.
    # Without filtering that is exactly rounds * steps_per_sync steps; with it (DAPO), fewer.
    max_steps = rounds * config.steps_per_sync
    ray.get([consumer.set_total_groups.remote(rounds * config.groups_per_sync) for consumer in consumers])
    ray.get([consumer.__ray_ready__.remote() for consumer in consumers])

    logger = MetricsLogger(config.run.run_dir, config.run.project, _jsonable(config), log)
    eval_before = _eval_all(producers[0], config, logger, 0, log)
    generation = [producer.run.remote(rounds) for producer in producers]
    bar = tqdm(total=max_steps, desc=config.algo.name, unit="step", disable=not config.run.progress_bar)
    step = skipped = 0
    while True:
        metrics = ray.get([consumer.step.remote() for consumer in consumers])[0]
        if metrics is None:
            break
        if "skipped" in metrics:
            skipped += 1
            logger.log(step, metrics, kind="skipped")
            log(f"after step {step}: a step was skipped: {metrics['skipped']} "
                f"(groups drawn {metrics['groups_drawn']}, weights v{metrics['weight_version']})")
            continue
        step += 1
        logger.log(step, metrics)
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['reward']:.3f}", acc=f"{metrics['accuracy']:.3f}",
                        loss=f"{metrics['loss']:.4f}", v=metrics["weight_version"])
        if config.run.save_interval and step % config.run.save_interval == 0:
            save_all(consumers, os.path.join(config.run.run_dir, f"step_{step}"))
    bar.close()
    ray.get(generation)
    total_steps = step
    if skipped:
        log(f"{skipped} steps were skipped because no group survived the filter")
    eval_after = _eval_all(producers[0], config, logger, total_steps, log)
    final_dir = save_all(consumers, os.path.join(config.run.run_dir, f"step_{total_steps}"))
    ray.get([consumer.shutdown.remote() for consumer in consumers])
    logger.close()
    return RunResult(total_steps, eval_before, eval_after, final_dir, logger.path, time.time() - start)


def save_all(consumers, path: str) -> str:
    """Every trainer rank takes part (sharded weights are gathered); the sender writes."""
    return ray.get([consumer.save_pretrained.remote(path) for consumer in consumers])[0]


def _jsonable(config: RLConfig) -> dict:
    return json.loads(json.dumps(asdict(config), default=str))
