"""Recipe values, tokenizer and datasets for the training entry.

Importing this module is cheap: transformers and datasets are imported by the functions that need them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_launch.recipe import LOCAL_DATA_SUFFIXES, trl_schema


def split_values(values: Mapping[str, Any]) -> tuple[dict, dict, dict]:
    """(GRPOConfig kwargs, ModelConfig kwargs, script settings)."""
    grpo = {k: v for k, v in values.items() if k in trl_schema.GRPO_CONFIG}
    model = {k: v for k, v in values.items() if k in trl_schema.MODEL_CONFIG}
    script = {k: v for k, v in values.items() if k not in grpo and k not in model}
    return grpo, model, script


def load_tokenizer(path: str, revision: str | None = None, *, trust_remote_code: bool = False):
    """The tokenizer, left-padded. A tokenizer saved as PreTrainedTokenizerFast is loaded as that class:
    AutoTokenizer would pick the model type's tokenizer (e.g. Qwen2Tokenizer) and a different pre-tokenizer."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cls: Any = AutoTokenizer
    cfg = Path(path) / "tokenizer_config.json"
    if cfg.is_file() and json.loads(cfg.read_text()).get("tokenizer_class") in (
        "PreTrainedTokenizerFast",
        "TokenizersBackend",
    ):
        cls = PreTrainedTokenizerFast
    tok = cls.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _split_parts(split: str) -> tuple[str, str]:
    """A split's name and its slice: ``("test", "[:10%]")`` for ``"test[:10%]"``."""
    name, bracket, rest = split.partition("[")
    return name, bracket + rest


def local_split_file(path: str | Path, split: str, train_split: str = "train") -> Path:
    """The file that holds ``split`` of a local dataset file ``path``, which holds ``train_split``.

    The train split (any slice of it) is ``path`` itself. Another split is a sibling file with the same suffix,
    named by replacing the train split's name at the end of the stem (the whole stem, or after ``-``, ``_`` or
    ``.``) with the split's name, or else by appending ``-SPLIT`` to the stem:

    * ``data/train.jsonl``       → ``data/test.jsonl``
    * ``data/gsm8k_train.jsonl`` → ``data/gsm8k_test.jsonl``
    * ``data/gsm8k.jsonl``       → ``data/gsm8k-test.jsonl``

    The file may not exist; :func:`load_dataset_split` reports that.
    """
    p = Path(path)
    name, train_name = _split_parts(split)[0], _split_parts(train_split)[0]
    if name == train_name:
        return p
    m = re.fullmatch(rf"(.*[-_.])?{re.escape(train_name)}", p.stem)
    stem = f"{m.group(1) or ''}{name}" if m else f"{p.stem}-{name}"
    return p.with_name(stem + p.suffix)


def load_dataset_split(name: str, config: str | None, split: str, streaming: bool = False, train_split: str = "train"):
    """One split of a dataset: a local file, a directory written by ``save_to_disk``, or a Hub dataset name.

    A local file (``.json``, ``.jsonl``, ``.parquet``, ``.csv``; ``~`` is expanded) holds the train split
    (``train_split``, the recipe's ``dataset_train_split``); any other split is read from the sibling file named by
    :func:`local_split_file` (``data/train.jsonl`` → ``data/test.jsonl``), and a missing sibling is an error, never
    the training data. A slice such as ``train[90%:]`` applies to the file it names. A directory holding one
    Dataset written by ``save_to_disk`` is likewise the train split only; a saved DatasetDict and Hub datasets are
    indexed by split. ``streaming`` applies to Hub datasets only.
    """
    from datasets import load_dataset, load_from_disk

    p = Path(name).expanduser()
    if p.suffix in LOCAL_DATA_SUFFIXES:
        target = local_split_file(p, split, train_split)
        if not target.is_file():
            if target == p:
                raise FileNotFoundError(f"dataset file {name!r} not found")
            raise FileNotFoundError(
                f"no {split!r} split for the local dataset {name!r}: looked for {str(target)!r}. Create that file, "
                f"or set dataset_test_split to a slice of this file (e.g. dataset_train_split: "
                f"{_split_parts(train_split)[0]}[:90%] and dataset_test_split: {_split_parts(train_split)[0]}[90%:]), "
                "or turn evaluation off (eval_strategy: no)"
            )
        # A single data file is the builder's "train" split, whatever the recipe calls it.
        return load_dataset(
            LOCAL_DATA_SUFFIXES[p.suffix], data_files=str(target), split="train" + _split_parts(split)[1]
        )
    if p.is_dir() and (p / "dataset_info.json").is_file():
        # One Dataset saved with save_to_disk: it is the train split. (A saved DatasetDict has dataset_dict.json
        # instead and is loaded, split by split, by load_dataset below.)
        if _split_parts(split)[0] != _split_parts(train_split)[0]:
            raise ValueError(
                f"the dataset saved in {name!r} is a single Dataset, used as the train split; it has no {split!r} "
                "split. Save a DatasetDict with that split and set dataset_test_split, or turn evaluation off "
                "(eval_strategy: no)"
            )
        return load_from_disk(str(p))
    return load_dataset(name, name=config, split=split, streaming=streaming)


def prompt_token_count(tokenizer, row: Mapping[str, Any], chat_template_kwargs: Mapping[str, Any] | None) -> int:
    """The prompt's length in tokens as TRL's GRPOTrainer renders it: the chat template with the generation prompt,
    the row's tools and the recipe's chat_template_kwargs (e.g. enable_thinking)."""
    ids = tokenizer.apply_chat_template(
        row["prompt"],
        add_generation_prompt=True,
        tokenize=True,
        **({"tools": row["tools"]} if row.get("tools") else {}),
        **dict(chat_template_kwargs or {}),
    )
    ids = ids["input_ids"] if isinstance(ids, Mapping) else ids
    return len(ids)


def prepare_dataset(
    ds, script: Mapping[str, Any], tokenizer, is_main: bool, chat_template_kwargs: Mapping[str, Any] | None = None
):
    """Make TRL's ``prompt`` column (conversational, with the system prompt) and the ``answer`` column; drop
    prompts longer than max_prompt_length (TRL 0.26 removed that option; truncating chat prompts would cut off
    their template, so they are filtered and counted)."""
    column = script.get("dataset_prompt_column") or "prompt"
    names = ds.column_names  # None for a stream whose features are unknown until read: nothing to check up front
    if names is not None and column not in names:
        raise ValueError(f"dataset has no column {column!r} (columns: {names}); set dataset_prompt_column")
    answer_col = script.get("dataset_answer_column")
    if names is not None and answer_col and answer_col not in names:
        raise ValueError(f"dataset has no answer column {answer_col!r} (columns: {ds.column_names})")
    system = script.get("system_prompt")

    def to_prompt(row: dict) -> dict:
        value = row[column]
        # A list is already conversational.
        messages = list(value) if isinstance(value, list) else [{"role": "user", "content": str(value)}]
        if system and not (messages and messages[0].get("role") == "system"):
            messages = [{"role": "system", "content": system}, *messages]
        out: dict[str, Any] = {"prompt": messages}
        if answer_col:
            out["answer"] = str(row[answer_col])
        return out

    ds = ds.map(to_prompt, remove_columns=[column] if column != "prompt" else [])
    limit = script.get("max_prompt_length")
    if limit:

        def short_enough(row: dict) -> bool:
            return prompt_token_count(tokenizer, row, chat_template_kwargs) <= limit

        if not hasattr(ds, "__len__"):  # a streaming dataset: filtered lazily, nothing to count up front
            if is_main:
                print(f"[grpo-launch] max_prompt_length={limit}: longer prompts are skipped as they stream", flush=True)
            return ds.filter(short_enough)
        before = len(ds)
        ds = ds.filter(short_enough)
        dropped = before - len(ds)
        if is_main:
            print(f"[grpo-launch] max_prompt_length={limit}: dropped {dropped} of {before} prompts", flush=True)
        if len(ds) == 0:
            raise ValueError(f"every prompt is longer than max_prompt_length={limit}; raise it")
    return ds
