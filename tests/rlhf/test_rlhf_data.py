"""SFT and preference rows: the formats that load, and one line naming file:line for every kind of bad row;
the generated quickstart data."""

import json

import pytest

from coati.dataset.loader import DatasetError
from coati.dataset.rlhf_rows import load_preferences, load_sft
from coati.rlhf.dummy import write_dummy_data


def write_lines(path, rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def test_sft_and_preference_rows_load_from_jsonl_and_a_json_list(tmp_path):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2="}]
    path = write_lines(tmp_path / "sft.jsonl", [{"prompt": "1+1=", "completion": "2"},
                                                {"prompt": chat, "completion": "4", "extra": 1}])
    rows = load_sft(path)
    assert [r.completion for r in rows] == ["2", "4"] and rows[1].messages[0]["role"] == "system"
    assert rows[0].messages == ({"role": "user", "content": "1+1="},) and rows[0].source == f"{path}:1"
    pytest.importorskip("datasets", reason="a .json list is read through Hugging Face datasets (scripts/setup.sh)")
    listing = tmp_path / "pairs.json"
    listing.write_text(json.dumps([{"prompt": "1+1=", "chosen": "2", "rejected": "3"},
                                   {"prompt": {"role": "user", "content": "hi"}, "chosen": "a", "rejected": "b"}]))
    pairs = load_preferences(str(listing))
    assert [(p.chosen, p.rejected) for p in pairs] == [("2", "3"), ("a", "b")]


@pytest.mark.parametrize("loader, row, message", [
    (load_sft, {"prompt": "1+1="}, 'missing "completion" (rows are {"prompt": ..., "completion": "..."}; this row '
                                   'has prompt)'),
    (load_sft, {"question": "1+1=", "completion": "2"}, 'missing "prompt"'),
    (load_sft, {"prompt": "1+1=", "completion": ""}, '"completion" must be a non-empty string'),
    (load_sft, {"prompt": "1+1=", "completion": 2}, '"completion" must be a non-empty string, got int'),
    (load_sft, {"prompt": [{"role": "assistant", "content": "x"}], "completion": "2"}, 'the last message must have '
                                                                                       'role "user"'),
    (load_sft, "[1, 2]", "each row must be a JSON object"),
    (load_sft, "{broken", "not valid JSON"),
    (load_preferences, {"prompt": "1+1=", "chosen": "2"}, 'missing "rejected"'),
    (load_preferences, {"prompt": "1+1=", "chosen": "2", "rejected": "2"}, '"chosen" and "rejected" are the same'),
    (load_preferences, {"prompt": "1+1=", "chosen": "2", "rejected": None}, 'missing "rejected"'),
])
def test_bad_rows_are_one_line_naming_file_and_line(tmp_path, loader, row, message):
    good = {"prompt": "1+1=", "completion": "2", "chosen": "2", "rejected": "3"}
    path = write_lines(tmp_path / "data.jsonl", [good, row, good, row])
    with pytest.raises(DatasetError) as info:
        loader(path)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{path}:2: "), text
    assert message in text, text
    assert text.endswith(f"(and 1 more bad rows of 4, the next at {path}:4)"), text


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DatasetError, match="dataset file not found"):
        load_sft(str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="no examples"):
        load_preferences(str(tmp_path / "empty.jsonl"))


def test_dummy_data_states_the_boxed_preference_and_holds_out_the_demo_eval_split(tmp_path):
    paths = write_dummy_data(str(tmp_path), num_sft=256, num_pairs=256, num_eval=32)
    sft, pairs = load_sft(paths["sft"]), load_preferences(paths["preferences"])
    assert len(sft) == 256 and len(pairs) == 256 and len(load_preferences(paths["preferences_eval"])) == 32
    boxed = 0
    for row in sft:  # demonstrations answer right, boxed or bare
        a, b = map(int, row.messages[0]["content"].rstrip("=").split("+"))
        assert row.completion in (f"\\boxed{{{a + b}}}", str(a + b))
        boxed += row.completion.startswith("\\boxed{")
    assert 0.35 < boxed / len(sft) < 0.65
    bare = 0
    for pair in pairs:  # chosen: the boxed right answer; rejected: the bare right one, or a boxed wrong sum
        a, b = map(int, pair.messages[0]["content"].rstrip("=").split("+"))
        assert pair.chosen == f"\\boxed{{{a + b}}}"
        if pair.rejected == str(a + b):
            bare += 1
        else:
            assert pair.rejected.startswith("\\boxed{") and int(pair.rejected[7:-1]) != a + b
    assert 0.35 < bare / len(pairs) < 0.65
    held_out = {p.messages[0]["content"] for p in load_preferences(paths["preferences_eval"])}
    training = {r.messages[0]["content"] for r in sft} | {p.messages[0]["content"] for p in pairs}
    assert not held_out & training
    # the eval prompts are math rows for the RL stage, with their answers
    first = json.loads(open(paths["prompts_eval"]).readline())
    assert set(first) == {"messages", "gt_answer"}


def test_prompt_rows_load_with_or_without_answers(tmp_path):
    from coati.dataset.rlhf_rows import has_answer, load_prompts
    from coati.dataset.rows import RowFormat

    path = write_lines(tmp_path / "prompts.jsonl", [
        {"prompt": "1+1="},
        {"messages": {"role": "user", "content": "2+2="}, "gt_answer": "4"},
        {"prompt": [{"role": "user", "content": "3+3="}], "gt_answer": "The sum is \\boxed{6}."},
    ])
    rows = load_prompts(path)
    assert [r.messages[-1]["content"] for r in rows] == ["1+1=", "2+2=", "3+3="]
    assert [r.gt_answer for r in rows] == [None, "4", "6"] and [has_answer(r) for r in rows] == [False, True, True]
    assert rows[0].source == f"{path}:1"
    gsm = write_lines(tmp_path / "gsm.jsonl", [{"question": "4+4=", "answer": "... #### 8"}])
    [row] = load_prompts(gsm, RowFormat(label_key="answer"), input_key="question")
    assert row.gt_answer == "8"
    [row] = load_prompts(gsm, input_key="question")  # the answer is under another name: an unlabelled prompt
    assert row.gt_answer is None


@pytest.mark.parametrize("row, kwargs, message", [
    ({"question": "1+1="}, {}, 'missing "messages" or "prompt" (the prompt; this row has question: name the right '
                               'one with --input-key)'),
    ({"prompt": "1+1="}, {"input_key": "question"}, 'missing "question"'),
    ({"prompt": "1+1="}, {"label_key": "answer"}, 'missing "answer"'),
    ({"prompt": "1+1=", "gt_answer": ""}, {}, 'missing "gt_answer"'),
    ({"prompt": ""}, {}, '"prompt" is an empty string'),
    ("{broken", {}, "not valid JSON"),
])
def test_bad_prompt_rows_are_one_line_naming_file_and_line(tmp_path, row, kwargs, message):
    from coati.dataset.rlhf_rows import load_prompts
    from coati.dataset.rows import RowFormat

    good = {"prompt": "1+1=", "question": "1+1=", "answer": "2"}
    path = write_lines(tmp_path / "data.jsonl", [good, row])
    with pytest.raises(DatasetError) as info:
        load_prompts(path, RowFormat(label_key=kwargs.get("label_key")), kwargs.get("input_key"))
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{path}:2: ") and message in text, text
