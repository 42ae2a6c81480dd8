"""Which Ray cluster a run uses (coati/cluster/connect.py): addresses, RAY_ADDRESS precedence, and a bad
address as one line within seconds through the real CLI. (A real two-node cluster: tests/e2e/test_multinode.py.)"""

from __future__ import annotations

import json

import pytest

from coati.cluster.connect import DEFAULT_RAY_PORT, cluster_address, parse_address
from coati.config.cli import build_parser, config_from_args
from coati.config.errors import ConfigError
from tests.ray_nodes import clean_env, free_port
from tests.run_helpers import timed_cli


@pytest.mark.parametrize("text, expected", [
    ("10.0.0.3", ("10.0.0.3", DEFAULT_RAY_PORT)),
    ("10.0.0.3:7000", ("10.0.0.3", 7000)),
    (" head-node:6380 ", ("head-node", 6380)),
    ("[fe80::1]:7000", ("fe80::1", 7000)),
    ("[fe80::1]", ("fe80::1", DEFAULT_RAY_PORT)),
])
def test_parse_address(text, expected):
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["", "10.0.0.3:", "10.0.0.3:http", "10.0.0.3:0", "10.0.0.3:70000", ":6379",
                                  "ray://10.0.0.3:10001", "10.0.0.3/24"])
def test_bad_addresses_are_rejected_with_the_expected_form(text):
    with pytest.raises(ValueError, match=r"is not HOST or HOST:PORT \(the Ray head's address, e\.g\. 10\.0\.0\.3"):
        parse_address(text)


def test_ray_address_wins_over_master_address():
    assert cluster_address("10.0.0.3", {"RAY_ADDRESS": "10.0.0.9:7000"}) == ("10.0.0.9:7000", "RAY_ADDRESS")
    assert cluster_address("10.0.0.3", {}) == ("10.0.0.3:6379", "--master_address")
    assert cluster_address("[fe80::1]:7000", {}) == ("[fe80::1]:7000", "--master_address")
    assert cluster_address(None, {"RAY_ADDRESS": "local"}) == (None, "RAY_ADDRESS")
    assert cluster_address(None, {"RAY_ADDRESS": ""}) == (None, "")  # empty counts as unset, as in Ray


def test_flag_errors_before_anything_starts(tmp_path):
    parse = build_parser().parse_args
    from rl_example import _placeholder_demo

    with pytest.raises(ConfigError, match="--master_address 'head:99999' is not HOST or HOST:PORT"):
        config_from_args(parse(["--master_address", "head:99999"]), _placeholder_demo())
    with pytest.raises(ConfigError, match="--master_port must lie in 1..65535"):
        config_from_args(parse(["--master_port", "0"]), _placeholder_demo())


def rows(path, n=8):
    path.write_text("".join(json.dumps({"messages": {"role": "user", "content": f"{i}+1="}, "gt_answer": str(i + 1)})
                            + "\n" for i in range(n)))
    return str(path)


@pytest.mark.parametrize("address, expected", [
    ("127.0.0.1:{port}", "error: no Ray head at 127.0.0.1:{port} (--master_address): nothing listens there; start "
                         "it with launch/start_head.sh {port} (ray start --head --port {port}) or fix the address"),
    ("no-such-host.invalid", "error: --master_address no-such-host.invalid:6379: cannot resolve host "
                             "'no-such-host.invalid'"),
], ids=["closed-port", "unknown-host"])
def test_unreachable_head_is_one_line_within_seconds(tiny_model_dir, tmp_path, address, expected):
    port = free_port()  # free now: nothing listens there
    argv = ["-m", tiny_model_dir, "-d", rows(tmp_path / "d.jsonl"), "-ibs", "8", "-imbs", "8", "-tbs", "8", "-tMbs",
            "8", "-g", "2", "-tmbs", "16", "--master_address", address.format(port=port), "-sd", str(tmp_path)]
    output, seconds = timed_cli(argv, clean_env(), tmp_path)
    assert len(output) == 1 and output[0].startswith(expected.format(port=port)), output
    assert seconds < 15

