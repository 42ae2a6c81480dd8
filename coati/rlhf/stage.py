"""One supervised stage (SFT or reward model) on a trainer group: the same loop for every task and layout.

``StageTrainer`` is one rank: it joins the trainer group, builds the plugin of the layout (-t/-tp/-pp/-zero/
--plugin, exactly as GRPO's trainers do), tokenises the rows (identically on every rank) and trains its
data-parallel share of each step's batch through ``plugin.forward_backward`` with the task's loss. Each step
takes ``batch_size`` rows of a per-epoch permutation (seeded); data-parallel rank k trains the k-th
contiguous slice, and every rank divides by the step's global normaliser / dp (completion tokens for SFT,
pairs for the reward model), so the averaged gradients are those of the whole batch in one process.

Evaluation gathers the full weights onto rank 0 (collective, any layout) into a plain copy of the model and
scores the held-out rows there. The driver (``run_stage``) runs one trainer in-process, or ``-t`` of them as
Ray actors (a local cluster, or the one RAY_ADDRESS names), and writes ``metrics.jsonl`` and the final HF
directory ``<save-dir>/<project>/final`` (``from_pretrained`` loads it; the reward model with
``AutoModelForSequenceClassification``). With ``--lora-rank`` the stage trains adapters on a frozen base (the reward
model's head in full); the final directory is the merged model, so the next stage and PPO load it as any
model, and the adapter itself is in its ``adapter/`` subdirectory.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass

import torch

from coati.cluster.connect import init_ray_for
from coati.cluster.trainer_group import even_threads, join_trainer_group, one_unit_each, rendezvous_address, \
    start_trainer_group
from coati.config.errors import ConfigError
from coati.models.lora import add_adapters, merged_tensors
from coati.registry import resolve
from coati.plugins.dist import all_reduce_stats
from coati.rlhf.config import StageConfig
from coati.rlhf.tasks import TASKS

ADAPTER_SUBDIR = "adapter"  # with --lora-rank: the trained adapter beside the merged model


def load_stage_rows(config: StageConfig, train_path: str, eval_path: str | None):
    """(train examples, held-out examples) of the stage's row format, split by --eval-fraction when no -ed."""
    from coati.dataset.loader import DatasetError
    from coati.dataset.rlhf_rows import load_preferences, load_sft

    load = load_sft if config.stage == "sft" else load_preferences
    try:
        train = load(train_path)
        held_out = load(eval_path) if eval_path else []
    except DatasetError as err:
        raise ConfigError(str(err)) from None
    if not eval_path and config.eval_fraction > 0:
        order = list(range(len(train)))
        random.Random(config.seed).shuffle(order)
        count = max(1, int(len(train) * config.eval_fraction))
        held = set(order[:count])
        held_out = [train[i] for i in sorted(held)]
        train = [example for i, example in enumerate(train) if i not in held]
    return train, held_out


class StageTrainer:
    def __init__(self, config: StageConfig, train_path: str, eval_path: str | None, model_path: str, rank: int = 0,
                 num_threads: int | None = None, actor: bool = False):
        if actor:
            from coati.utils.actor_process import start_actor_process

            start_actor_process()
        self.config, self.rank = config, rank
        self.train_path, self.eval_path, self.model_path = train_path, eval_path, model_path
        if num_threads:  # Ray actors get a share of the cores; in-process the caller's setting stands
            torch.set_num_threads(num_threads)
        self.plugin = self.mesh = None
        self._eval_model = None
        self._order = (None, None)  # (epoch, its permutation of the training rows)

    def rendezvous_address(self) -> tuple[str, int]:
        return rendezvous_address()

    def setup(self, master_address: str = "127.0.0.1", master_port: int = 29507) -> dict:
        """Join the group, build the plugin and the model, tokenise the rows; the data's counts."""
        from transformers import AutoConfig, AutoTokenizer

        from coati.plugins import TrainerMesh, make_plugin

        config = self.config
        torch.manual_seed(config.seed)  # the same on every rank: a fresh head starts identical
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.task = TASKS[config.stage](self.tokenizer, config.system_prompt, config.max_length)
        train, held_out = load_stage_rows(config, self.train_path, self.eval_path)
        self.train, skipped = self.task.tokenise(train)
        self.held_out, skipped_eval = self.task.tokenise(held_out)
        spec = config.plugin_spec
        if spec.distributed:
            from coati.plugins.dist import init_trainer_group

            init_trainer_group(self.rank, config.num_trainers, master_address, master_port)
            if spec.launch is not None:
                resolve(spec.launch)()
        self.mesh = TrainerMesh.build(config.tensor_parallel_size, config.pipeline_parallel_size)
        self.plugin = make_plugin(config.plugin_name, config.tensor_parallel_size, config.pipeline_parallel_size,
                                  config.zero_stage, config.precision, world_size=config.num_trainers,
                                  model_config=AutoConfig.from_pretrained(self.model_path), mesh=self.mesh)
        model = self.task.load_model(self.model_path)
        if config.lora.enabled:
            model = add_adapters(model, config.lora, self.task.trained_modules)
        self.plugin.setup(model, config.lr)
        return {"train_rows": len(self.train), "eval_rows": len(self.held_out), "skipped_too_long": skipped,
                "skipped_too_long_eval": skipped_eval, "steps": self.total_steps}

    @property
    def steps_per_epoch(self) -> int:
        return len(self.train) // self.config.batch_size

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.config.epochs

    def batch_items(self, step: int) -> list:
        """The rows of global step ``step`` (0-based): a slice of its epoch's seeded permutation."""
        epoch, index = divmod(step, self.steps_per_epoch)
        if self._order[0] != epoch:  # one permutation per epoch, drawn once
            generator = torch.Generator().manual_seed(self.config.seed + epoch)
            self._order = (epoch, torch.randperm(len(self.train), generator=generator))
        order = self._order[1]
        size = self.config.batch_size
        return [self.train[i] for i in order[index * size : (index + 1) * size].tolist()]

    def step(self, step: int) -> dict:
        """One optimizer step on this rank's share of step ``step``'s batch. Collective."""
        config, plugin, mesh = self.config, self.plugin, self.mesh
        start = time.perf_counter()
        items = self.batch_items(step)
        share = len(items) // mesh.dp_size
        mine = items[mesh.dp_rank * share : (mesh.dp_rank + 1) * share]
        normaliser = self.task.weight(items) / mesh.dp_size
        micro_batches = []
        for first in range(0, len(mine), config.micro_batch_size):
            batch = self.task.collate(mine[first : first + config.micro_batch_size])
            batch["normaliser"] = torch.full((batch["input_ids"].shape[0],), normaliser)
            micro_batches.append(batch)
        stats = plugin.forward_backward(micro_batches, self.task.loss_fn)
        grad_norm = plugin.optimizer_step(config.max_grad_norm)
        totals = {name: sum(float(s[name]) for s in stats) for name in stats[0]}
        # each rank's statistics are its share of the global value times dp (normaliser global / dp)
        return {**all_reduce_stats(totals, mesh), "grad_norm": grad_norm, "step_time_s": time.perf_counter() - start}

    def evaluate(self) -> dict | None:
        """Held-out metrics on rank 0 (None elsewhere, and when there are no held-out rows). Collective."""
        tensors = self._model_tensors()  # every rank takes part in the gathers
        if not self.held_out or not self.plugin.is_weight_sender:
            return None
        if self._eval_model is None:
            self._eval_model = self.task.load_model(self.model_path).eval()
        unexpected = self._eval_model.load_state_dict(tensors, strict=False).unexpected_keys
        if unexpected:
            raise RuntimeError(f"gathered weights the model does not have: {unexpected[:3]}")
        return self.task.evaluate(self._eval_model, self.held_out, self.config.micro_batch_size)

    def _model_tensors(self) -> dict[str, torch.Tensor]:
        """Collective: the trained model's full tensors by HF name on the sender; with LoRA the adapters merged into
        the base, so the evaluation copy and the saved model are plain HF models."""
        if not self.config.lora.enabled:
            return dict(self.plugin.named_full_tensors())
        return dict(merged_tensors(self.plugin.named_full_tensors(include_frozen=True), self.config.lora))

    def save_pretrained(self, path: str) -> str:
        """Collective: the model as an HF directory with the tokenizer (written by the sender). With LoRA it is the
        merged model (the next stage and PPO load it as any model), and its adapter is kept in ``adapter/``."""
        if self.config.lora.enabled:
            from coati.plugins.torch_native import save_hf

            tensors = self._model_tensors()
            if self.plugin.is_weight_sender:
                save_hf(self.plugin.module, tensors, path)
            self.plugin.save_pretrained(os.path.join(path, ADAPTER_SUBDIR))
        else:
            self.plugin.save_pretrained(path)
        if self.plugin.is_weight_sender:
            self.tokenizer.save_pretrained(path)
        return path

    def save_state(self, path: str) -> None:
        """Collective: this rank's shards of the trainer state (parameters, optimizer) into ``path``."""
        self.plugin.save_state(path)

    def load_state(self, path: str) -> None:
        """Collective, after setup: the trainer state ``save_state`` wrote, in any layout the plugin reads."""
        self.plugin.load_state(path)

    def full_state(self) -> dict[str, torch.Tensor]:
        return {name: tensor.clone() for name, tensor in self.plugin.named_full_tensors()}

    def shutdown(self) -> None:
        if self.plugin is not None:
            self.plugin.close()
        if self.mesh is not None:
            self.mesh.close()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


@dataclass
class StageResult:
    steps: int
    before: dict  # held-out metrics before training
    after: dict
    losses: list  # training loss of every step
    model_dir: str
    metrics_path: str
    data: dict  # row counts
    wall_s: float


class _Group:
    """The trainer ranks: one in-process StageTrainer, or -t Ray actors called in lockstep."""

    def __init__(self, config: StageConfig, train_path: str, eval_path: str | None, model_path: str):
        self.ray = config.num_trainers > 1
        if not self.ray:
            self.ranks = [StageTrainer(config, train_path, eval_path, model_path)]
            self.info = self.ranks[0].setup()
            return
        n = config.num_trainers
        init_ray_for(n)  # a local cluster, or the one RAY_ADDRESS names
        self.group = start_trainer_group(StageTrainer, n, dict(config=config, train_path=train_path, eval_path=eval_path,
                                                               model_path=model_path, actor=True),
                                         even_threads(n), one_unit_each(n))
        self.ranks = self.group.actors
        try:
            self.info = join_trainer_group(self.group)[0]
        except BaseException:
            self.group.kill()
            raise

    def call(self, method: str, *args):
        """Every rank's result of ``method(*args)`` (collective calls reach all ranks together)."""
        if not self.ray:
            return [getattr(self.ranks[0], method)(*args)]
        return self.group.call(method, *args)

    def close(self) -> None:
        self.call("shutdown")
        if self.ray:
            self.group.kill()


def run_stage(config: StageConfig, train_path: str, eval_path: str | None, model_path: str, log=print) -> StageResult:
    """Train the stage (from ``--resume``'s checkpoint when given) and save the final model; metrics go to
    <run_dir>/metrics.jsonl."""
    from tqdm import tqdm

    from coati.launcher import stage_checkpoint
    from coati.launcher.checkpoints import trim_metrics
    from coati.utils.metrics import MetricsLogger

    start = time.time()
    if log is print:  # lines printed while the progress bar is up go above it
        log = tqdm.write
    resume = stage_checkpoint.resume_point(config)
    os.makedirs(config.run_dir, exist_ok=True)
    if resume and trim_metrics(config.run_dir, stage_checkpoint.read_state(resume)["step"]):
        log("metrics.jsonl: dropped the rows after the checkpoint's step, which this resumed run redoes")
    logger = MetricsLogger(config.run_dir, config.project or config.stage, asdict(config), log=log,
                           resume=bool(resume))
    group = None
    try:
        group = _Group(config, train_path, eval_path, model_path)
        info = group.info
        _check_start(config, info, train_path, log)

        def evaluate(step: int) -> dict:
            return _evaluate(group, config, logger, log, step)

        if resume:
            state = stage_checkpoint.restore(group, resume)
            log(f"resuming from {resume}: step {state['step']} of {info['steps']}")
            first, before = state["step"], state["before"]
        else:
            first, before = 0, evaluate(0)
        _train(group, config, info["steps"], logger, evaluate, first, before)
        after = evaluate(info["steps"])
        model_dir = os.path.join(config.run_dir, "final")
        group.call("save_pretrained", model_dir)
        with open(os.path.join(config.run_dir, "stage_config.json"), "w") as handle:
            json.dump({**asdict(config), "model_path": model_path, "train_path": train_path,
                       "eval_path": eval_path}, handle, indent=1)
    finally:
        if group is not None:
            group.close()
        logger.close()
    losses = stage_checkpoint.earlier_losses(logger.path)  # a resumed run's too
    return StageResult(info["steps"], before, after, losses, model_dir, logger.path, info, time.time() - start)


def _check_start(config: StageConfig, info: dict, train_path: str, log) -> None:
    log(f"{config.stage}: {info['train_rows']} training rows, {info['eval_rows']} held out"
        + (f", {info['skipped_too_long']} skipped as longer than -ml {config.max_length}"
           if info["skipped_too_long"] else "") + f"; {info['steps']} steps on {config.plugin_name} "
        f"x{config.num_trainers}")
    if info["steps"] == 0:
        raise ConfigError(f"{train_path}: {info['train_rows']} usable training rows, fewer than one batch of "
                          f"-bs {config.batch_size}; lower -bs or add rows")


def _evaluate(group: _Group, config: StageConfig, logger, log, step: int) -> dict:
    result = next((r for r in group.call("evaluate") if r is not None), None) or {}
    if result:
        # kind "eval" rows name metrics without the prefix (coati plot draws their accuracy)
        logger.log(step, {"task": config.stage, "mode": "held_out",
                          **{k.removeprefix("eval_"): v for k, v in result.items()}}, kind="eval")
        log(f"eval step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in result.items()))
    return result


def _train(group: _Group, config: StageConfig, steps: int, logger, evaluate, first: int, before: dict) -> None:
    """Steps ``first`` .. ``steps`` - 1, with evaluations and checkpoints (-ei, -si) between them; a new
    checkpoint replaces the previous one (the final model is written after the loop)."""
    from tqdm import tqdm

    from coati.launcher import stage_checkpoint
    from coati.utils.checkpoint import prune_checkpoints

    bar = tqdm(total=steps, initial=first, desc=config.stage, disable=not config.progress_bar, leave=False)
    for step in range(first, steps):
        row = group.call("step", step)[0]
        logger.log(step + 1, row)
        bar.update(1)
        bar.set_postfix(loss=f"{row['loss']:.4f}")
        done = step + 1
        if config.eval_interval and done % config.eval_interval == 0 and done < steps:
            evaluate(done)
        if config.save_interval and done % config.save_interval == 0 and done < steps:
            prune_checkpoints(config.run_dir, 1, stage_checkpoint.save(group, config, done, before))
    bar.close()
