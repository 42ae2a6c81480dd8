"""The stuck actor of benchmarks/soak.py, injected into every Ray worker of its cluster (``worker_process_setup_hook``):
trainer rank 1 of the run named ``soak`` stops answering before the step written in $COATI_SOAK_HANG, once.

The file arms it and is removed when the hang begins, so the run resumed after it trains on normally. The hang's
start time goes to the file's ``.began`` neighbour (the soak's clock for the bound).
"""

import os
import time


def install() -> None:
    from coati.trainer.consumer import Consumer

    step = Consumer.step

    def step_or_hang(self):
        armed = os.environ.get("COATI_SOAK_HANG", "")
        if self.config.run.project == "soak" and self.rank == 1 and os.path.isfile(armed):
            with open(armed) as handle:
                target = int(handle.read())
            if self.state.step == target - 1:  # optimizer steps so far: one a step here, resumed runs too
                os.remove(armed)
                with open(armed + ".began", "w") as handle:
                    handle.write(str(time.time()))
                while True:
                    time.sleep(3600)
        return step(self)

    Consumer.step = step_or_hang
