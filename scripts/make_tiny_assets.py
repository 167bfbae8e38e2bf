"""Build a tiny Qwen2-style model, a tiny Qwen3-MoE model, their tokenizer and an arithmetic dataset locally
(nothing is downloaded).

Used by the CPU demo (recipes/tiny-cpu.yaml) and the tests. The model is random (≈150k parameters) with head size 32,
which the CPU vLLM attention kernels accept. Takes about a second; skips work when the files exist.

Usage: python scripts/make_tiny_assets.py [OUT_DIR]   (default: .cache/tiny)
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


def make_dataset(path: Path, n: int = 256, seed: int = 0) -> None:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        op = rng.choice(["+", "-"])
        answer = a + b if op == "+" else a - b
        rows.append({"prompt": f"What is {a} {op} {b}?", "answer": str(answer)})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_model(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    rng = random.Random(1)
    corpus = [
        f"What is {rng.randint(0, 20)} {rng.choice('+-')} {rng.randint(0, 20)}? <think> add </think> "
        f"<answer> {rng.randint(-20, 40)} </answer> user assistant system"
        for _ in range(2000)
    ]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=340,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # its progress is three empty lines when stdout is not a terminal
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(out)
    _save_model(Qwen2Config, Qwen2ForCausalLM, fast, out)


def _save_model(config_cls, model_cls, fast, out: Path, **extra) -> None:
    """A random tiny model (2 layers, hidden 128, 4 heads, 2 KV heads) on ``fast``'s vocabulary, saved to ``out``."""
    import torch

    config = config_cls(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        **extra,
    )
    torch.manual_seed(0)
    model = model_cls(config)
    model.generation_config.eos_token_id = fast.eos_token_id
    model.generation_config.pad_token_id = fast.pad_token_id
    model.save_pretrained(out)


def make_moe_model(out: Path, tokenizer_dir: Path) -> None:
    """A tiny Qwen3-MoE (4 experts, top-2, every layer sparse) sharing the dense model's tokenizer."""
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    fast = AutoTokenizer.from_pretrained(tokenizer_dir)
    fast.save_pretrained(out)
    moe = {"moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2, "head_dim": 32}
    _save_model(Qwen3MoeConfig, Qwen3MoeForCausalLM, fast, out, **moe)


def main(argv: list[str]) -> int:
    import argparse
    import os

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="make_tiny_assets.py")
    parser.add_argument("out", nargs="?", default=".cache/tiny", help="where the assets go (default: .cache/tiny)")
    out = Path(parser.parse_args(argv[1:]).out)
    # Built on the CPU whatever the machine: DeepSpeed (imported by transformers) would warn that it found no GPU.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if not (out / "model" / "config.json").is_file() or not (out / "moe-model" / "config.json").is_file():
        from transformers.utils import logging

        logging.disable_progress_bar()  # save_pretrained's "Writing model shards" bar, twice, for a 1 MB model
    model_dir, data = out / "model", out / "data" / "train.jsonl"
    if not (model_dir / "config.json").is_file():
        make_model(model_dir)
    if not (out / "moe-model" / "config.json").is_file():
        make_moe_model(out / "moe-model", model_dir)
    if not data.is_file():
        make_dataset(data)
    print(f"tiny model: {model_dir}\ntiny MoE model: {out / 'moe-model'}\ntiny dataset: {data}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
