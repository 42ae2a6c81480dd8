"""Code extraction, test-case validation and output comparison (no sandbox needed)."""

import pytest

from rewards.code import CODE_SYSTEM_PROMPT, extract_code, normalise_output, outputs_match, program_for, validate_test_cases


def test_last_python_block_wins():
    response = "Try:\n```python\nprint(1)\n```\nBetter:\n```python\nprint(2)\n```\nDone."
    assert extract_code(response) == "print(2)\n"


@pytest.mark.parametrize("tag", ["python", "py", "python3", "Python", "PYTHON3"])
def test_python_tags_accepted(tag):
    assert extract_code(f"```{tag}\nx = 1\n```") == "x = 1\n"


def test_bare_fence_and_sample_blocks_are_not_code():
    response = "Sample input:\n```\n3 4\n```\nAnswer:\n```python\nprint(7)\n```\nOutput:\n```\n7\n```"
    assert extract_code(response) == "print(7)\n"
    assert extract_code("```\nprint(7)\n```") is None


@pytest.mark.parametrize(
    "response",
    ["no code here", "```python\nprint(1)\n", "```python\n   \n```", "```javascript\nconsole.log(1)\n```", ""],
)
def test_no_code(response):
    assert extract_code(response) is None


def test_closing_fence_must_start_a_line():
    response = "```python\ns = '```'\nprint(s)\n```"
    assert extract_code(response) == "s = '```'\nprint(s)\n"


def test_validate_test_cases():
    assert validate_test_cases({"inputs": ["1\n", "2\n"], "outputs": ["1\n", "2\n"]}) is None
    assert validate_test_cases([]) == "test_cases must be an object with 'inputs' and 'outputs'"
    assert validate_test_cases({"outputs": ["1"]}) == "test_cases.inputs is missing"
    assert validate_test_cases({"inputs": ["1"], "outputs": [1]}) == "test_cases.outputs must be a list of strings"
    assert validate_test_cases({"inputs": "1", "outputs": ["1"]}) == "test_cases.inputs must be a list of strings"
    assert "differ in length" in validate_test_cases({"inputs": ["1", "2"], "outputs": ["1"]})
    assert validate_test_cases({"inputs": [], "outputs": []}) == "test_cases must hold at least one case"
    assert validate_test_cases({"inputs": ["1"], "outputs": ["1"], "harness": "print(1)"}) is None
    for harness in ("", "  \n", 3):
        assert validate_test_cases({"inputs": ["1"], "outputs": ["1"], "harness": harness}) == (
            "test_cases.harness must be a non-empty string of Python source when given")


def test_program_for_hands_the_code_to_the_harness():
    code = "def f():\n    return '\"\\'\n"
    assert program_for(code, {"inputs": ["1"], "outputs": ["1"]}) == code
    program = program_for(code, {"inputs": ["1"], "outputs": ["1"], "harness": "exec(SOLUTION)\nprint(f())\n"})
    namespace = {}
    exec(compile(program.split("\n", 1)[0], "p", "exec"), namespace)
    assert namespace["SOLUTION"] == code
    assert program.endswith("\nexec(SOLUTION)\nprint(f())\n")


def test_output_normalisation():
    assert normalise_output("1 2 \r\n3\t\n\n\n") == "1 2\n3"
    assert outputs_match("7\n", "7")
    assert outputs_match("a  \nb\n\n", "a\nb")
    assert not outputs_match(" 7", "7")  # leading whitespace counts
    assert not outputs_match("a\n\nb", "a\nb")  # blank lines in the middle count
    assert not outputs_match("7", "7.0")


def test_system_prompt_asks_for_the_extracted_format():
    assert "```python" in CODE_SYSTEM_PROMPT and "standard input" in CODE_SYSTEM_PROMPT
