"""Built-in rewards, reward names and import paths (grpo_launch.train.rewards)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grpo_launch.recipe.rewards import ALIASES, BUILTIN_REWARDS, check_reward_names, is_import_path
from grpo_launch.train.rewards import (
    REGISTRY,
    accuracy_reward,
    format_reward,
    load_reward,
    make_length_reward,
    tag_count_reward,
)

GOOD = "<think>2 plus 2</think> <answer>4</answer>"


def chat(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def test_import_is_cheap():
    heavy = "{'torch', 'transformers', 'trl', 'datasets', 'math_verify'}"
    code = f"import sys, grpo_launch.train.rewards; print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_format_reward():
    completions = [
        GOOD,
        "  <think>\nmulti\nline</think>\n<answer>x</answer>\n",
        "<answer>4</answer>",
        "<think>a</think> <answer>4</answer> trailing",
        "",
    ]
    assert format_reward([], completions) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_tag_count_reward():
    completions = [
        GOOD,
        "<think>a</think>",
        "<think><think></think><answer>",
        "no tags",
    ]
    assert tag_count_reward([], completions) == [1.0, 0.5, 0.5, 0.0]


def test_conversational_completions_score_like_text():
    texts = [GOOD, "<think>a</think>", "plain"]
    assert format_reward([], [chat(t) for t in texts]) == format_reward([], texts) == [1.0, 0.0, 0.0]
    assert tag_count_reward([], [chat(t) for t in texts]) == tag_count_reward([], texts) == [1.0, 0.5, 0.0]
    # Several messages are joined; non-dict entries are ignored.
    split = [
        {"role": "assistant", "content": "<think>a</think>"},
        "junk",
        {"role": "assistant", "content": "<answer>1</answer>"},
    ]
    assert format_reward([], [split]) == [1.0]


def test_accuracy_reward():
    completions = [
        GOOD,
        "<think>hmm</think> <answer>5</answer>",
        "the answer is 4",  # no <answer>: the whole text is parsed
        chat("<answer>$\\frac{1}{2}$</answer>"),
        "<answer>0.5</answer>",
        "<answer>4</answer>",
    ]
    answers = ["4", "4", "4", "0.5", "1/2", "no number here"]
    assert accuracy_reward([], completions, answer=answers) == [1.0, 0.0, 1.0, 1.0, 1.0, None]


def test_accuracy_reward_needs_answers():
    with pytest.raises(ValueError, match="dataset_answer_column"):
        accuracy_reward([], [GOOD])


def test_length_reward_counts_characters_without_ids():
    length = make_length_reward(10)
    assert length([], ["abcde", "", "x" * 10, "x" * 25, chat("abcd")]) == pytest.approx([0.5, 1.0, 0.0, 0.0, 0.6])


def test_length_reward_prefers_token_ids():
    length = make_length_reward(10)
    # The ids decide, not the (longer) text.
    assert length([], ["x" * 100, "x" * 100], completion_ids=[[1, 2], list(range(12))]) == pytest.approx([0.8, 0.0])


def test_digits_reward_is_the_share_of_digits():
    """The demo's reward: it must vary between completions (GRPO learns nothing from equal rewards)."""
    got = load_reward("digits", {})(prompts=[""] * 4, completions=["12 ab", "abcd", "", [{"content": "7"}]])
    assert got == [0.4, 0.0, 0.0, 1.0]


def test_registry_names_and_length_config():
    assert set(REGISTRY) == {"accuracy", "format", "tag_count", "length", "digits"} == set(BUILTIN_REWARDS)
    assert load_reward("accuracy", {}) is accuracy_reward
    assert load_reward("format", {}) is format_reward
    assert load_reward("tag_count", {}) is tag_count_reward
    assert load_reward("length", {"max_completion_length": 4})([], ["ab"]) == [0.5]
    assert load_reward("length", {})([], ["x" * 256]) == [0.5]  # default max_completion_length 512
    assert load_reward("length", {"max_completion_length": None})([], ["x" * 128]) == [0.75]


@pytest.mark.parametrize(
    ("alias", "target"),
    [
        ("accuracy_reward", accuracy_reward),
        ("format_reward", format_reward),
        ("think_format_reward", format_reward),
        ("tag_count_reward", tag_count_reward),
    ],
)
def test_open_r1_aliases(alias, target):
    assert ALIASES[alias] in REGISTRY
    assert load_reward(alias, {}) is target
    assert check_reward_names([alias]) == []


def test_length_alias():
    assert load_reward("length_reward", {"max_completion_length": 8})([], ["ab"]) == [0.75]


def test_is_import_path():
    assert is_import_path("pkg.mod:fn")
    assert is_import_path("pkg.mod.fn")
    assert is_import_path("mod:fn")
    assert not is_import_path("accuracy")
    assert not is_import_path(".relative")


def test_check_reward_names_accepts_builtins_and_import_paths():
    assert check_reward_names(["accuracy", "format", "tag_count", "length", "pkg.mod:fn", "pkg.mod.fn"]) == []


def test_check_reward_names_unknown_with_suggestion():
    (problem,) = check_reward_names(["acuracy"])
    assert problem.startswith("unknown reward 'acuracy' (did you mean 'accuracy'?); built-in: ")
    assert "accuracy, format, tag_count, digits, length" in problem


def test_check_reward_names_unknown_without_suggestion():
    (problem,) = check_reward_names(["zzz"])
    assert problem.startswith("unknown reward 'zzz'; built-in:")
    assert "did you mean" not in problem


@pytest.mark.parametrize("name", ["pkg.mod:", "pkg.mod:not-ok", "9pkg.mod:fn", "pkg..mod:fn", ":fn"])
def test_check_reward_names_bad_import_path(name):
    assert check_reward_names([name]) == [f"reward {name!r} is not a valid import path (use package.module:function)"]


def test_check_reward_names_reports_each_problem():
    assert len(check_reward_names(["format", "nope", "a.b:c", "x.y:1"])) == 2


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    pkg = tmp_path / "my_rewards_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "scoring.py").write_text(
        "def exclaim(prompts, completions, **kwargs):\n"
        "    return [float(str(c).count('!')) for c in completions]\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards_pkg.scoring"
    for name in ("my_rewards_pkg.scoring", "my_rewards_pkg"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("sep", [":", "."])
def test_load_reward_by_import_path(reward_module, sep):
    fn = load_reward(f"{reward_module}{sep}exclaim", {})
    assert fn.__name__ == "exclaim"
    assert fn([], ["a!", "b!!!", "c"]) == [1.0, 3.0, 0.0]
    assert check_reward_names([f"{reward_module}{sep}exclaim"]) == []


def test_load_reward_missing_function(reward_module):
    with pytest.raises(ValueError, match=r"'my_rewards_pkg\.scoring' has no function 'nope'"):
        load_reward(f"{reward_module}:nope", {})
    with pytest.raises(ValueError, match="has no function 'NOT_CALLABLE'"):
        load_reward(f"{reward_module}:NOT_CALLABLE", {})


def test_load_reward_missing_module(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"cannot import reward module 'no_such_pkg_xyz\.mod': No module named"):
        load_reward("no_such_pkg_xyz.mod:fn", {})


def test_load_reward_rejects_unknown_names_and_bad_paths():
    with pytest.raises(ValueError, match=r"^unknown reward 'fromat' \(did you mean 'format'\?\)"):
        load_reward("fromat", {})
    with pytest.raises(ValueError, match="is not a valid import path"):
        load_reward("pkg.mod:not-ok", {})
