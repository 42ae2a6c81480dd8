"""-d/-ed formats: .jsonl, .json, .parquet, save_to_disk directories (through Hugging Face datasets, local files
only); every bad dataset or row is one line naming the file and the line or row."""

import json
import sys

import pytest

import rl_example
from coati.dataset.loader import load_examples
from coati.dataset.rows import DatasetError, RowFormat

GSM8K = RowFormat(input_key="question", label_key="answer")
ROWS = [{"question": "Tom has 1,200 apples and buys 30. How many?", "answer": "1200+30=1230\n#### 1,230"},
        {"question": "What is 6*7?", "answer": "6*7=<<6*7=42>>42\n#### 42"},
        {"question": "Half of 9?", "answer": "9/2=4.5\n#### 4.5"}]
WANT = [("Tom has 1,200 apples and buys 30. How many?", "1230"), ("What is 6*7?", "42"), ("Half of 9?", "4.5")]


def pairs(examples):
    return [(e.messages[-1]["content"], e.gt_answer) for e in examples]


def write(tmp_path, name, rows):
    """``rows`` in the format named by the extension of ``name`` (a directory: datasets' save_to_disk)."""
    import datasets

    path = tmp_path / name
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif name.endswith(".json"):
        path.write_text(json.dumps(rows))
    elif name.endswith(".parquet"):
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    else:
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return str(path)


@pytest.mark.parametrize("name", ["gsm8k.jsonl", "gsm8k.json", "gsm8k.parquet", "gsm8k_dir"])
def test_every_format_gives_the_same_examples(tmp_path, name):
    examples = load_examples(write(tmp_path, name, ROWS), GSM8K)
    assert pairs(examples) == WANT
    where = f"{tmp_path / name}:1" if name.endswith(".jsonl") else f"{tmp_path / name}:row 0"
    assert examples[0].source == where


def test_seed_rows_of_mixed_shape_load_from_json_too(tmp_path):
    rows = [{"messages": {"role": "user", "content": "1+1="}, "gt_answer": "2"},
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "2+2="}], "gt_answer": 4}]
    examples = load_examples(write(tmp_path, "seed.json", rows))
    assert [e.messages for e in examples] == [({"role": "user", "content": "1+1="},),
                                              ({"role": "system", "content": "s"}, {"role": "user", "content": "2+2="})]
    assert [e.gt_answer for e in examples] == ["2", "4"]


@pytest.mark.parametrize("name", ["bad.jsonl", "bad.json", "bad.parquet", "bad_dir"])
def test_bad_rows_name_the_first_and_count_the_rest(tmp_path, name):
    rows = [ROWS[0], {"question": "q", "answer": "no final answer"}, {"question": "q", "answer": "####"},
            ROWS[1], {"question": "q", "answer": " ####  "}]
    path = write(tmp_path, name, rows)
    with pytest.raises(DatasetError) as err:
        load_examples(path, GSM8K)
    first, second = (f"{path}:3", f"{path}:5") if name.endswith(".jsonl") else (f"{path}:row 2", f"{path}:row 4")
    assert str(err.value) == f'{first}: "answer" holds no answer (empty, or nothing after \'####\' or inside ' \
                             f"\\boxed{{}}) (and 1 more bad rows of 5, the next at {second})"
    assert "\n" not in str(err.value)


def test_wrong_key_names_the_fields_the_rows_have(tmp_path):
    with pytest.raises(DatasetError, match=r":row 0: missing \"problem\" \(the prompt; this row has question, answer: "
                                           r"name the right one with --input-key\) \(and 2 more bad rows of 3"):
        load_examples(write(tmp_path, "g.parquet", ROWS), RowFormat(input_key="problem", label_key="answer"))


def test_unreadable_datasets_give_one_line(tmp_path):
    import datasets

    cases = {"broken.json": '[{"question": "q", "answer": ', "broken.parquet": "not parquet", "data.csv": "a,b\n1,2\n"}
    expected = {"broken.json": "could not be read as a JSON list of objects (or JSON Lines)",
                "broken.parquet": "could not be read as a parquet file", "data.csv": "unsupported dataset format '.csv'"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(DatasetError) as err:
            load_examples(str(tmp_path / name), GSM8K)
        assert str(err.value).startswith(f"{tmp_path / name}") and expected[name] in str(err.value), str(err.value)
        assert "\n" not in str(err.value)
    splits = tmp_path / "splits"
    datasets.DatasetDict(train=datasets.Dataset.from_list(ROWS), test=datasets.Dataset.from_list(ROWS)).save_to_disk(
        str(splits))
    with pytest.raises(DatasetError, match=f"holds several splits \\(train, test\\): pass one split's directory, "
                                           f"e.g. {splits}/train"):
        load_examples(str(splits), GSM8K)
    assert pairs(load_examples(str(splits / "train"), GSM8K)) == WANT
    with pytest.raises(DatasetError, match="is a directory but not one written by datasets' save_to_disk"):
        load_examples(str(tmp_path), GSM8K)
    with pytest.raises(DatasetError, match="dataset file not found: .*never downloaded"):
        load_examples("openai/gsm8k", GSM8K)
    with pytest.raises(DatasetError, match="no examples"):
        load_examples(write(tmp_path, "empty.json", []), GSM8K)


def test_the_cli_checks_keys_and_rows_at_start_up(tiny_model_dir, tmp_path, capsys):
    """Before any actor starts: a key that no row has, two flags naming one field, an empty key."""
    data = write(tmp_path, "gsm8k.parquet", ROWS * 22)
    capsys.readouterr()  # datasets' own progress bar while the test wrote the file
    base = ["-m", tiny_model_dir, "-d", data, "-ibs", "64", "-imbs", "64"]
    for flags, message in (
        (["--input-key", "question"], f'error: {data}:row 0: missing "gt_answer"'),
        (["--input-key", "question", "--label-key", "question"], "--input-key and --label-key both name 'question'"),
        (["--input-key", "", "--label-key", "answer"], "--input-key must be a field name"),
        (["--input-key", "question", "--label-key", "answer", "-ed", json.dumps({"t": str(tmp_path / "x.csv")})],
         "-ed/--eval-dataset file for task 't' not found"),
    ):
        assert rl_example.main(base + flags) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err


def test_without_datasets_installed_jsonl_still_loads_and_the_rest_says_how_to_install(tmp_path, monkeypatch):
    jsonl, parquet = write(tmp_path, "g.jsonl", ROWS), write(tmp_path, "g.parquet", ROWS)
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets raises ImportError (fault injected)
    assert pairs(load_examples(jsonl, GSM8K)) == WANT
    with pytest.raises(DatasetError, match="needs Hugging Face datasets .*bash scripts/setup.sh"):
        load_examples(parquet, GSM8K)
