"""A user's own parts: --plugins imported once per process, one line for a bad entry, and the rows a driver's own
code registered shipped by value and put back into the same tables (as an actor does)."""

import sys
import textwrap
import threading

import pytest

import rl_example
from coati.algorithm.registry import ADV_ESTIMATORS, POLICY_LOSSES, register_adv_est, register_policy_loss
from coati.config.cli import build_parser, config_from_args
from coati.config.errors import ConfigError
from coati.utils import user_parts
from coati.utils.user_parts import UserParts, UserPartsError, import_user_parts, install, outside_rows, ship


def config_for(*argv):
    return config_from_args(build_parser().parse_args(list(argv)), rl_example._placeholder_demo())


PLUGIN = '''
from coati.algorithm.registry import get_policy_loss, register_policy_loss
from coati.rollout.env import ToolEnv, register_env

IMPORTS = globals().setdefault("IMPORTS", 0) + 1

@register_policy_loss("{name}")
def my_loss(inputs, config):
    return get_policy_loss("ppo_clip")(inputs, config)

@register_env("{name}_env")
class MyEnv(ToolEnv):
    pass
'''


@pytest.fixture
def plugin_file(tmp_path):
    from coati.rollout.env import ENVS

    name = f"plugin_loss_{tmp_path.name}"
    path = tmp_path / "my_parts.py"
    path.write_text(PLUGIN.format(name=name))
    yield str(path), name
    POLICY_LOSSES.pop(name, None)
    ENVS.pop(f"{name}_env", None)


def test_a_plugin_file_is_imported_once_and_its_names_validate(plugin_file, monkeypatch, tmp_path, registries_restored):
    path, name = plugin_file
    monkeypatch.chdir(tmp_path)
    config = config_for("--plugins", "my_parts.py", "--grpo-config", f'{{"objective": "{name}"}}',
                        "--env", f"{name}_env")
    assert config.algo.loss.objective == name and name in POLICY_LOSSES
    # the file by its absolute path (an actor's working directory is not the driver's); imported once: a second
    # config, or the same file spelled by its absolute path, registers nothing twice
    assert config.parts.plugins == (path,)
    module, = import_user_parts([path])
    config_for("--plugins", path, "--grpo-config", f'{{"objective": "{name}"}}')
    assert module.IMPORTS == 1
    assert config.parts.shipped is None  # the plugin's rows are imported by every process, not shipped


def test_a_module_name_is_imported(tmp_path, monkeypatch, registries_restored):
    package = tmp_path / "my_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "parts.py").write_text(PLUGIN.format(name="pkg_loss"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module, = import_user_parts(["my_pkg.parts"])
        assert POLICY_LOSSES["pkg_loss"] is module.my_loss
    finally:
        POLICY_LOSSES.pop("pkg_loss", None)
        from coati.rollout.env import ENVS

        ENVS.pop("pkg_loss_env", None)


def test_bad_entries_are_one_line(tmp_path):
    with pytest.raises(UserPartsError, match=r"^--plugins nowhere\.py: no such file \(give a \.py file's path"):
        import_user_parts(["nowhere.py"])
    with pytest.raises(UserPartsError, match=r"^--plugins no_such_pkg\.parts: no module named 'no_such_pkg' here"):
        import_user_parts(["no_such_pkg.parts"])
    broken = tmp_path / "broken.py"
    broken.write_text("x = 1\nraise RuntimeError('the parts are broken')\n")
    with pytest.raises(UserPartsError) as err:
        import_user_parts([str(broken)])
    assert str(err.value) == (f"--plugins {broken}: importing it failed at {broken}:2: RuntimeError: the parts "
                              "are broken")
    inner = tmp_path / "inner.py"
    inner.write_text("import no_such_dependency\n")
    with pytest.raises(UserPartsError, match=r"importing it failed at .*inner\.py:1: ModuleNotFoundError"):
        import_user_parts([str(inner)])


def test_the_command_line_refuses_a_bad_entry_in_one_line(capsys, tmp_path):
    code = rl_example.main(["--plugins", str(tmp_path / "missing.py")])
    err = capsys.readouterr().err
    assert code == 2 and err == f"error: --plugins {tmp_path / 'missing.py'}: no such file (give a .py file's path, " \
                                 "or a module name such as my_pkg.parts that `python -c 'import my_pkg.parts'` " \
                                 "imports)\n"
    with pytest.raises(ConfigError, match="no module named 'nowhere_pkg'"):
        config_for("--plugins", "nowhere_pkg")


def test_rows_of_the_drivers_own_code_travel_by_value_and_are_put_back():
    @register_policy_loss("shipped_loss")
    def shipped_loss(inputs, config):
        return 0.0, {}

    @register_adv_est("shipped_adv")
    def shipped_adv(rewards):
        return rewards

    try:
        rows = outside_rows()
        assert rows[("coati.algorithm.registry:POLICY_LOSSES", "shipped_loss")] is shipped_loss
        config = config_for("--grpo-config", '{"objective": "shipped_loss", "advantage": "shipped_adv"}')
        shipped = config.parts.shipped
        assert {"policy loss shipped_loss", "advantage estimator shipped_adv"} <= set(shipped.names)
        # an actor's process: the rows are not there until installed
        del POLICY_LOSSES["shipped_loss"], ADV_ESTIMATORS["shipped_adv"]
        install(shipped)
        assert POLICY_LOSSES["shipped_loss"](None, None) == (0.0, {})  # a copy of the function, by value
        assert ADV_ESTIMATORS["shipped_adv"].fn(3) == 3 and ADV_ESTIMATORS["shipped_adv"].inputs == "group"
        # rows installed from a shipment, or deleted, are not the driver's own any more
        assert ("coati.algorithm.registry:POLICY_LOSSES", "shipped_loss") not in outside_rows()
    finally:
        POLICY_LOSSES.pop("shipped_loss", None)
        ADV_ESTIMATORS.pop("shipped_adv", None)
    assert not any(key[1].startswith("shipped_") for key in outside_rows())


def test_coatis_own_rows_are_never_shipped():
    assert ship() is None or all("ppo_clip" not in name for name in ship().names)
    assert not [key for key in outside_rows() if key[1] in ("ppo_clip", "group_norm", "overlong", "python_tool")]


def test_rows_that_cannot_travel_are_one_line():
    lock = threading.Lock()

    @register_policy_loss("locked_loss")
    def locked_loss(inputs, config):
        with lock:
            return 0.0, {}

    try:
        with pytest.raises(ConfigError, match=r"^your own parts \(policy loss locked_loss\) cannot be sent to the Ray "
                                              r"actors \(TypeError: .*\): put them in a file and pass it as "
                                              r"--plugins FILE\.py$"):
            config_for()
    finally:
        del POLICY_LOSSES["locked_loss"]


def test_a_shipment_that_cannot_be_loaded_is_one_line():
    bad = user_parts.ShippedRows(("policy loss gone",), b"not a pickle")
    with pytest.raises(UserPartsError, match=r"^the parts registered in the driver's own code \(policy loss gone\) "
                                             r"cannot be loaded in this actor"):
        UserParts(shipped=bad).load()


def test_plugins_is_a_yaml_list(tmp_path, plugin_file, registries_restored):
    path, name = plugin_file
    config_file = tmp_path / "run.yaml"
    config_file.write_text(textwrap.dedent(f"""\
        plugins: [{path}]
        grpo_config: {{"objective": "{name}"}}
        """))
    config = config_for("--config", str(config_file))
    assert config.parts.plugins == (path,) and config.algo.loss.objective == name


def test_every_command_refuses_a_bad_entry_before_anything_starts(tmp_path, capsys):
    from coati.config.stage import SFTConfig, validate
    from coati.rlhf.evaluate import main as evaluate

    missing = str(tmp_path / "missing.py")
    with pytest.raises(ConfigError, match=r"^--plugins .*missing\.py: no such file"):
        validate(SFTConfig(parts=UserParts((missing,))))
    assert evaluate(["--plugins", missing]) == 2
    assert capsys.readouterr().err.startswith(f"error: --plugins {missing}: no such file")


def test_an_actors_start_puts_the_shipped_rows_back():
    from coati.utils.actor_process import start_actor_process

    @register_policy_loss("actor_loss")
    def actor_loss(inputs, config):
        return 1.0, {}

    try:
        parts = config_for("--grpo-config", '{"objective": "actor_loss"}').parts
        del POLICY_LOSSES["actor_loss"]  # as in a fresh worker process
        start_actor_process(parts)
        assert POLICY_LOSSES["actor_loss"](None, None) == (1.0, {})
    finally:
        POLICY_LOSSES.pop("actor_loss", None)


def test_a_plugin_file_the_script_imported_itself_is_not_run_twice(tmp_path, monkeypatch):
    """`import my_parts` in a script, then `coati.run(plugins=["my_parts.py"])`: its rows register once."""
    import importlib

    (tmp_path / "own_parts.py").write_text(PLUGIN.format(name="own_loss"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = importlib.import_module("own_parts")
        assert import_user_parts([str(tmp_path / "own_parts.py")]) == [module] and module.IMPORTS == 1
    finally:
        from coati.rollout.env import ENVS

        POLICY_LOSSES.pop("own_loss", None)
        ENVS.pop("own_loss_env", None)
        sys.modules.pop("own_parts", None)
