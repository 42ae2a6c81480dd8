"""Reading the rollout logs back: how often each training prompt was trained on."""

import json

from coati.rollout.rollout_log import trained_prompt_counts


def _write(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def _group(step, source, kept, samples=2):
    return [{"step": step, "sample": sample, "source": source, "kept": kept} for sample in range(samples)]


def test_each_kept_group_counts_once_and_steps_select_records(tmp_path):
    _write(tmp_path / "rollouts_step000001.jsonl", _group(1, "train.jsonl:1", True) + _group(1, "train.jsonl:2", False))
    _write(tmp_path / "rollouts_step000003.jsonl", _group(3, "train.jsonl:1", True) + _group(3, "train.jsonl:3", True))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "sample": 0, "source": "x", "kept": True}) + "\n")
    assert trained_prompt_counts(str(tmp_path)) == {"train.jsonl:1": 2, "train.jsonl:3": 1}  # :2 was filtered out
    assert trained_prompt_counts(str(tmp_path), steps=range(1, 3)) == {"train.jsonl:1": 1}
    assert trained_prompt_counts(str(tmp_path / "none")) == {}
