"""Scoring responses to code tasks by running their program on every test case in the sandbox."""

from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping, Sequence

from rewards.code.calls import call_stdin, is_call_based, returned_matches
from rewards.code.extract import extract_code, outputs_match, program_for, validate_test_cases
from rewards.code.sandbox import (DEFAULT_PYTHON, OK, OUTPUT_LIMIT, RUNTIME_ERROR, SANDBOX_ERROR, TIMEOUT, CaseRunner,
                                  RunResult, SandboxLimits, check_sandbox_available)
from rewards.code.uids import DEFAULT_UID_BASE, UidPool
from rewards.types import RewardResult, combine, regroup

logger = logging.getLogger(__name__)

_FAILURE = {
    RUNTIME_ERROR: "runtime error",
    TIMEOUT: "timeout",
    OUTPUT_LIMIT: "output limit exceeded",
    SANDBOX_ERROR: "sandbox error",
}


def _check(test_cases: Mapping) -> None:
    problem = validate_test_cases(test_cases)
    if problem is not None:
        raise ValueError(problem)


class CodeRewardScorer:
    """Scores responses whose last ```python block is a stdin -> stdout program.

    Each test case is one fresh process in a sandbox (:class:`rewards.code.sandbox.CaseRunner`): the cases of
    one response run one after another; a batch's responses are shared out to ``max_workers`` threads, each with
    its own sandbox uid and one sandbox for all it scores. Reward: ``combine(format_ok=code block found,
    score)`` where ``score`` is the fraction of cases passed, or 1/0 for all passed/not when ``all_or_nothing``
    (which also stops at the first failing case). ``correct`` means every case passed.

    Thread-safe; call :meth:`close` (or use it as a context manager) to release its threads and uids.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        all_or_nothing: bool = False,
        max_workers: int | None = None,
        python: str = DEFAULT_PYTHON,
        uid_base: int = DEFAULT_UID_BASE,
    ):
        check_sandbox_available(python)
        self.limits = limits or SandboxLimits()
        self.all_or_nothing = all_or_nothing
        self.max_workers = max_workers or os.cpu_count() or 1
        self.python = python
        self._uids = UidPool(self.max_workers, uid_base)
        self._executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="code-reward")

    # -- public API --------------------------------------------------------------------------------------

    def score(self, response: str, test_cases: Mapping) -> RewardResult:
        """Reward of one response on its PRIME ``{"inputs": [...], "outputs": [...]}`` test cases."""
        _check(test_cases)
        uid = self._uids.acquire()
        try:
            with CaseRunner(self.limits, uid, self.python) as runner:
                return self._score(runner, response, test_cases)
        finally:
            self._uids.release(uid)

    def score_batch(self, responses: Sequence[str], test_cases_list: Sequence[Mapping]) -> list[RewardResult]:
        """Rewards of many responses (for example a group of G samples), scored in parallel, in order.

        Responses whose program and test cases are the same are run once and share the result: a sharpened
        policy writes the same program for most of a group, and a program's verdict on fixed inputs is
        taken to be a property of the program (one that draws random numbers gets one draw per batch).
        """
        if len(responses) != len(test_cases_list):
            raise ValueError(f"{len(responses)} responses but {len(test_cases_list)} test-case sets")
        for test_cases in test_cases_list:
            _check(test_cases)
        first: dict[tuple, int] = {}  # (program, test cases) -> index of its first response
        keys = []
        for i, (response, test_cases) in enumerate(zip(responses, test_cases_list)):
            key = (extract_code(response), json.dumps(test_cases, sort_keys=True))
            keys.append(key)
            first.setdefault(key, i)
        todo = iter(sorted(first.values()))
        lock, results = threading.Lock(), {}

        def worker() -> None:  # scores responses until none is left, all in one sandbox
            uid = self._uids.acquire()
            try:
                with CaseRunner(self.limits, uid, self.python) as runner:
                    while True:
                        with lock:
                            i = next(todo, None)
                        if i is None:
                            return
                        results[i] = self._score(runner, responses[i], test_cases_list[i])
            finally:
                self._uids.release(uid)

        workers = [self._executor.submit(worker) for _ in range(min(self.max_workers, len(first)))]
        for future in workers:
            future.result()
        return [results[first[key]] for key in keys]

    def score_groups(self, groups: list[list[str]], test_cases: list[Mapping]) -> list[list[RewardResult]]:
        """The code kind's scoring of groups (rewards/builtin.py): every group's responses in one batch, so the
        sandbox workers stay busy across groups instead of waiting at the end of each."""
        flat = self.score_batch([r for responses in groups for r in responses],
                                [cases for responses, cases in zip(groups, test_cases) for _ in responses])
        return regroup(flat, groups)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self._uids.close()

    def __enter__(self) -> CodeRewardScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------------------

    def _score(self, runner: CaseRunner, response: str, test_cases: Mapping) -> RewardResult:
        code = extract_code(response)
        if code is None:
            return RewardResult(reward=0.0, correct=False, format_ok=False, extracted=None, reason="no code block")
        return self._run_cases(runner, code, program_for(code, test_cases), test_cases)

    def _run_case(self, runner: CaseRunner, program: str, stdin: str) -> RunResult:
        result = runner.run(program, stdin.encode("utf-8"))
        if result.status == SANDBOX_ERROR:  # transient (for example a fork refused): one more try, a new sandbox
            logger.warning("sandbox failed, retrying: %s", result.stderr[-300:])
            result = runner.run(program, stdin.encode("utf-8"))
        return result

    def _run_cases(self, runner: CaseRunner, code: str, program: str, test_cases: Mapping) -> RewardResult:
        # stdin -> stdout rows compare printed text; call-based rows the returned JSON value
        calls = is_call_based(test_cases)
        inputs = [call_stdin(args) for args in test_cases["inputs"]] if calls else test_cases["inputs"]
        matches = returned_matches if calls else outputs_match
        passed, first_failure, cause = 0, None, None
        for i, (stdin, expected) in enumerate(zip(inputs, test_cases["outputs"])):
            result = self._run_case(runner, program, stdin)
            if result.status == OK and matches(result.stdout.decode("utf-8", "replace"), expected):
                passed += 1
                continue
            if first_failure is None:
                what = "wrong answer" if result.status == OK else _FAILURE[result.status]
                first_failure, cause = f"{what} on case {i}", what
                if result.status == SANDBOX_ERROR:
                    logger.error("sandbox error on case %d: %s", i, result.stderr[-300:])
            if self.all_or_nothing:
                break
        n = len(inputs)
        correct = passed == n
        score = float(correct) if self.all_or_nothing else passed / n
        if correct:
            reason = "ok"
        elif self.all_or_nothing:
            reason = first_failure
        else:
            reason = f"{first_failure} ({passed}/{n} passed)"
        return RewardResult(reward=combine(True, score), correct=correct, format_ok=True, extracted=code, reason=reason,
                            cause=None if correct else cause)
