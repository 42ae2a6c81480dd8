"""The generic flag generator on throwaway config trees: a field with option() is a flag and a YAML key with no
other edit, nested dataclasses contribute their fields under flat names, and a name clash is refused."""

from dataclasses import dataclass

import pytest

from coati.utils.dataclass_cli import ConfigFileError, OptionClash, build_parser, construct, options, option, parse


@dataclass(frozen=True)
class Sandbox:
    depth: int = option(3, "how deep to go", "-dp")
    fast: bool = option(False, "go fast")
    timeout: float | None = option(None, "seconds per run", flag="--sandbox_timeout", metavar="S")


@dataclass(frozen=True)
class Tree:
    name: str = option("x", "a name", "-n", choices=("x", "y"))
    sandbox: Sandbox = Sandbox()
    scale: float = option(1.0, "resolved by the program", resolved=True)
    derived: int = 0  # no metadata: not a flag


def test_a_field_with_option_is_a_flag_with_no_other_edit(tmp_path):
    parser = build_parser(Tree, "tree", "")
    flags = {tuple(action.option_strings): action for action in parser._actions}
    assert ("-dp", "--depth") in flags and ("--fast", "--no-fast") in flags and ("--sandbox_timeout",) in flags
    assert ("-n", "--name") in flags and ("--derived",) not in flags
    assert flags[("--scale",)].default is None  # resolved: "not given" until the program fills it in
    assert [opt.path for opt in options(Tree)] == [(), ("sandbox",), ("sandbox",), ("sandbox",), ()]
    assert "sandbox:" in parser.format_help()  # a nested dataclass's flags are listed under its place

    tree = construct(Tree, vars(parser.parse_args(["-dp", "5", "--fast", "--sandbox_timeout", "2.5", "--scale", "3"])))
    assert tree == Tree(name="x", sandbox=Sandbox(depth=5, fast=True, timeout=2.5), scale=3.0, derived=0)

    path = tmp_path / "tree.yaml"
    path.write_text("depth: 7\nsandbox-timeout: 1e-1\nname: y\n")
    tree = construct(Tree, vars(parser.parse_args(["--config", str(path), "-dp", "8", "--scale", "1"])))
    assert (tree.name, tree.sandbox.depth, tree.sandbox.timeout) == ("y", 8, 0.1)  # the flag beats the file
    assert parser.parse_args([]).depth == 3  # the file's values were that call's defaults only


def test_a_repeated_flag_on_the_line_replaces_its_default_then_adds_up(tmp_path):
    @dataclass(frozen=True)
    class Stops:
        stop: tuple[str, ...] = option((), "stops", kind=str, repeat=True)

    parser = build_parser(Stops, "stops", "", defaults={"stop": ("\n",)})  # a command's own default: a tuple
    assert parser.parse_args([]).stop == ("\n",)
    assert parser.parse_args(["--stop", "Q:"]).stop == ["Q:"]
    assert parser.parse_args(["--stop", "Q:", "--stop", "A:"]).stop == ["Q:", "A:"]
    path = tmp_path / "stops.yaml"
    path.write_text("stop: [x, y]\n")
    assert parser.parse_args(["--config", str(path)]).stop == ["x", "y"]
    assert parser.parse_args(["--config", str(path), "--stop", "z"]).stop == ["z"]  # the line beats the file
    assert parser.parse_args([]).stop == ("\n",)


def test_flat_dataclass_parse_is_unchanged():
    @dataclass(frozen=True)
    class Flat:
        epochs: int = option(1, "passes", "-e")

    assert parse(Flat, ["-e", "4"], "flat", "") == Flat(epochs=4)


@pytest.mark.parametrize("text, message", [
    ("depht: 7\n", "has unknown key 'depht' (did you mean 'depth'?)"),
    ("fast: 1\n", "key 'fast' must be bool, got 1"),
    ("name: z\n", "key 'name' must be one of x, y, got 'z'"),
])
def test_bad_yaml_keys_are_one_line(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError) as info:
        build_parser(Tree, "tree", "").parse_args(["--config", str(path)])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_clash_between_nested_fields_is_refused():
    @dataclass(frozen=True)
    class Other:
        depth: int = option(1, "another depth")

    @dataclass(frozen=True)
    class Clashing:
        sandbox: Sandbox = Sandbox()
        other: Other = Other()

    with pytest.raises(OptionClash, match=r"Other.depth would make '--depth', which Sandbox.depth already makes"):
        options(Clashing)

    @dataclass(frozen=True)
    class AliasClash:
        sandbox: Sandbox = Sandbox()
        dump: str = option("", "where to dump", "-dp")

    with pytest.raises(OptionClash, match="'-dp'"):
        build_parser(AliasClash, "x", "")

    @dataclass(frozen=True)
    class NegationClash:
        sandbox: Sandbox = Sandbox()
        no_fast: int = option(0, "the negation of --fast is taken")

    with pytest.raises(OptionClash, match="'--no-fast'"):
        options(NegationClash)
