"""The demo asset cache: a build is all or nothing, and runs sharing one cache build it once."""

import multiprocessing
import os
import time

import pytest

from coati.utils.cache import build_once


def _write_marker(out_dir: str) -> None:
    with open(os.path.join(out_dir, "report.json"), "w") as handle:
        handle.write("{}")


def test_a_failed_build_leaves_nothing_and_the_next_call_builds(tmp_path):
    root = str(tmp_path / "demo-abc")

    def broken(out_dir):
        open(os.path.join(out_dir, "model.bin"), "w").close()
        raise RuntimeError("killed half way")

    with pytest.raises(RuntimeError, match="killed half way"):
        build_once(root, "report.json", broken)
    assert not os.path.exists(root)
    assert [name for name in os.listdir(tmp_path) if "building" in name] == []
    build_once(root, "report.json", _write_marker)
    assert os.path.isfile(os.path.join(root, "report.json"))


def _build_counting(root: str, count_file: str, started: str | None, wait_for: str | None) -> None:
    if started:
        open(started, "w").close()

    def build(out_dir):
        with open(count_file, "a") as handle:
            handle.write("built\n")
        deadline = time.time() + 30
        while wait_for and not os.path.exists(wait_for) and time.time() < deadline:
            time.sleep(0.05)  # holds the build open until the second process is on its way in
        _write_marker(out_dir)

    build_once(root, "report.json", build)


def test_two_processes_sharing_a_cache_build_it_once(tmp_path):
    root, count_file, second_started = (str(tmp_path / name) for name in ("cache/demo-abc", "count", "second"))
    context = multiprocessing.get_context("fork")
    first = context.Process(target=_build_counting, args=(root, count_file, None, second_started))
    first.start()
    deadline = time.time() + 30
    while not os.path.exists(count_file) and time.time() < deadline:
        time.sleep(0.05)  # the first process is inside its build
    second = context.Process(target=_build_counting, args=(root, count_file, second_started, None))
    second.start()
    for process in (first, second):
        process.join(60)
        assert process.exitcode == 0
    assert open(count_file).read() == "built\n"
    assert os.path.isfile(os.path.join(root, "report.json"))
