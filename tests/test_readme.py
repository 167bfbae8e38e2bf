"""The README's examples are what the program prints: every fenced block line ``$ grpo-launch ARGS`` (run here, with
no GPU, so each example names its --gpus) is run in-process, and its output must equal the lines that follow it up
to the next ``$`` line or the block's end. Paths in the examples are relative to the repository."""

from __future__ import annotations

import shlex

import pytest

from grpo_launch.cli import main

from .helpers import ROOT


def _blocks() -> list[list[str]]:
    """The README's fenced blocks, each as its lines without the fence's indentation."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    indent = 0
    for line in (ROOT / "README.md").read_text().splitlines():
        fence = line.lstrip().startswith("```")
        if fence and current is None:
            current, indent = [], len(line) - len(line.lstrip())
        elif fence and current is not None:
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line[indent:])
    return blocks


def _examples() -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for lines in _blocks():
        for i, line in enumerate(lines):
            if line.startswith("$ grpo-launch "):
                rest = lines[i + 1 :]
                end = next((j for j, x in enumerate(rest) if x.startswith("$ ")), len(rest))
                out.append((line[2:], rest[:end]))
    return out


EXAMPLES = _examples()


def test_the_readme_has_examples():
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize(("command", "expected"), EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_readme_example_prints_what_the_readme_says(command, expected, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command)[1:]
    assert "--gpus" in argv, "an example must not depend on this machine's GPUs"
    main(argv, environ={})
    captured = capsys.readouterr()
    assert (captured.out + captured.err).rstrip("\n").splitlines() == expected
