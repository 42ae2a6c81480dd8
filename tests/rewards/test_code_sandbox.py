"""The code reward against hostile programs, in a real bubblewrap sandbox (no mocks).

Each hostile program is written so that, if the attack worked, its output would be exactly the expected
output: a pass would mean the sandbox failed. Every case must come back not correct with a reason, leave no
process behind (checked by scanning /proc) and leave the host unchanged.
"""

import dataclasses
import os
import secrets
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from rewards.code import CodeRewardScorer, SandboxLimits, SandboxUnavailable, check_sandbox_available
from rewards.code.uids import _UID_SLOTS as UID_SLOTS  # the uids a scorer claims from, above its base
from rewards.types import FORMAT_REWARD

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install -y bubblewrap)"
)

REPO = Path(__file__).resolve().parents[2]
MARKER = "424242"  # argument of the sleeps hostile programs leave behind, to find them in /proc
UID_BASE = 1_950_000_000  # away from the default range, so other scorers on the host are never mixed up
LIMITS = SandboxLimits(cpu_time_s=1, wall_time_s=1.5, address_space_bytes=512 << 20, max_output_bytes=1 << 20)


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


def one_case(expected: str, stdin: str = "") -> dict:
    return {"inputs": [stdin], "outputs": [expected]}


def sandbox_processes(uids) -> list[str]:
    """Processes of the sandbox uids, or whose command line carries a sandbox marker, as 'pid cmdline'. A
    sandbox's command line counts only under this module's uid range: another pytest worker's scorers (the
    default uid base) may be running programs at the same time."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields["State"].split()[0] in ("Z", "X"):  # exited, waiting to be reaped
            continue
        process_uids = {int(u) for u in fields["Uid"].split()}
        in_module_range = any(UID_BASE <= uid < UID_BASE + UID_SLOTS for uid in process_uids)
        if process_uids & set(uids) or MARKER in cmdline or (in_module_range and "/code/" in cmdline):
            found.append(f"{entry} {cmdline}")
    return found


@pytest.fixture(scope="module")
def scorer():
    with CodeRewardScorer(LIMITS, all_or_nothing=False, max_workers=2, uid_base=UID_BASE) as s:
        yield s


ONCE = pytest.mark.parametrize("score_hostile", ["once"], indirect=True)


@pytest.fixture(params=["once", "twice in one sandbox"])
def score_hostile(scorer, request):
    """Score one hostile response; check it failed, with a reason, and left no process behind. The case once,
    and twice (the second run in the sandbox the first one attacked)."""
    uids = set(scorer._uids._fds)
    copies = 1 if request.param == "once" else 2  # the param may be overridden (ONCE)

    def run(code: str, test_cases: dict, reasons: tuple[str, ...]):
        test_cases = {key: value * copies for key, value in test_cases.items()}
        start = time.monotonic()
        result = scorer.score(fenced(code), test_cases)
        elapsed = time.monotonic() - start
        print(f"{result.reason!r} after {elapsed:.2f}s")
        assert result.format_ok and not result.correct
        assert result.reward == pytest.approx(FORMAT_REWARD)  # score 0
        assert result.reason.startswith(reasons), result.reason
        assert elapsed < copies * LIMITS.wall_time_s + 3
        assert sandbox_processes(uids) == []  # nothing left, checked at once (no grace period)
        return result

    yield run
    assert sandbox_processes(uids) == []


@pytest.mark.timeout(30)
def test_network_to_host_listener_and_outside_is_blocked(score_hostile):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def serve():
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(conn)
            conn.sendall(b"hello-from-host\n")
            conn.close()

    stop = threading.Event()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    code = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "print(s.recv(100).decode(), end='')\n"
    )
    score_hostile(code, one_case("hello-from-host\n"), ("runtime error on case 0",))
    outside = "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\nprint('connected')\n"
    score_hostile(outside, one_case("connected\n"), ("runtime error on case 0",))
    stop.set()
    thread.join()
    server.close()
    assert accepted == []


@pytest.mark.timeout(30)
def test_fork_bomb(score_hostile, scorer):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    score_hostile(code, one_case("done\n"), ("timeout on case 0", "runtime error on case 0"))
    # the host (and the sandbox uid) recovered: the next program runs normally
    assert scorer.score(fenced("print(input())"), one_case("hi\n", "hi\n")).correct


# A memory bomb must be stopped by the address-space limit, so it gets a clock it cannot run out first: under
# LIMITS' 1.5 s, at a load average of 30, the gradual bomb below had not yet filled 512 MB and ended as a timeout.
MEMORY_LIMITS = dataclasses.replace(LIMITS, cpu_time_s=20, wall_time_s=30)


@pytest.mark.timeout(120)
def test_memory_bomb():
    with CodeRewardScorer(MEMORY_LIMITS, all_or_nothing=False, max_workers=1, uid_base=UID_BASE) as scorer:
        uids = set(scorer._uids._fds)
        gradual = "x = []\nwhile True:\n    x.append(bytearray(50 << 20))\n"
        for code in ("b = bytearray(8 << 30)\nprint('allocated')\n", gradual):
            result = scorer.score(fenced(code), one_case("allocated\n"))
            assert result.format_ok and not result.correct and result.reward == pytest.approx(FORMAT_REWARD)
            assert result.reason.startswith("runtime error on case 0"), result.reason
            assert sandbox_processes(uids) == []


@pytest.mark.timeout(30)
@ONCE  # a limit's kill leaves nothing behind for a second case to meet
def test_infinite_loop(score_hostile):
    score_hostile("while True:\n    pass\n", one_case("0\n"), ("timeout on case 0",))


@pytest.mark.timeout(30)
@ONCE  # a limit's kill leaves nothing behind for a second case to meet
def test_cpu_limit_survives_ignoring_sigxcpu(score_hostile):
    code = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n"
    score_hostile(code, one_case("0\n"), ("timeout on case 0",))


@pytest.mark.timeout(30)
@ONCE  # a limit's kill leaves nothing behind for a second case to meet
def test_sleep_forever(score_hostile):
    score_hostile("import time\ntime.sleep(10**6)\n", one_case("0\n"), ("timeout on case 0",))


@pytest.mark.timeout(30)
def test_writes_outside_the_sandbox_tmp(score_hostile, tmp_path):
    name = f"coati-sandbox-escape-{secrets.token_hex(4)}"
    targets = [REPO / name, Path.home() / name, Path("/tmp") / name, tmp_path / name, Path("/") / name]
    targets += [Path("/usr") / name, REPO / "rewards" / name]
    code = (
        "import os\n"
        f"for path in {[str(t) for t in targets]!r}:\n"
        "    try:\n"
        "        os.makedirs(os.path.dirname(path), exist_ok=True)\n"
        "        with open(path, 'w') as f:\n"
        "            f.write('pwned')\n"
        "        print(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "open('/tmp/own-tmp-is-fine', 'w').write('ok')\n"  # its private tmpfs is writable
    )
    expected = "".join(f"{t}\n" for t in targets)
    score_hostile(code, one_case(expected), ("wrong answer on case 0",))
    assert [t for t in targets if t.exists()] == []


@pytest.mark.timeout(30)
def test_reads_outside_the_allowed_set(score_hostile):
    secret = secrets.token_hex(16)
    with open(REPO / f".coati-sandbox-secret-{secrets.token_hex(4)}", "w") as handle:
        handle.write(secret)
    try:
        paths = [handle.name, str(REPO / "rewards" / "types.py"), "/etc/passwd", str(Path.home() / ".bashrc")]
        paths = [p for p in paths if os.path.isfile(p)]
        expected = "".join(Path(p).read_text() for p in paths) + "\n".join(sorted(os.listdir("/root"))) + "\n"
        code = (
            "import os\n"
            f"for path in {paths!r}:\n"
            "    print(open(path).read(), end='')\n"
            "print('\\n'.join(sorted(os.listdir('/root'))))\n"
        )
        score_hostile(code, one_case(expected), ("runtime error on case 0",))
    finally:
        os.unlink(handle.name)


@pytest.mark.timeout(30)
def test_environment_is_not_inherited(score_hostile, monkeypatch):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("COATI_SANDBOX_SECRET", secret)
    code = (
        "import os\n"
        "found = [v for v in os.environ.values() if len(v) == 32]\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        for kv in open(f'/proc/{pid}/environ', 'rb').read().split(b'\\0'):\n"
        "            if kv.startswith(b'COATI_SANDBOX_SECRET='):\n"
        "                found.append(kv.split(b'=', 1)[1].decode())\n"
        "    except (OSError, ValueError):\n"
        "        pass\n"
        "print(os.environ.get('COATI_SANDBOX_SECRET') or (found[0] if found else 'none'))\n"
    )
    score_hostile(code, one_case(secret + "\n"), ("wrong answer on case 0",))


@pytest.mark.timeout(30)
def test_killing_the_parent(score_hostile, scorer):
    code = (
        "import os, signal\n"
        f"for pid in (os.getppid(), 1, {os.getpid()}, {os.getppid()}):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass\n"
        "try:\n"
        "    os.kill(-1, signal.SIGKILL)\n"
        "except OSError:\n"
        "    pass\n"
        "os._exit(3)\n"
    )
    score_hostile(code, one_case("killed\n"), ("runtime error on case 0",))
    assert scorer.score(fenced("print(input())"), one_case("alive\n", "alive\n")).correct  # the scorer lives on


@pytest.mark.timeout(30)
def test_100_mb_of_stdout(score_hostile):
    code = "import sys\nblock = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(block)\n"
    score_hostile(code, one_case("x\n"), ("output limit exceeded on case 0",))


@pytest.mark.timeout(30)
def test_orphaned_daemon_is_killed(score_hostile):
    # double fork + setsid: the grandchild sleeps on (holding stdout open) after the program exits
    code = (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/bin/sleep', ['sleep', '{MARKER}'])\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "print('parent done')\n"
    )
    score_hostile(code, one_case("daemon left\n"), ("wrong answer on case 0",))
    nohup = (
        "import subprocess\n"
        f"subprocess.Popen(['sleep', '{MARKER}'], start_new_session=True,\n"
        "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    )
    score_hostile(nohup, one_case("daemon left\n"), ("wrong answer on case 0",))


@pytest.mark.timeout(30)
def test_fork_bomb_does_not_starve_its_neighbours(scorer):
    """Each worker has its own uid, so one candidate's fork bomb leaves the others' process limit alone."""
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    responses = [fenced(bomb)] + [fenced("print(int(input()) * 2)")] * 4
    cases = [one_case("0\n")] + [one_case(f"{2 * i}\n", f"{i}\n") for i in range(4)]
    results = scorer.score_batch(responses, cases)
    assert not results[0].correct and results[0].reason.startswith(("timeout", "runtime error"))
    assert [r.correct for r in results[1:]] == [True] * 4
    assert sandbox_processes(set(scorer._uids._fds)) == []


@pytest.mark.timeout(30)
def test_sandbox_view(scorer):
    """What a program sees: its own uid, an empty environment, a read-only root, a writable private /tmp."""
    code = (
        "import os\n"
        "print(os.getuid() != 0, os.getcwd(), sorted(os.environ))\n"
        "print(sorted(os.listdir('/')))\n"
        "for path in ('/x', '/tmp/x'):\n"
        "    try:\n"
        "        open(path, 'w').write('1')\n"
        "        print(path, 'writable')\n"
        "    except OSError:\n"
        "        print(path, 'read-only')\n"
    )
    system = [d for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32") if os.path.lexists(f"/{d}")]
    expected = (
        "True /tmp ['HOME', 'LANG', 'PATH', 'PWD']\n"
        f"{sorted(['code', 'dev', 'proc', 'tmp', 'usr', *system])}\n"
        "/x read-only\n/tmp/x writable\n"
    )
    result = scorer.score(fenced(code), one_case(expected))
    assert result.correct, result.reason


@pytest.mark.timeout(30)
def test_reward_by_fraction_and_all_or_nothing(scorer):
    cases = {"inputs": ["1\n", "2\n", "3\n", "4\n"], "outputs": ["1\n", "2\n", "3\n", "5\n"]}
    result = scorer.score(fenced("print(input())"), cases)
    assert not result.correct and result.format_ok
    assert result.reward == pytest.approx(FORMAT_REWARD + (1 - FORMAT_REWARD) * 0.75)
    assert result.reason == "wrong answer on case 3 (3/4 passed)"
    with CodeRewardScorer(LIMITS, all_or_nothing=True, max_workers=1, uid_base=UID_BASE) as strict:
        result = strict.score(fenced("print(input())"), cases)
        assert (result.reward, result.reason) == (pytest.approx(FORMAT_REWARD), "wrong answer on case 3")
        first_fails = {"inputs": ["1\n", "2\n"], "outputs": ["0\n", "2\n"]}
        assert strict.score(fenced("print(input())"), first_fails).reason == "wrong answer on case 0"


@pytest.mark.timeout(30)
def test_outcomes_and_reasons(scorer):
    trailing_spaces = "import sys\nprint(sum(map(int, sys.stdin.read().split())), '  ')\n\n"
    ok = scorer.score(fenced(trailing_spaces), one_case("7", "3 4"))
    assert (ok.reward, ok.correct, ok.reason) == (1.0, True, "ok")
    assert ok.extracted.startswith("import sys")
    crash = scorer.score(fenced("raise SystemExit(2)"), one_case("1\n"))
    assert (crash.correct, crash.reason) == (False, "runtime error on case 0 (0/1 passed)")
    none = scorer.score("I don't know.", one_case("1\n"))
    assert (none.reward, none.format_ok, none.extracted, none.reason) == (0.0, False, None, "no code block")
    with pytest.raises(ValueError, match="test_cases.outputs must be a list of strings"):
        scorer.score(fenced("print(1)"), {"inputs": ["1"], "outputs": [1]})


@pytest.mark.timeout(30)
def test_large_stdin_and_unread_stdin(scorer):
    big = "x" * (3 << 20)
    assert scorer.score(fenced("import sys\nprint(len(sys.stdin.read()))"), one_case(f"{len(big)}\n", big)).correct
    assert scorer.score(fenced("print(5)"), one_case("5\n", big)).correct  # never reads its input


@pytest.mark.timeout(30)
def test_score_batch_keeps_order(scorer):
    responses = [fenced(f"print({i})") for i in range(6)] + ["no code"]
    cases = [one_case(f"{i}\n") for i in range(6)] + [one_case("0\n")]
    results = scorer.score_batch(responses, cases)
    assert [r.correct for r in results] == [True] * 6 + [False]
    with pytest.raises(ValueError):
        scorer.score_batch(responses, cases[:-1])


def test_identical_programs_of_a_batch_run_once(scorer):
    # A coin flip per run: 8 separate runs would all agree with probability 2/256; one shared run always does.
    coin = fenced("import os\nprint(os.urandom(1)[0] % 2)")
    other = fenced("print(1)")
    results = scorer.score_batch([coin] * 8 + [other], [one_case("1\n")] * 9)
    assert len({r.correct for r in results[:8]}) == 1
    assert results[8].correct
    different_cases = scorer.score_batch([other, other], [one_case("1\n"), one_case("2\n")])
    assert [r.correct for r in different_cases] == [True, False]


@pytest.mark.timeout(30)
def test_missing_bubblewrap_refuses_to_run(monkeypatch, tmp_path, scorer):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, no prlimit on PATH
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
        check_sandbox_available()
    with pytest.raises(SandboxUnavailable):
        scorer.score(fenced("print(1)"), one_case("1\n"))  # never falls back to running it unsandboxed
    with pytest.raises(SandboxUnavailable):
        CodeRewardScorer(LIMITS, max_workers=1, uid_base=UID_BASE)


@pytest.mark.timeout(30)
def test_missing_interpreter_is_reported():
    with pytest.raises(SandboxUnavailable, match="not found"):
        check_sandbox_available(python="/nonexistent/python3")


def test_limits_are_validated():
    with pytest.raises(ValueError):
        SandboxLimits(cpu_time_s=0)
    with pytest.raises(ValueError):
        SandboxLimits(max_processes=1)
