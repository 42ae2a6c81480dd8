"""An engine's failure as one line (rollout/engine_guard.py), on the real transformers engine with a fault injected."""

from __future__ import annotations

import pytest

from coati.cluster.supervision import OneLineFailure
from coati.config.sampling import SamplingParams
from coati.registry.backends import backend_spec
from coati.rollout.engine_guard import EngineFailed, GuardedEngine, failure_line
from coati.rollout.inference_backend import TransformersBackend


def test_the_line_names_who_the_engine_the_error_and_the_advice():
    error = RuntimeError("CPU Generator does not use offset\n  (more)")
    line = failure_line("inferencer 0", "vllm", "generating", error, "Try -b transformers.", "/r/engine.log")
    assert line == ("inferencer 0's engine (vllm) failed generating: RuntimeError: CPU Generator does not use offset "
                    "(more) (traceback: /r/engine.log). Try -b transformers")
    long = failure_line("the evaluator", "transformers", "to start", ValueError("x" * 1000), "Hint.", None)
    assert "\n" not in long and len(long) < 400 and long.endswith("... Hint")


def test_a_failing_engine_raises_its_line_and_keeps_the_traceback(demo_assets, tmp_path, monkeypatch):
    engine = TransformersBackend.from_pretrained(demo_assets.model_dir)
    hint = backend_spec("transformers").failure_hint
    guarded = GuardedEngine(engine, "transformers", "inferencer 1", hint, str(tmp_path / "run"))
    prompts = [engine.tokenizer("1+2=").input_ids]
    assert len(guarded.generate(prompts, SamplingParams(n=2, max_new_tokens=2))[0]) == 2
    assert guarded.tokenizer is engine.tokenizer and guarded.eos_id == engine.eos_id  # the engine's own attributes

    def out_of_memory(*args, **kwargs):  # the injected fault
        raise MemoryError("could not allocate 17179869184 bytes")

    monkeypatch.setattr(engine, "_generate_batch", out_of_memory)
    with pytest.raises(EngineFailed) as failed:
        guarded.generate(prompts, SamplingParams(n=2, max_new_tokens=2))
    line = str(failed.value)
    log = tmp_path / "run" / "engine_error_inferencer_1.log"
    assert line == (f"inferencer 1's engine (transformers) failed generating: MemoryError: could not allocate "
                    f"17179869184 bytes (traceback: {log}). {hint}")
    assert isinstance(failed.value, OneLineFailure) and "out_of_memory" in log.read_text()
    monkeypatch.setattr(engine, "load_weights", lambda named: (_ for _ in ()).throw(KeyError("lm_head.weight")))
    with pytest.raises(EngineFailed, match=r"failed loading new weights: KeyError: 'lm_head.weight'"):
        guarded.load_weights([])


def refuses_to_start(config, rank, placement):  # the injected fault: an engine that cannot start
    raise ValueError("User-specified max_model_len (2300) is greater than the derived max_model_len (2048)")


def test_an_engine_that_cannot_start_is_its_line(tmp_path):
    from types import SimpleNamespace

    from coati.registry.backends import BackendSpec
    from coati.rollout.engine_guard import build_engine

    spec = BackendSpec("vllm", build=f"{__name__}:refuses_to_start", failure_hint="Lower -mpt or -mnt.")
    config = SimpleNamespace(run=SimpleNamespace(run_dir=str(tmp_path / "run")))
    with pytest.raises(EngineFailed) as failed:
        build_engine(spec, config, 0, None, "the evaluator")
    log = tmp_path / "run" / "engine_error_the_evaluator.log"
    assert str(failed.value) == ("the evaluator's engine (vllm) failed to start: ValueError: User-specified "
                                 "max_model_len (2300) is greater than the derived max_model_len (2048) (traceback: "
                                 f"{log}). Lower -mpt or -mnt")
    assert "refuses_to_start" in log.read_text()
