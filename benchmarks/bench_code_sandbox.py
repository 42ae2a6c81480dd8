"""Cost of the code-reward sandbox.

1. One test-case run of the same program: bare ``subprocess.run`` vs a fresh sandbox (prlimit + bwrap + uid
   switch + the harness + supervision), side by side, with the extra milliseconds and the ratio.
2. Ways to run one candidate's K cases: a fresh sandbox per case vs one sandbox whose program starts an
   interpreter per case vs one ``CaseRunner`` whose harness forks a process per case (what the scorer does,
   keeping the sandbox for all the responses a worker scores).
3. Throughput of CodeRewardScorer.score_batch on a group of generated tasks (candidates/s), 1 worker vs all.

Run: ``python benchmarks/bench_code_sandbox.py [--runs 40] [--group 16]`` (needs root and bubblewrap).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from coati.dataset.code_task import generate_rows, reference_solution  # noqa: E402
from rewards.code import CodeRewardScorer, SandboxLimits, check_sandbox_available  # noqa: E402
from rewards.code.sandbox import DEFAULT_PYTHON, OK, CaseRunner  # noqa: E402
from rewards.code.uids import UidPool  # noqa: E402

PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"
STDIN = b"1234 5678\n"

# One sandbox per candidate, an interpreter started per case inside it (run as the sandboxed program).
SUBPROCESS_HARNESS = """
import json, subprocess, sys
open('/tmp/main.py', 'w').write({program!r})
outs = [subprocess.run([sys.executable, '-I', '/tmp/main.py'], input=x.encode(), capture_output=True).stdout.decode()
        for x in json.load(sys.stdin)]
print(json.dumps(outs))
"""

def timed(fn, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return times


def describe(times: list[float]) -> str:
    return f"median {statistics.median(times):6.1f} ms  mean {statistics.mean(times):6.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40, help="runs per measurement in parts 1 and 2")
    parser.add_argument("--cases", type=int, default=10, help="cases per candidate in part 2")
    parser.add_argument("--group", type=int, default=16, help="candidates scored together in part 3")
    args = parser.parse_args()
    check_sandbox_available()
    limits = SandboxLimits()
    print(f"machine: {os.cpu_count()} cores, interpreter {DEFAULT_PYTHON}")

    with tempfile.TemporaryDirectory() as tmp, UidPool(1) as pool:
        uid = pool.acquire()
        path = os.path.join(tmp, "main.py")
        with open(path, "w") as handle:
            handle.write(PROGRAM)

        def bare():
            done = subprocess.run([DEFAULT_PYTHON, "-I", path], input=STDIN, capture_output=True, timeout=10)
            assert done.stdout == b"6912\n"

        def fresh(code: str, stdin: bytes):
            with CaseRunner(limits, uid) as runner:
                return runner.run(code, stdin)

        def sandboxed():
            result = fresh(PROGRAM, STDIN)
            assert result.status == OK and result.stdout == b"6912\n", result

        # 1. one run, interleaved so that load on the shared machine hits both alike
        bare_times, sandbox_times = [], []
        bare(), sandboxed()  # warm the page cache
        for _ in range(args.runs):
            bare_times += timed(bare, 1)
            sandbox_times += timed(sandboxed, 1)
        extra = statistics.median(sandbox_times) - statistics.median(bare_times)
        ratio = statistics.median(sandbox_times) / statistics.median(bare_times)
        print(f"\n1. one test-case run ({args.runs} runs each)")
        print(f"   bare subprocess.run : {describe(bare_times)}")
        print(f"   sandboxed           : {describe(sandbox_times)}")
        print(f"   extra per run       : {extra:+.1f} ms (median), ratio {ratio:.2f}x")

        # 2. one candidate's K cases, three ways
        inputs = [f"{i} {i * 7}\n" for i in range(args.cases)]
        expected = [f"{i * 8}\n" for i in range(args.cases)]
        runs = max(3, args.runs // args.cases)

        def per_case():
            for x, want in zip(inputs, expected):
                assert fresh(PROGRAM, x.encode()).stdout.decode() == want

        def one_runner():
            with CaseRunner(limits, uid) as runner:
                for x, want in zip(inputs, expected):
                    assert runner.run(PROGRAM, x.encode()).stdout.decode() == want

        def in_sandbox(wrapper: str):
            def go():
                result = fresh(wrapper.format(program=PROGRAM), json.dumps(inputs).encode())
                assert result.status == OK and json.loads(result.stdout) == expected, result

            return go

        print(f"\n2. one candidate with {args.cases} cases ({runs} candidates each), per case:")
        for name, fn in [
            ("a fresh sandbox per case", per_case),
            ("1 sandbox, an interpreter per case", in_sandbox(SUBPROCESS_HARNESS)),
            ("1 CaseRunner, a fork per case (used)", one_runner),
        ]:
            times = [t / args.cases for t in timed(fn, runs)]
            print(f"   {name:36s}: {describe(times)}")

    # 3. the scorer on a group of candidates
    rows = generate_rows(args.group, seed=0)
    responses = [f"```python\n{reference_solution(row['task'])}```" for row in rows]
    cases = [row["test_cases"] for row in rows]
    n_cases = sum(len(c["inputs"]) for c in cases)
    print(f"\n3. score_batch: {args.group} candidates, {n_cases} case runs in all")
    for workers in sorted({1, os.cpu_count() or 1}):
        with CodeRewardScorer(limits, max_workers=workers) as scorer:
            scorer.score_batch(responses[:workers], cases[:workers])  # warm
            start = time.perf_counter()
            results = scorer.score_batch(responses, cases)
            elapsed = time.perf_counter() - start
        assert all(r.correct for r in results)
        print(
            f"   max_workers={workers}: {elapsed:5.2f} s  {args.group / elapsed:6.1f} candidates/s  "
            f"{n_cases / elapsed:6.1f} case runs/s"
        )


if __name__ == "__main__":
    main()
