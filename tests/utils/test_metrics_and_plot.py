import json
import os


from coati.utils.metrics import MetricsLogger
from coati.utils.plot import main as plot_main
from coati.utils.plot import plot_run


def test_metrics_jsonl_and_previous_run_kept(tmp_path):
    logger = MetricsLogger(str(tmp_path), "p", log=lambda m: None)
    logger.log(1, {"reward": 0.5, "loss": 0.1})
    logger.log(0, {"accuracy": 0.3, "task": "t", "mode": "greedy"}, kind="eval")
    logger.close()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert rows[0]["step"] == 1 and rows[0]["kind"] == "train" and rows[0]["reward"] == 0.5
    assert rows[1]["kind"] == "eval"
    MetricsLogger(str(tmp_path), "p", log=lambda m: None).close()
    kept = [name for name in os.listdir(tmp_path) if name.startswith("metrics.") and name != "metrics.jsonl"]
    assert len(kept) == 1 and len(open(tmp_path / kept[0]).readlines()) == 2
    assert open(tmp_path / "metrics.jsonl").read() == ""


def test_plot_writes_non_empty_pngs(tmp_path):
    logger = MetricsLogger(str(tmp_path), "p", log=lambda m: None)
    for step in range(1, 31):
        logger.log(step, {"reward": step / 30, "accuracy": step / 40, "loss": 0.01, "kl": 0.001 * step,
                          "response_length": 6.0})
    for step in (0, 30):
        logger.log(step, {"task": "add", "mode": "greedy", "accuracy": 0.4 + step / 100}, kind="eval")
    logger.close()
    written = plot_run(str(tmp_path))
    assert [os.path.basename(p) for p in written] == ["train.png", "eval.png"]
    for path in written:
        with open(path, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(path) > 10_000


def test_plot_cli_errors_clearly(tmp_path, capsys):
    assert plot_main([str(tmp_path / "missing")]) == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err


PPO_KEYS = ("value_loss", "explained_variance", "kl", "kl_coef", "rm_score", "value_clip_fraction")


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_ppo_metrics_get_panels_only_when_present(tmp_path):
    from coati.utils.plot import choose_panels

    ppo = [{"step": s, "kind": "train", "reward": 0.1 * s, "loss": 0.2, "value_loss": 1 / s,
            "explained_variance": 0.05 * s, "kl": 0.001 * s, "kl_coef": 0.05, "rm_score": 0.3 * s,
            "value_clip_fraction": 0.1} for s in range(1, 11)]
    ppo += [{"step": s, "kind": "eval", "task": "add", "mode": mode, "accuracy": 0.5, "rm_score": 0.1 * s}
            for s in (0, 10) for mode in ("greedy", "sampled")]
    panels = choose_panels(ppo)
    assert [key for key, _ in panels["train"]] == ["reward", "rm_score", "loss", "value_loss", "explained_variance",
                                                   "value_clip_fraction", "kl", "kl_coef"]
    assert [key for key, _ in panels["eval"]] == ["accuracy", "rm_score"]
    write_rows(tmp_path / "metrics.jsonl", ppo)
    written = plot_run(str(tmp_path))
    assert [os.path.basename(p) for p in written] == ["train.png", "eval.png"]
    assert all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for p in written)

    grpo = [{"step": s, "kind": "train", "reward": 0.1, "loss": 0.2, "kl": 0.01, "response_length": 6.0}
            for s in (1, 2)]
    grpo.append({"step": 2, "kind": "eval", "task": "add", "mode": "greedy", "accuracy": 0.4})
    panels = choose_panels(grpo)
    assert not {key for key, _ in panels["train"]} & (set(PPO_KEYS) - {"kl"})
    assert [key for key, _ in panels["eval"]] == ["accuracy"]
    # an SFT stage: train losses and held-out losses only, so no eval figure (as before)
    sft = [{"step": 1, "kind": "train", "loss": 1.0}, {"step": 1, "kind": "eval", "task": "sft", "loss": 0.9}]
    assert choose_panels(sft) == {"train": [("loss", "policy loss")], "eval": []}
    write_rows(tmp_path / "metrics.jsonl", sft)
    assert [os.path.basename(p) for p in plot_run(str(tmp_path))] == ["train.png"]


def test_health_rows_get_a_panel_and_a_mark_on_their_metrics_panel(tmp_path):
    from coati.utils.plot import HEALTH_PANEL, choose_panels, health_marks

    rows = [{"step": s, "kind": "train", "reward": 0.1 * s, "entropy": 0.4 / s, "grad_norm": 1.0} for s in range(1, 11)]
    rows += [{"step": s, "kind": "eval", "task": "add", "mode": "greedy", "accuracy": a}
             for s, a in ((0, .5), (10, .3))]
    rows += [{"step": 7, "kind": "health", "monitor": "entropy_collapse", "metric": "entropy", "first_step": 5,
              "last_step": 7, "message": "warning: ..."},
             {"step": 10, "kind": "health", "monitor": "eval_falls", "metric": "eval/accuracy", "first_step": 0,
              "last_step": 10, "message": "warning: ..."}]
    panels = choose_panels(rows)
    assert [key for key, _ in panels["train"]] == ["reward", "entropy", "grad_norm", "health"]
    assert panels["train"][-1] == HEALTH_PANEL
    assert health_marks(rows) == {"entropy": [(7, "entropy_collapse")], "eval/accuracy": [(10, "eval_falls")]}
    assert HEALTH_PANEL not in choose_panels(rows[:-2])["train"]  # no warning, no panel
    write_rows(tmp_path / "metrics.jsonl", rows)
    written = plot_run(str(tmp_path))
    assert [os.path.basename(p) for p in written] == ["train.png", "eval.png"]
    assert all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for p in written)
