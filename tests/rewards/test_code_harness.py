"""One sandbox, many cases (rewards/code/sandbox.CaseRunner, rewards/code/harness.py), in a real bubblewrap sandbox:
a case runs as a fresh interpreter would run its program, and nothing of one case (processes, files, signals,
forged results, its code) reaches another case, the harness or the host."""

import dataclasses
import shutil
import time

import pytest

from rewards.code.harness import HEADER
from rewards.code.sandbox import OK, OUTPUT_LIMIT, RUNTIME_ERROR, TIMEOUT, CaseRunner, SandboxLimits
from rewards.code.uids import UidPool
from tests.rewards.test_code_sandbox import LIMITS, UID_BASE, sandbox_processes

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install -y bubblewrap)"
)


@pytest.fixture(scope="module")
def uid():
    with UidPool(1, UID_BASE + 8) as pool:  # away from test_code_sandbox's scorers' slots
        uid = pool.acquire()
        yield uid
        pool.release(uid)


def run(code: str | list[str], stdins: list[str], uid: int, limits: SandboxLimits = LIMITS):
    """Each stdin's result, all in one sandbox (``code`` one program, or one per stdin); no process is left."""
    codes = code if isinstance(code, list) else [code] * len(stdins)
    with CaseRunner(limits, uid) as runner:
        results = [runner.run(program, stdin.encode()) for program, stdin in zip(codes, stdins)]
    assert sandbox_processes({uid}) == []
    return results


# What a case tries against the cases after it, the harness (pid 1) and the host. Each attempt prints what it got.
ATTACK = f'''
import os, signal, struct, sys
report = []
try:  # a result for this case, forged into the harness's pipe to the host
    with open("/proc/1/fd/1", "wb", buffering=0) as pipe:
        pipe.write(struct.pack({HEADER.format!r}, 0, 0, 7, 0, 0.0) + b"forged\\n")
    report.append("forged a result")
except OSError:
    report.append("fd denied")
try:
    open("/proc/1/mem", "rb").close()
    report.append("mem open")
except OSError:
    report.append("mem denied")
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGSTOP, signal.SIGKILL, signal.SIGHUP):
    try:
        os.kill(1, sig)
    except OSError:
        pass
open("/tmp/left-behind", "w").write("x")
open("/dev/shm/left-behind", "w").write("x")
os.makedirs("/tmp/locked/deeper")
os.chmod("/tmp/locked", 0)
os.chmod("/tmp", 0)
if os.fork() == 0:  # a daemon that writes into every stdout it can open, for a while
    os.setsid()
    if os.fork() == 0:
        import time
        end = time.time() + 20
        while time.time() < end:
            for pid in os.listdir("/proc"):
                if pid.isdigit() and int(pid) != os.getpid():
                    try:
                        with open(f"/proc/{{pid}}/fd/1", "w") as out:
                            out.write("pwned\\n")
                    except OSError:
                        pass
            time.sleep(0.01)
    os._exit(0)
os.wait()
print(" ".join(report))
'''

CHECK = '''
import os, time
time.sleep(0.3)  # the daemon's chance, were it alive
left = [p for p in ("/tmp/left-behind", "/dev/shm/left-behind", "/tmp/locked") if os.path.lexists(p)]
print("dirty" if left else "clean", oct(os.stat("/tmp").st_mode & 0o777))
'''


@pytest.mark.timeout(60)
def test_a_case_reaches_neither_the_next_case_nor_the_harness(uid):
    code = f"import sys\nif sys.stdin.readline() == 'attack\\n':\n    exec({ATTACK!r})\nelse:\n    exec({CHECK!r})\n"
    tmp_mode = run("import os\nprint(oct(os.stat('/tmp').st_mode & 0o777))", [""], uid)[0].stdout.decode().strip()
    start = time.monotonic()
    attack, check, again = run(code, ["attack\n", "check\n", "check\n"], uid)
    assert time.monotonic() - start < 8  # the daemon, holding the attack's stdout for 20 s, died with the case
    # (its daemon's "pwned" lines may land in its own stdout: that is the attacking case's own output)
    assert attack.status == OK and set(attack.stdout.splitlines()) - {b"pwned"} == {b"fd denied mem denied"}, attack
    assert (check.status, check.stdout) == (OK, f"clean {tmp_mode}\n".encode()), check
    assert (again.status, again.stdout) == (OK, f"clean {tmp_mode}\n".encode()), again


@pytest.mark.timeout(60)
def test_each_case_ends_as_a_fresh_interpreter_run_would(uid):
    program = '''
import atexit, sys, threading
case = sys.stdin.readline().strip()
atexit.register(lambda: print("atexit", case))
print(__name__, sys.argv, case)
if case == "raise":
    def inner():
        raise ValueError("boom")
    inner()
elif case == "exit-text":
    sys.exit("bye")
elif case == "exit-3":
    raise SystemExit(3)
elif case == "thread":
    threading.Thread(target=lambda: (__import__("time").sleep(0.2), print("thread done"))).start()
elif case == "kill-self":
    import os, signal
    os.kill(os.getpid(), signal.SIGTERM)
'''
    cases = ["plain", "raise", "exit-text", "exit-3", "thread", "kill-self"]
    results = run(program, [c + "\n" for c in cases], uid)
    for result, case in zip(results, cases):
        if case != "kill-self":
            assert result.stdout.startswith(f"__main__ ['/code/main.py'] {case}\n".encode()), result
    plain, raised, exit_text, exit_3, thread, killed = results
    assert (plain.status, plain.returncode, plain.stdout.splitlines()[-1]) == (OK, 0, b"atexit plain")
    assert (raised.status, raised.returncode) == (RUNTIME_ERROR, 1)
    # the program's frames only, as python prints them
    assert raised.stderr == (b'Traceback (most recent call last):\n  File "/code/main.py", line 9, in <module>\n'
                             b'    inner()\n  File "/code/main.py", line 8, in inner\n'
                             b'    raise ValueError("boom")\nValueError: boom\n')
    assert (exit_text.status, exit_text.returncode, exit_text.stderr) == (RUNTIME_ERROR, 1, b"bye\n")
    assert (exit_3.status, exit_3.returncode) == (RUNTIME_ERROR, 3)
    assert thread.status == OK and thread.stdout.endswith(b"thread done\natexit thread\n")
    assert (killed.status, killed.returncode) == (RUNTIME_ERROR, -15)
    # each case alone in a fresh sandbox gives the same verdict as after the others
    for case, result in zip(cases, results):
        alone = run(program, [case + "\n"], uid)[0]
        assert (alone.status, alone.stdout, alone.returncode) == (result.status, result.stdout, result.returncode)


@pytest.mark.timeout(60)
def test_limits_hold_per_case_and_the_next_case_runs(uid):
    program = '''
import sys, time
case = sys.stdin.readline().strip()
if case == "spin":
    while True:
        pass
elif case == "sleep":
    time.sleep(100)
elif case == "flood":
    while True:
        sys.stdout.write("x" * 65536)
elif case == "syntax":
    exec("print(1")
else:
    print(len(sys.stdin.read()))
'''
    # an input larger than the largest file a program may write (its stdin is a pipe, not a file)
    limits = dataclasses.replace(LIMITS, max_output_bytes=1 << 16, max_file_bytes=1 << 20)
    big = "y" * (2 << 20)
    stdins = ["spin\n", "ok\n" + big, "sleep\n", "ok\n", "flood\n", "syntax\n", "ok\n"]
    start = time.monotonic()
    spin, ok_big, sleep, ok, flood, syntax, ok_last = run(program, stdins, uid, limits)
    assert time.monotonic() - start < 2 * limits.wall_time_s + 3
    assert spin.status == TIMEOUT and sleep.status == TIMEOUT
    assert (ok_big.status, ok_big.stdout) == (OK, f"{len(big)}\n".encode())
    assert (ok.status, ok.stdout) == (ok_last.status, ok_last.stdout) == (OK, b"0\n")
    assert flood.status == OUTPUT_LIMIT and len(flood.stdout) == limits.max_output_bytes
    assert syntax.status == RUNTIME_ERROR and syntax.stderr.endswith(b"SyntaxError: '(' was never closed\n")
    # a program that does not compile fails every case with python's message, the harness carrying on
    broken = run("print(1", ["", ""], uid)
    assert [r.status for r in broken] == [RUNTIME_ERROR] * 2
    assert all(r.stderr.startswith(b'  File "/code/main.py", line 1') for r in broken)


@pytest.mark.timeout(60)
def test_programs_in_one_sandbox_see_nothing_of_each_other(uid):
    """A batch's responses share a sandbox: one program's code is in no later case's memory, and a harness
    that died or missed a case's limit is replaced for the next case."""
    secret = "SECRET-" + "7" * 16
    # every str and bytes object the interpreter's objects and the stack's frames hold; the marks
    # are joined at run time, after the search (a constant would be in the spy's own code); the comment in the
    # spy's own source (held by the harness's frame that read it) shows that the search sees a case's program
    spy = ("import gc, sys\n"
           "seen = [r for o in gc.get_objects() for r in gc.get_referents(o) if isinstance(r, (str, bytes))]\n"
           "frame = sys._getframe()\n"
           "while frame is not None:\n"
           "    seen += [v for v in frame.f_locals.values() if isinstance(v, (str, bytes))]\n"
           "    frame = frame.f_back\n"
           "def has(mark):\n"
           "    return any(mark in (r if isinstance(r, str) else r.decode('latin-1')) for r in seen)\n"
           "print(has(''.join(['SECRET-', '7' * 16])), has(''.join(['# own', ' mark'])))  # own mark\n")
    results = run([f"print({secret!r}[:6])", spy, "print(input())"], ["", "", "after\n"], uid)
    assert [r.stdout for r in results] == [b"SECRET\n", b"False True\n", b"after\n"]


@pytest.mark.timeout(60)
def test_closing_early_leaves_nothing(uid):
    runner = CaseRunner(LIMITS, uid)
    assert runner.run("import os\nif os.fork() == 0:\n    import time\n    time.sleep(100)\nprint(1)", b"").stdout \
        == b"1\n"
    runner.close()
    assert sandbox_processes({uid}) == []
    runner.close()  # twice is fine
