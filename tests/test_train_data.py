"""The training entry's data helpers (grpo_launch.train.data) on real local files and the tiny tokenizer."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from grpo_launch.recipe import trl_schema
from grpo_launch.train.data import load_dataset_split, load_tokenizer, local_split_file, prepare_dataset, split_values

TRAIN_ROWS = [{"prompt": "What is 1 + 1?", "answer": "2"}, {"prompt": "What is 2 + 3?", "answer": "5"}]
TEST_ROWS = [{"prompt": "What is 7 - 4?", "answer": "3"}]


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """Keep the datasets cache of these tests out of ~/.cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")


@pytest.fixture(scope="module")
def tokenizer(tiny_assets):
    return load_tokenizer(str(tiny_assets / "model"))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["prompt,answer", *(f"{r['prompt']},{r['answer']}" for r in rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def rows(ds) -> list[dict]:
    return [dict(r) for r in ds]


# split_values


def test_split_values_partitions_keys():
    values = {
        "learning_rate": 1e-5,
        "num_generations": 4,
        "model_name_or_path": "m",
        "lora_r": 8,
        "dataset_name": "d.jsonl",
        "max_prompt_length": 64,
        "system_prompt": "be brief",
    }
    grpo, model, script = split_values(values)
    assert grpo == {"learning_rate": 1e-5, "num_generations": 4}
    assert model == {"model_name_or_path": "m", "lora_r": 8}
    assert script == {"dataset_name": "d.jsonl", "max_prompt_length": 64, "system_prompt": "be brief"}


def test_split_values_follows_the_schema():
    values = {k: None for k in [*trl_schema.GRPO_CONFIG, *trl_schema.MODEL_CONFIG, *trl_schema.SCRIPT_ARGUMENTS]}
    grpo, model, script = split_values(values)
    assert set(grpo) == set(trl_schema.GRPO_CONFIG)
    assert set(model) == set(trl_schema.MODEL_CONFIG)
    assert set(script) == set(trl_schema.SCRIPT_ARGUMENTS) - set(grpo) - set(model)
    assert "dataset_name" in script and "dataset_test_split" in script
    assert len(grpo) + len(model) + len(script) == len(values)


# the file that holds a split


@pytest.mark.parametrize(
    ("path", "split", "train_split", "expected"),
    [
        ("data/train.jsonl", "train", "train", "data/train.jsonl"),
        ("data/train.jsonl", "train[:90%]", "train", "data/train.jsonl"),
        ("data/train.jsonl", "train[90%:]", "train[:90%]", "data/train.jsonl"),
        ("data/train.jsonl", "test", "train", "data/test.jsonl"),
        ("data/train.jsonl", "test[:5]", "train", "data/test.jsonl"),
        ("data/gsm8k_train.jsonl", "test", "train", "data/gsm8k_test.jsonl"),
        ("data/gsm8k-train.csv", "validation", "train", "data/gsm8k-validation.csv"),
        ("data/gsm8k.train.parquet", "test", "train", "data/gsm8k.test.parquet"),
        ("data/gsm8k.jsonl", "test", "train", "data/gsm8k-test.jsonl"),
        ("data/retrain.jsonl", "test", "train", "data/retrain-test.jsonl"),
        ("data/training.json", "eval", "training", "data/eval.json"),
    ],
)
def test_local_split_file(path, split, train_split, expected):
    assert local_split_file(path, split, train_split) == Path(expected)


# load_dataset_split on local files


@pytest.mark.parametrize("writer, suffix", [(write_jsonl, ".jsonl"), (write_csv, ".csv")])
def test_local_file_honours_the_split(tmp_path, writer, suffix):
    train_file = writer(tmp_path / "data" / f"train{suffix}", TRAIN_ROWS)
    writer(tmp_path / "data" / f"test{suffix}", TEST_ROWS)
    train = load_dataset_split(str(train_file), None, "train")
    test = load_dataset_split(str(train_file), None, "test", train_split="train")
    got_train, got_test = rows(train), rows(test)
    if suffix == ".csv":  # csv infers integer answers
        got_train = [{**r, "answer": str(r["answer"])} for r in got_train]
        got_test = [{**r, "answer": str(r["answer"])} for r in got_test]
    assert got_train == TRAIN_ROWS
    assert got_test == TEST_ROWS
    assert got_train != got_test


def test_local_file_missing_test_split_raises(tmp_path):
    train_file = write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS)
    with pytest.raises(FileNotFoundError) as err:
        load_dataset_split(str(train_file), None, "test")
    message = str(err.value)
    assert repr(str(tmp_path / "test.jsonl")) in message
    assert "dataset_test_split" in message
    assert "no 'test' split" in message


def test_local_file_missing_train_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"dataset file '.*nothing\.jsonl' not found"):
        load_dataset_split(str(tmp_path / "nothing.jsonl"), None, "train")


def test_local_file_custom_split_names(tmp_path):
    train_file = write_jsonl(tmp_path / "gsm8k_training.jsonl", TRAIN_ROWS)
    write_jsonl(tmp_path / "gsm8k_validation.jsonl", TEST_ROWS)
    assert rows(load_dataset_split(str(train_file), None, "training", train_split="training")) == TRAIN_ROWS
    assert rows(load_dataset_split(str(train_file), None, "validation", train_split="training")) == TEST_ROWS


def test_local_file_slices_hold_out_part_of_one_file(tmp_path):
    many = [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)]
    train_file = write_jsonl(tmp_path / "train.jsonl", many)
    train = load_dataset_split(str(train_file), None, "train[:80%]", train_split="train[:80%]")
    held_out = load_dataset_split(str(train_file), None, "train[80%:]", train_split="train[:80%]")
    assert rows(train) == many[:8]
    assert rows(held_out) == many[8:]


def test_local_file_expands_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write_jsonl(tmp_path / "data" / "train.jsonl", TRAIN_ROWS)
    assert rows(load_dataset_split("~/data/train.jsonl", None, "train")) == TRAIN_ROWS


# load_dataset_split on save_to_disk directories


def test_saved_dataset_dict_is_indexed_by_split(tmp_path):
    from datasets import Dataset, DatasetDict

    path = tmp_path / "saved"
    DatasetDict({"train": Dataset.from_list(TRAIN_ROWS), "test": Dataset.from_list(TEST_ROWS)}).save_to_disk(path)
    assert rows(load_dataset_split(str(path), None, "train")) == TRAIN_ROWS
    assert rows(load_dataset_split(str(path), None, "test")) == TEST_ROWS


def test_saved_single_dataset_is_the_train_split_only(tmp_path):
    from datasets import Dataset

    path = tmp_path / "saved"
    Dataset.from_list(TRAIN_ROWS).save_to_disk(path)
    assert rows(load_dataset_split(str(path), None, "train")) == TRAIN_ROWS
    with pytest.raises(ValueError, match="single Dataset, used as the train split; it has no 'test' split"):
        load_dataset_split(str(path), None, "test")


# prepare_dataset


def make_ds(rows_: list[dict]):
    from datasets import Dataset

    return Dataset.from_list(rows_)


def test_prepare_dataset_conversational_prompt_with_system_and_answer(tokenizer):
    ds = make_ds([{"question": "What is 1 + 1?", "solution": 2, "extra": "kept"}])
    script = {"dataset_prompt_column": "question", "dataset_answer_column": "solution", "system_prompt": "Be brief."}
    out = prepare_dataset(ds, script, tokenizer, is_main=False)
    assert sorted(out.column_names) == ["answer", "extra", "prompt", "solution"]
    assert out[0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1 + 1?"},
    ]
    assert out[0]["answer"] == "2"
    assert out[0]["extra"] == "kept"


def test_prepare_dataset_defaults(tokenizer):
    out = prepare_dataset(make_ds(TRAIN_ROWS), {}, tokenizer, is_main=False)
    assert out[1]["prompt"] == [{"role": "user", "content": "What is 2 + 3?"}]
    assert out[1]["answer"] == "5"  # the original column, untouched (no answer column configured)
    assert len(out) == 2


def test_prepare_dataset_keeps_conversations_and_their_system_message(tokenizer):
    convo = [{"role": "system", "content": "Own system."}, {"role": "user", "content": "Hi"}]
    plain = [{"role": "user", "content": "Hello"}]
    out = prepare_dataset(make_ds([{"prompt": convo}, {"prompt": plain}]), {"system_prompt": "S"}, tokenizer, False)
    assert out[0]["prompt"] == convo
    assert out[1]["prompt"] == [{"role": "system", "content": "S"}, *plain]


def test_prepare_dataset_missing_columns(tokenizer):
    ds = make_ds(TRAIN_ROWS)
    with pytest.raises(ValueError, match=r"dataset has no column 'question' .*set dataset_prompt_column"):
        prepare_dataset(ds, {"dataset_prompt_column": "question"}, tokenizer, False)
    with pytest.raises(ValueError, match=r"dataset has no answer column 'solution'"):
        prepare_dataset(ds, {"dataset_answer_column": "solution"}, tokenizer, False)


def prompt_tokens(tokenizer, messages: list[dict]) -> int:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return len(ids["input_ids"] if isinstance(ids, Mapping) else ids)


def test_prepare_dataset_filters_long_prompts(tokenizer, capsys):
    short, long = "What is 1 + 1?", "What is 1 + 1? " * 20
    ds = make_ds([{"prompt": short, "answer": "2"}, {"prompt": long, "answer": "2"}, {"prompt": short, "answer": "3"}])
    limit = prompt_tokens(tokenizer, [{"role": "system", "content": "S"}, {"role": "user", "content": short}])
    assert prompt_tokens(tokenizer, [{"role": "user", "content": long}]) > limit
    script = {"system_prompt": "S", "dataset_answer_column": "answer", "max_prompt_length": limit}
    out = prepare_dataset(ds, script, tokenizer, is_main=True)
    assert [r["answer"] for r in out] == ["2", "3"]
    assert capsys.readouterr().out == f"[grpo-launch] max_prompt_length={limit}: dropped 1 of 3 prompts\n"
    # Not the main process: same filtering, no output.
    assert len(prepare_dataset(ds, script, tokenizer, is_main=False)) == 2
    assert capsys.readouterr().out == ""


def test_prepare_dataset_every_prompt_too_long(tokenizer):
    with pytest.raises(ValueError, match="every prompt is longer than max_prompt_length=1; raise it"):
        prepare_dataset(make_ds(TRAIN_ROWS), {"max_prompt_length": 1}, tokenizer, False)


# load_tokenizer


def test_load_tokenizer_tiny(tiny_assets):
    from transformers import PreTrainedTokenizerFast

    tok = load_tokenizer(str(tiny_assets / "model"))
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert tok.padding_side == "left"
    assert tok.pad_token == "<|pad|>"
    assert tok.eos_token == "<|im_end|>"


def test_prepare_dataset_filters_a_streaming_dataset_lazily(tokenizer):
    """dataset_streaming: an IterableDataset has no length; long prompts are skipped as it streams (counting them
    first used to raise TypeError at start-up)."""
    from datasets import IterableDataset

    rows = [{"prompt": "hi"}, {"prompt": "x " * 400}, {"prompt": "ok"}]
    ds = IterableDataset.from_generator(lambda: iter(rows))
    out = prepare_dataset(ds, {"max_prompt_length": 40}, tokenizer, is_main=False)
    assert [r["prompt"][-1]["content"] for r in out] == ["hi", "ok"]
