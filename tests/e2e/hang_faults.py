"""Hangs (and an engine failure) injected into every Ray worker of tests/e2e/test_hangs_e2e.py (``worker_process_setup_hook``): an actor
that stays alive and never answers. Each is armed by the run's project name, so that one Ray cluster serves every
test, and writes the time it began hanging to $COATI_HANG_MARKS/<project> (the test's clock for the bound)."""

import os
import time

STUCK_PRODUCER_ROUND = 1  # project "stuck-producer": every producer hangs generating this round
STUCK_TRAINER_STEP = 3  # project "stuck-trainer": trainer rank 1 hangs before this step
BROKEN_ENGINE_ROUND = 1  # project "broken-engine": every producer's engine raises generating this round
# project "engine-wont-start": every engine's start raises


def _hang(project: str) -> None:
    with open(os.path.join(os.environ["COATI_HANG_MARKS"], project), "w") as handle:
        handle.write(str(time.time()))
    while True:
        time.sleep(3600)


def install() -> None:
    from coati.rollout import inference_backend
    from coati.rollout.round_generator import RoundGenerator
    from coati.trainer.consumer import Consumer

    round_params, step = RoundGenerator.round_params, Consumer.step

    def stuck_round_params(self, round_index, chunk=None):
        if self.config.run.project == "stuck-producer" and round_index == STUCK_PRODUCER_ROUND:
            _hang("stuck-producer")
        if self.config.run.project == "broken-engine" and round_index == BROKEN_ENGINE_ROUND:
            def broken(prompts, params):  # the engine's own failure, deep inside its generate
                raise RuntimeError("CPU Generator does not use offset")

            self.backend._engine._generate_batch = broken
        return round_params(self, round_index, chunk)

    def stuck_step(self):
        if self.config.run.project == "stuck-trainer" and self.rank == 1 and self.steps_begun == STUCK_TRAINER_STEP - 1:
            _hang("stuck-trainer")
        return step(self)

    build = inference_backend.build_transformers_backend

    def unstartable(config, rank, placement):
        if config.run.project == "engine-wont-start":
            raise RuntimeError("the engine could not allocate its cache")
        return build(config, rank, placement)

    RoundGenerator.round_params, Consumer.step = stuck_round_params, stuck_step
    inference_backend.build_transformers_backend = unstartable
