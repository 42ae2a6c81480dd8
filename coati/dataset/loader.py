"""Loading a dataset as users have it: ``.jsonl``, ``.json`` (a list of objects), ``.parquet``, or a directory
written by Hugging Face ``datasets``' ``save_to_disk``. Local files only: nothing is fetched from the hub.

JSON Lines are read line by line here (jsonl.py), so errors name ``file:line`` and rows may differ in shape
(``messages`` an object in one row, a list in the next). The other formats go through ``datasets`` (Arrow,
memory-mapped, cached under ``HF_DATASETS_CACHE``); their errors name ``file:row N``, N counted from 0 as
``dataset[N]`` does. Rows then map onto examples by the keys of ``RowFormat`` (see rows.py).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, TypeVar

from coati.dataset.jsonl import read_jsonl
from coati.dataset.rows import DatasetError, Example, RowFormat, check_rows, row_to_example

FORMATS = ".jsonl, .json (a list of objects), .parquet, or a directory written by datasets' save_to_disk"
_JSONL = (".jsonl", ".ndjson")
_BUILDERS = {".json": "json", ".parquet": "parquet"}  # extension -> datasets' packaged builder
T = TypeVar("T")


def dataset_problem(path: str) -> str | None:
    """Why ``path`` cannot be a dataset, without reading it (None: it may be one)."""
    if not os.path.exists(path):
        return (f"dataset file not found: {path} (pass a local {FORMATS}; datasets are never downloaded: save a hub "
                "dataset with datasets' save_to_disk or to_parquet first)")
    if os.path.isdir(path):
        return None
    extension = os.path.splitext(path)[1].lower()
    if extension not in _JSONL and extension not in _BUILDERS:
        return f"{path}: unsupported dataset format {extension or '(no extension)'!r}; pass {FORMATS}"
    return None


def load_examples(path: str, fmt: RowFormat = RowFormat()) -> list[Example]:
    """Every row of the dataset at ``path`` as an Example; any problem raises one DatasetError line."""
    return load_rows(path, lambda row, where: row_to_example(row, fmt, where))


def load_rows(path: str, convert: Callable[[Any, str], T]) -> list[T]:
    """``convert(row, where)`` of every row of the dataset at ``path`` (any of the formats above); ``convert``
    raises ValueError for a bad row, and all bad rows become one DatasetError naming the first ``where``."""
    problem = dataset_problem(path)
    if problem:
        raise DatasetError(problem)
    if os.path.splitext(path)[1].lower() in _JSONL and not os.path.isdir(path):
        return read_jsonl(path, convert)
    table = _read_with_datasets(path)
    items, problems = [], []
    for index, row in enumerate(table):
        where = f"{path}:row {index}"
        try:
            items.append(convert(row, where))
        except ValueError as err:
            problems.append((where, str(err)))
    check_rows(problems, len(table))
    if not items:
        raise DatasetError(f"{path}: no examples (the dataset has no rows)")
    return items


@contextlib.contextmanager
def _quiet_datasets():
    """No progress bars or info logs from ``datasets`` while we read (restored after: the user's code may
    want them). Hub access off for the same span: a local file needs none."""
    try:
        import datasets
        from datasets.utils import logging as ds_logging
    except ImportError as err:
        raise DatasetError(f"reading .json, .parquet and save_to_disk datasets needs Hugging Face datasets ({err}); "
                           "install it with bash scripts/setup.sh or pip install -r requirements/base.txt") from None

    bars_were_off = datasets.is_progress_bar_enabled() is False
    verbosity = ds_logging.get_verbosity()
    offline = datasets.config.HF_HUB_OFFLINE
    datasets.disable_progress_bars()
    ds_logging.set_verbosity(ds_logging.CRITICAL)  # its read errors reach the user as our one DatasetError line
    datasets.config.HF_HUB_OFFLINE = True
    try:
        yield datasets
    finally:
        datasets.config.HF_HUB_OFFLINE = offline
        ds_logging.set_verbosity(verbosity)
        if not bars_were_off:
            datasets.enable_progress_bars()


def _read_with_datasets(path: str):
    """A ``datasets.Dataset`` of the file or save_to_disk directory at ``path``."""
    with _quiet_datasets() as datasets:
        if os.path.isdir(path):
            markers = ("dataset_info.json", "state.json", "dataset_dict.json")
            if not any(os.path.isfile(os.path.join(path, name)) for name in markers):
                raise DatasetError(f"{path} is a directory but not one written by datasets' save_to_disk "
                                   f"(no state.json or dataset_dict.json); pass {FORMATS}")
            try:
                loaded = datasets.load_from_disk(path)
            except Exception as err:  # noqa: BLE001 - any reader failure becomes one line naming the path
                raise DatasetError(f"{path}: datasets could not load it ({_first_line(err)})") from None
            if isinstance(loaded, datasets.DatasetDict):
                splits = ", ".join(loaded)
                raise DatasetError(f"{path} holds several splits ({splits}): pass one split's directory, "
                                   f"e.g. {os.path.join(path, next(iter(loaded)))}")
            return loaded
        builder = _BUILDERS[os.path.splitext(path)[1].lower()]
        try:
            return datasets.load_dataset(builder, data_files=os.path.abspath(path), split="train")
        except Exception as err:  # noqa: BLE001
            if "corresponds to no data" in str(err):  # datasets' words for a file without rows
                raise DatasetError(f"{path}: no examples (the dataset has no rows)") from None
            expected = "a JSON list of objects (or JSON Lines)" if builder == "json" else "a parquet file"
            raise DatasetError(f"{path}: could not be read as {expected} ({_first_line(err)})") from None


def _first_line(err: Exception) -> str:
    cause = err
    while cause.__cause__ is not None or cause.__context__ is not None:  # datasets wraps the reader's error
        cause = cause.__cause__ or cause.__context__
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}"[:300]
