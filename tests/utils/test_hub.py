"""``-m ORG/NAME`` through huggingface_hub's cache, offline (HF_HUB_OFFLINE=1, HF_HOME in tmp_path): a cached
model resolves to its snapshot, an uncached one is one line saying so and how to fill the cache. A child
process each, since huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when it is imported."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.ray_nodes import clean_env
from tests.run_helpers import ROOT, fill_hub_cache

from coati.utils.hub import is_hub_name


def offline(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    env = clean_env(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_hub_names_are_org_slash_name_and_not_a_path(tmp_path):
    assert is_hub_name("Qwen/Qwen2.5-0.5B") and not is_hub_name("runs/rlhf/sft/final")
    assert not is_hub_name("/models/qwen") and not is_hub_name("../qwen") and not is_hub_name("qwen")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").mkdir()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert not is_hub_name("org/name")  # a directory here wins
    finally:
        os.chdir(cwd)


def test_a_cached_name_resolves_offline_and_an_uncached_one_is_one_line(tmp_path, tiny_model_dir):
    snapshot = fill_hub_cache(tmp_path / "hf", "coati-test/tiny", tiny_model_dir)
    code = "from coati.utils.hub import resolve_model; import sys; print(resolve_model(sys.argv[1]))"
    found = offline(tmp_path, "-c", code, "coati-test/tiny")
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == snapshot
    refuse = ("from coati.launcher.preflight import resolve_model_names; import sys\n"
              "try:\n    resolve_model_names({'model': sys.argv[1]})\n"
              "except ValueError as err:\n    sys.exit(str(err))")
    missing = offline(tmp_path, "-c", refuse, "coati-test/absent")
    err = missing.stderr.strip()
    assert missing.returncode == 1 and "\n" not in err, err
    assert err.startswith("-m/--model coati-test/absent: not a local directory, and not in the Hugging Face "
                          f"cache {tmp_path / 'hf' / 'hub'} while HF_HUB_OFFLINE is set: fill the cache on a "
                          "machine with a network (`hf download coati-test/absent` with the same HF_HOME)"), err


def test_sft_rm_and_the_rlhf_yaml_resolve_hub_names_as_train_does(tmp_path, tiny_model_dir):
    """`coati sft/rm -m ORG/NAME` and `coati rlhf`'s YAML `model:` take hub names too (resolved before any stage)."""
    snapshot = fill_hub_cache(tmp_path / "hf", "coati-test/tiny", tiny_model_dir)
    (tmp_path / "rlhf.yaml").write_text("model: coati-test/tiny\nstages: [sft, rm]\nrm:\n  model: coati-test/tiny\n")
    code = ("import sys\n"
            "from coati.config.stage import RMConfig, SFTConfig\n"
            "from coati.rlhf.cli import resolve_model_name\n"
            "from coati.rlhf.pipeline import read_plan\n"
            "print(resolve_model_name(SFTConfig(model='coati-test/tiny'), log=lambda line: None).model)\n"
            "print(resolve_model_name(RMConfig(model='coati-test/tiny'), log=lambda line: None).model)\n"
            "plan = read_plan(sys.argv[1])\n"
            "print(plan.model)\nprint(plan.sections['rm']['model'])\n")
    found = offline(tmp_path, "-c", code, str(tmp_path / "rlhf.yaml"))
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [snapshot] * 4
    (tmp_path / "absent.yaml").write_text("model: coati-test/absent\n")
    missing = offline(tmp_path, "-m", "coati.cli", "rlhf", "--config", str(tmp_path / "absent.yaml"))
    err = missing.stderr.strip()
    assert missing.returncode == 2 and "\n" not in err, err
    assert err.startswith(f"error: --config {tmp_path / 'absent.yaml'} model: coati-test/absent: not a local "
                          "directory, and not in the Hugging Face cache"), err
