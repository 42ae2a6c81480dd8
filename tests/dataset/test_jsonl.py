import json

import pytest

from coati.dataset.jsonl import DatasetError, build_prompt, load_jsonl, plain_text_line, prompt_template_problem
from coati.models.tiny import build_char_tokenizer


def write(tmp_path, lines):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_loads_dict_and_list_messages(tmp_path):
    path = write(tmp_path, [
        json.dumps({"messages": {"role": "user", "content": "1+1="}, "gt_answer": "2"}),
        "",
        json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "2+2="}],
                    "gt_answer": 4}),
    ])
    examples = load_jsonl(path, "boxed")
    assert [e.gt_answer for e in examples] == ["2", "4"]
    assert examples[1].messages[0]["role"] == "system"
    assert examples[1].source.endswith("data.jsonl:3")


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({"gt_answer": "2"}), 'missing "messages"'),
    (json.dumps({"messages": {"role": "user", "content": "q"}}), 'missing "gt_answer"'),
    (json.dumps({"messages": {"role": "bot", "content": "q"}, "gt_answer": "1"}), "role must be one of"),
    (json.dumps({"messages": {"role": "user"}, "gt_answer": "1"}), 'string "content"'),
    (json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                 "gt_answer": "1"}), 'last message must have role "user"'),
])
def test_malformed_rows_name_file_and_line(tmp_path, line, message):
    good = json.dumps({"messages": {"role": "user", "content": "1+1="}, "gt_answer": "2"})
    path = write(tmp_path, [good, line])
    with pytest.raises(DatasetError) as err:
        load_jsonl(path, "boxed")
    assert f"{path}:2:" in str(err.value) and message in str(err.value)


def test_code_rows_need_valid_test_cases(tmp_path):
    row = {"messages": {"role": "user", "content": "echo"}, "test_cases": {"inputs": ["1"], "outputs": ["1"]}}
    assert load_jsonl(write(tmp_path, [json.dumps(row)]), "code")[0].test_cases == row["test_cases"]
    row["test_cases"] = {"inputs": ["1"], "outputs": [1]}
    with pytest.raises(DatasetError, match=":1: test_cases"):
        load_jsonl(write(tmp_path, [json.dumps(row)]), "code")


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DatasetError, match="not found"):
        load_jsonl(str(tmp_path / "nope.jsonl"), "boxed")
    with pytest.raises(DatasetError, match="empty"):
        load_jsonl(write(tmp_path, [""]), "boxed")


def test_build_prompt_without_and_with_chat_template():
    tokenizer = build_char_tokenizer()
    messages = ({"role": "user", "content": "12+3="},)
    assert build_prompt(tokenizer, messages, "") == "12+3="
    assert build_prompt(tokenizer, messages, "sys") == "sys\n12+3="
    tokenizer.chat_template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}[assistant]"
    assert build_prompt(tokenizer, messages, "sys") == "[system]sys[user]12+3=[assistant]"


def test_a_prompt_template_renders_rows_for_a_base_model_with_or_without_a_chat_template():
    tokenizer = build_char_tokenizer()
    template = "{system}\nQ: {prompt}\nA:"
    chat = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3 * 3?"})
    assert build_prompt(tokenizer, chat, "", template) == "Be brief.\nQ: What is 3 * 3?\nA:"  # the row's system
    plain = ({"role": "user", "content": "What is 3 * 3?"},)
    assert build_prompt(tokenizer, plain, "Numbers only.", template) == "Numbers only.\nQ: What is 3 * 3?\nA:"
    assert build_prompt(tokenizer, plain, "", "Q: {prompt}\nA:") == "Q: What is 3 * 3?\nA:"
    assert build_prompt(tokenizer, plain, "", "JSON {\"q\": \"{prompt}\"}") == 'JSON {"q": "What is 3 * 3?"}'
    tokenizer.chat_template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}[assistant]"
    assert build_prompt(tokenizer, plain, "", "Q: {prompt}\nA:") == "Q: What is 3 * 3?\nA:"  # the template wins


def test_what_a_template_less_tokenizer_makes_of_rows_is_said():
    assert prompt_template_problem("Q: {prompt}\nA:") is None
    assert prompt_template_problem("Q: {question}") == ("--prompt-template 'Q: {question}' has no {prompt}: write "
                                                         "where the row's text goes, e.g. 'Q: {prompt}\\nA:'")
    assert plain_text_line("m", "", False) is None  # the embedded demo: plain rows, no system prompt
    assert plain_text_line("m", "", True) == (
        "prompts: m has no chat template: each prompt is its chat-form row's messages as plain text, joined by "
        "newlines; a base model continues such text as it is: give --prompt-template 'Q: {prompt}\\nA:' (and --stop) "
        "to shape its prompts (docs/data.md, base models)")
    line = plain_text_line("m", "Answer with the number only, please.", False)
    assert "each prompt is the system prompt 'Answer with the number only, ple'... and its row's text" in line
    assert line.endswith("to shape its prompts, or -s to change the system prompt (docs/data.md, base models)")
