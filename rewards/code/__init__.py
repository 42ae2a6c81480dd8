"""Code rewards: run the response's program on stdin test cases inside an OS sandbox.

Data (PRIME format): each row has ``test_cases = {"inputs": [str, ...], "outputs": [str, ...]}``;
:func:`validate_test_cases` checks one. An optional ``"harness"`` (Python source) turns the row into a test of
code that is not a whole program, such as a function (HumanEval, :mod:`coati.dataset.humaneval`): the harness
is what runs on each case, with the response's code given to it as the string ``SOLUTION``
(:func:`program_for`).

Program: the LAST closed ```python block (```py and ```python3 count too, any case) of the response; bare
``` blocks are ignored because reasoning puts sample input/output in them. None -> reward 0, reason
"no code block".

Running: one fresh sandbox process per test case (bubblewrap namespaces + rlimits + its own uid, see
:mod:`rewards.code.sandbox`); never unsandboxed: without bubblewrap :class:`SandboxUnavailable` is raised.

Comparison: stdout (decoded as UTF-8) equals the expected output exactly after normalising both the same
way: ``\\r\\n`` -> ``\\n``, trailing whitespace removed from every line, trailing blank lines dropped.
Leading whitespace, blank lines in the middle and everything else must match.

Reward: ``combine(format_ok, score)`` from :mod:`rewards.types`, score = fraction of cases passed or, with
``all_or_nothing``, 1 if all passed else 0. ``correct`` = every case passed. Reasons: "ok", "no code block",
"wrong answer on case i", "timeout on case i", "runtime error on case i", "output limit exceeded on case i"
(with "(k/n passed)" appended when scoring by fraction).
"""

from rewards.code.extract import (extract_code, normalise_output, outputs_match, program_for, read_test_cases,
                                  validate_test_cases)
from rewards.code.prompts import CODE_SYSTEM_PROMPT
from rewards.code.sandbox import SandboxLimits, SandboxUnavailable, check_sandbox_available
from rewards.code.scorer import CodeRewardScorer

__all__ = [
    "CODE_SYSTEM_PROMPT",
    "CodeRewardScorer",
    "SandboxLimits",
    "SandboxUnavailable",
    "check_sandbox_available",
    "extract_code",
    "normalise_output",
    "outputs_match",
    "program_for",
    "read_test_cases",
    "validate_test_cases",
]
