"""What one generate request asks of an engine: G, temperature, top-k/top-p, length, stops, seed."""

from __future__ import annotations

from dataclasses import dataclass

from coati.utils.dataclass_cli import option


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # completions per prompt (G)
    temperature: float = option(1.0, "sampling temperature for training rollouts", "-temp")  # 0 means greedy
    top_k: int = option(-1, "top-k sampling, -1 = off", "-topk")
    top_p: float = option(1.0, "nucleus sampling", "-topp")
    max_new_tokens: int = option(16, "default: 8 for the addition demo, 16 for the code demo, 12 for the tool "
                                     "demo, else 1024", "-mnt", resolved=True)
    stop_strings: tuple[str, ...] = ()  # besides EOS: the -rt type's own stops and --stop's (DataConfig.stop)
    # Sampling seed of this request (None: the engine's running RNG). Producers derive one per round, so a
    # resumed run samples what the uninterrupted one did (see coati.cluster.schedule.round_seed).
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        return 1.0 if self.greedy else self.temperature
