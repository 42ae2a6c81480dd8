"""Where a role's trainer state lies in a checkpoint: ``trainer_state/<role>/``, and the policy's state directly
in ``trainer_state/`` for checkpoints written before the trainer group had roles."""

from coati.plugins.state import MANIFEST
from coati.trainer.roles import ACTOR, grad_norm_name, role_state_dir


def test_role_state_dirs_old_and_new_layouts(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / MANIFEST).write_text("{}")
    assert role_state_dir(str(old), ACTOR) == str(old)  # a checkpoint from before the roles
    assert role_state_dir(str(old), "critic") == str(old / "critic")
    new = tmp_path / "new"
    (new / ACTOR).mkdir(parents=True)
    (new / ACTOR / MANIFEST).write_text("{}")
    assert role_state_dir(str(new), ACTOR) == str(new / ACTOR)


def test_grad_norm_names():
    assert grad_norm_name(ACTOR) == "grad_norm" and grad_norm_name("critic") == "critic_grad_norm"
