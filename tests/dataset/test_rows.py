"""Rows of any shape -> prompt and answer: --input-key/--label-key, GSM8K and MATH labels, one message per problem."""

import json

import pytest

from coati.dataset.rows import RowFormat, final_answer, row_to_example

GSM8K_SOLUTION = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                  "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")
MATH_SOLUTION = ("The sides are $3$ and $4$, so the hypotenuse is $\\sqrt{3^2+4^2}=5$ and the ratio is "
                 "$\\boxed{\\frac{3}{5}}$.")


@pytest.mark.parametrize("label, answer, why", [
    (GSM8K_SOLUTION, "72", "GSM8K: the text after ####"),
    ("so 1,000 + 72 = 1,072\n#### 1,072", "1072", "GSM8K: thousands separators go, as its answers are numbers"),
    ("#### 1,000,000", "1000000", "every separator of a long number"),
    ("#### -3", "-3", "negative numbers keep their sign"),
    ("#### 0.25", "0.25", "decimals unchanged"),
    ("first #### 1\nsecond #### 2", "2", "the last #### counts"),
    ("#### 3,5", "3,5", "a comma not followed by three digits is no separator"),
    (MATH_SOLUTION, "\\frac{3}{5}", "MATH: the content of the box, nested braces kept"),
    ("guess \\boxed{1}, no: \\boxed{2}", "2", "the last box counts"),
    ("\\boxed{\\sqrt{2}} cm", "\\sqrt{2}", "text after the box is dropped"),
    ("72", "72", "a plain answer is itself"),
    ("  x = 3 \n", "x = 3", "stripped"),
    ("(1, 2)", "(1, 2)", "commas outside a GSM8K answer are kept"),
    (72, "72", "numbers become strings"),
    (2.5, "2.5", "floats too"),
])
def test_final_answer(label, answer, why):
    assert final_answer(label) == answer, why


@pytest.mark.parametrize("label, message", [
    ("steps\n####  ", "holds no answer"),
    ("\\boxed{ }", "holds no answer"),
    (True, "must be a string or a number, got bool"),
    (["72"], "must be a string or a number, got list"),
])
def test_final_answer_rejects(label, message):
    with pytest.raises(ValueError, match=message):
        final_answer(label)


def test_gsm8k_and_math_rows_through_the_keys():
    gsm8k = row_to_example({"question": "How many clips?", "answer": GSM8K_SOLUTION},
                           RowFormat(input_key="question", label_key="answer"), "g.jsonl:1")
    assert gsm8k.messages == ({"role": "user", "content": "How many clips?"},) and gsm8k.gt_answer == "72"
    math = row_to_example({"problem": "Find the ratio.", "solution": MATH_SOLUTION, "level": "Level 2"},
                          RowFormat(input_key="problem", label_key="solution"), "m.parquet:row 0")
    assert math.gt_answer == "\\frac{3}{5}" and math.source == "m.parquet:row 0"


def test_prompt_may_be_a_string_an_object_or_a_chat_list():
    fmt = RowFormat(input_key="prompt")
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1="}]
    for value, messages in (("1+1=", ({"role": "user", "content": "1+1="},)),
                            ({"role": "user", "content": "1+1="}, ({"role": "user", "content": "1+1="},)),
                            (chat, tuple(chat))):
        assert row_to_example({"prompt": value, "gt_answer": "2"}, fmt, "x").messages == messages
    # Arrow rows carry None for fields another row had; role/content are all that is read.
    arrow_message = {"role": "user", "content": "1+1=", "name": None}
    assert row_to_example({"prompt": [arrow_message], "gt_answer": "2"}, fmt, "x").messages[0] == \
        {"role": "user", "content": "1+1="}


@pytest.mark.parametrize("row, fmt, message", [
    ({"question": "q", "answer": "#### 1"}, RowFormat(),
     'missing "messages" (the prompt; this row has question, answer: name the right one with --input-key)'),
    ({"question": "q", "answer": "#### 1"}, RowFormat(input_key="question"),
     'missing "gt_answer" (the answer, a non-empty string such as "42", needed by math rewards; this row has '
     'question, answer: name the right one with --label-key)'),
    ({"question": "q", "answer": None, "other": 1}, RowFormat(input_key="question", label_key="answer"),
     'missing "answer"'),
    ({"question": "", "answer": "1"}, RowFormat(input_key="question", label_key="answer"),
     '"question" is an empty string'),
    ({"question": 5, "answer": "1"}, RowFormat(input_key="question", label_key="answer"),
     '"question" must be a string, a role/content object or a non-empty list of them'),
    ({"question": "q", "answer": "work, no final answer ####"}, RowFormat(input_key="question", label_key="answer"),
     '"answer" holds no answer'),
    ({"question": "q", "answer": {"value": 1}}, RowFormat(input_key="question", label_key="answer"),
     '"answer" must be a string or a number, got dict'),
    ([1, 2], RowFormat(), "each row must be a JSON object"),
])
def test_bad_rows_say_what_and_which_flag(row, fmt, message):
    with pytest.raises(ValueError) as err:
        row_to_example(row, fmt, "x")
    assert message in str(err.value)


def test_code_rows_take_test_cases_as_object_or_json_string():
    cases = {"inputs": ["1\n"], "outputs": ["1\n"]}
    fmt = RowFormat(reward_type="code", input_key="problem", label_key="tests")
    assert fmt.label_field == "tests" and RowFormat(reward_type="code").label_field == "test_cases"
    for value in (cases, json.dumps(cases)):
        assert row_to_example({"problem": "echo", "tests": value}, fmt, "x").test_cases == cases
    with pytest.raises(ValueError, match="test_cases is a string but not a JSON object"):
        row_to_example({"problem": "echo", "tests": "{inputs"}, fmt, "x")
    with pytest.raises(ValueError, match='missing "tests" \\(PRIME test cases'):
        row_to_example({"problem": "echo"}, fmt, "x")
