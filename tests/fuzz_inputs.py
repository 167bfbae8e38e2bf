"""Deterministic bad inputs for tests/test_fuzz_inputs.py. Each :class:`Case` is a command line and an environment
that grpo-launch must refuse with exit code 2 and one clear message naming one of ``expect``.

Classes: ``recipe-file`` (broken files), ``value`` (bad keys and values, in the file and as overrides), ``gpus``
(bad --gpus specs), ``hostfile`` (bad --hostfile files), ``env`` (bad CUDA_VISIBLE_DEVICES), ``sbatch`` (sbatch
options no cluster has). Every command plans only:
``plan --no-write``, ``RECIPE --dry-run``, ``sbatch --dry-run`` (run directories under the workspace) or ``inspect``.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import yaml

GPUS = "2xH100-80GB"
SBATCH_TOPOLOGY = ("--nodes", "1", "--gpus-per-node", "2", "--gpu-type", "H100-80GB")
RECIPE_VERBS = ("plan", "run", "sbatch")
TOPOLOGY_VERBS = ("plan", "run", "inspect")
# A tiny Qwen2 (the shape of scripts/make_tiny_assets.py's model): planning reads its config.json only.
TINY_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "vocab_size": 340,
    "tie_word_embeddings": True,
    "dtype": "float32",
}


@dataclass(frozen=True)
class Case:
    cls: str
    name: str
    argv: tuple[str, ...]
    environ: tuple[tuple[str, str], ...] = ()
    expect: tuple[str, ...] = ()  # the message must name one of these (key or offending value)

    def describe(self) -> str:
        env = " ".join(f"{k}={v!r}" for k, v in self.environ)
        return f"[{self.name}] {env + ' ' if env else ''}{' '.join(self.argv)}"


class Workspace:
    """Files for the cases under ``root``: a tiny model, a dataset, the base recipe and one file per bad input."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.canary = root / "CANARY"
        self._n = 0
        model = root / "model"
        model.mkdir(parents=True)
        (model / "config.json").write_text(json.dumps(TINY_CONFIG))
        data = root / "train.jsonl"
        data.write_text("".join(json.dumps({"prompt": f"{i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(64)))
        self.base = {
            "model_name_or_path": str(model),
            "dataset_name": str(data),
            "dataset_prompt_column": "prompt",
            "dataset_answer_column": "answer",
            "reward_funcs": ["digits", "accuracy", "format"],
            "num_generations": 4,
            "per_device_train_batch_size": 4,
            "max_prompt_length": 64,
            "max_completion_length": 16,
            "learning_rate": 1e-3,
            "max_steps": 60,
            "report_to": "none",
        }
        self.base_recipe = self.recipe()

    def hostile(self, style: int = 0) -> str:
        """A shell command that would create the canary if anything ever ran it."""
        return (f"$(touch {self.canary})", f";touch {self.canary}", f"`touch {self.canary}`")[style % 3]

    def path(self, suffix: str = ".yaml") -> Path:
        self._n += 1
        return self.root / f"in{self._n:04d}{suffix}"

    def file(self, content: str | bytes, suffix: str = ".yaml") -> str:
        p = self.path(suffix)
        p.write_bytes(content.encode() if isinstance(content, str) else content)
        return str(p)

    def run_dir(self) -> str:
        self._n += 1
        return str(self.root / "runs" / f"r{self._n:04d}")

    def recipe(self, pairs: tuple[tuple[str, str], ...] = (), drop: tuple[str, ...] = ()) -> str:
        """The base recipe with ``pairs`` (key, raw YAML) written into it (``launch.x`` into the launch block)."""
        keys = {k for k, _ in pairs} | set(drop)
        text = yaml.safe_dump({k: v for k, v in self.base.items() if k not in keys}, sort_keys=False)
        text += "".join(f"{k}: {raw}\n" for k, raw in pairs if not k.startswith("launch."))
        launch = [(k.removeprefix("launch."), raw) for k, raw in pairs if k.startswith("launch.")]
        if launch:
            text += "launch:\n" + "".join(f"  {k}: {raw}\n" for k, raw in launch)
        return self.file(text)


def recipe_argv(ws: Workspace, verb: str, recipe: str, overrides: tuple[str, ...] = ()) -> tuple[str, ...]:
    if verb == "plan":
        return ("plan", recipe, *overrides, f"--gpus={GPUS}", "--no-write")
    if verb == "run":  # the default verb: `grpo-launch RECIPE …`
        return (recipe, *overrides, f"--gpus={GPUS}", "--dry-run", "--run-dir", ws.run_dir())
    return ("sbatch", recipe, *overrides, *SBATCH_TOPOLOGY, "--dry-run", "--run-dir", ws.run_dir())


def topology_argv(ws: Workspace, verb: str, *topology: str) -> tuple[str, ...]:
    """``inspect``, ``plan`` or a dry run of the base recipe on the topology the options (or environment) give."""
    if verb == "inspect":
        return ("inspect", *topology)
    if verb == "plan":
        return ("plan", ws.base_recipe, *topology, "--no-write")
    return (ws.base_recipe, *topology, "--dry-run", "--run-dir", ws.run_dir())


def base_cases(ws: Workspace) -> list[Case]:
    """The control: the base recipe must plan with every verb (else every refusal below means nothing)."""
    return [Case("base", verb, recipe_argv(ws, verb, ws.base_recipe)) for verb in RECIPE_VERBS]


# ------------------------------------------------------------------------------------------- 1. broken recipe files


def _bomb(levels: int, width: int) -> str:
    """A billion-laughs value in one small flow sequence: ``width ** levels`` strings when expanded."""
    text = "&a0 [" + ", ".join(["lol"] * width) + "]"
    for k in range(1, levels):
        text = f"&a{k} [{text}, " + ", ".join([f"*a{k - 1}"] * (width - 1)) + "]"
    return text


def recipe_file_cases(ws: Workspace, rng: random.Random) -> list[Case]:
    base = yaml.safe_dump(ws.base, sort_keys=False)
    no_model = yaml.safe_dump({k: v for k, v in ws.base.items() if k != "model_name_or_path"})
    files: list[tuple[str, str, tuple[str, ...]]] = [
        ("empty file", ws.file(""), ("model_name_or_path", "empty")),
        ("comment-only file", ws.file("# nothing here\n# at all\n"), ("model_name_or_path", "empty")),
        ("null document", ws.file("null\n"), ("model_name_or_path", "empty")),
        ("a list", ws.file("- a\n- b\n"), ("mapping", "list")),
        ("a scalar", ws.file("42\n"), ("mapping", "int")),
        ("missing model_name_or_path", ws.file(no_model), ("model_name_or_path",)),
        ("model_name_or_path: null", ws.recipe((("model_name_or_path", "null"),)), ("model_name_or_path",)),
        ("non-UTF-8 bytes", ws.file(base.encode() + b"system_prompt: caf\xe9 \xff\xfe\n"), ("text", "UTF-8")),
        ("UTF-16 file", ws.file(base.encode("utf-16")), ("text", "UTF-8", "YAML")),
        ("NUL bytes", ws.file(base + "system_prompt: a\x00b\n"), ("YAML", "special")),
        ("YAML syntax error", ws.file(base + "reward_funcs: [a, b\n"), ("YAML",)),
        ("tab indentation", ws.file(base + "launch:\n\tvllm: off\n"), ("YAML",)),
        (
            "deep list 5000",
            ws.recipe((("reward_kwargs", "[" * 5000 + "]" * 5000),)),
            ("reward_kwargs", "nested deeper"),
        ),
        (
            "deep mapping 5000",
            ws.file(base + "launch: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n"),
            ("launch", "nested deeper"),
        ),
        ("recursive alias reward_funcs", ws.recipe((("reward_funcs", "&x [*x]"),)), ("reward_funcs",)),
        ("recursive alias model", ws.recipe((("model_name_or_path", "&x [*x]"),)), ("model_name_or_path",)),
        ("recursive alias in launch", ws.file(base + "launch: &x {vllm_env: *x}\n"), ("vllm_env", "recursive")),
        ("alias bomb in system_prompt", ws.recipe((("system_prompt", _bomb(7, 10)),)), ("system_prompt",)),
        (
            "alias bomb in vllm_extra_args",
            ws.file(base + f"launch: {{vllm_extra_args: {_bomb(7, 10)}}}\n"),
            ("vllm_extra_args",),
        ),
        ("duplicate key", ws.file(base + "learning_rate: 5.0\n"), ("learning_rate", "duplicate")),
        ("duplicate launch block", ws.file(base + "launch: {vllm: off}\nlaunch: {vllm: server}\n"), ("launch",)),
        ("unhashable key", ws.file(base + "? [a, b]\n: 1\n"), ("YAML", "unhashable")),
        (
            "python tag",
            ws.file(base + f"seed: !!python/object/apply:os.system ['touch {ws.canary}']\n"),
            ("YAML", "seed", "python"),
        ),
        ("a directory", str(ws.root / "model"), ("directory",)),
        ("missing file", str(ws.root / "no-such-recipe.yaml"), ("not found",)),
        ("file name too long", str(ws.root / ("r" * 300 + ".yaml")), ("too long",)),
    ]
    if os.geteuid() != 0:  # root reads a chmod 000 file anyway
        unreadable = ws.file(base)
        os.chmod(unreadable, 0)
        files.append(("unreadable file", unreadable, ("permission",)))
    cases = []
    for name, path, expect in files:
        for verb in RECIPE_VERBS:
            cases.append(Case("recipe-file", f"{verb}: {name}", recipe_argv(ws, verb, path), expect=expect))
    return cases


# ------------------------------------------------------------------------------------------------- 2. bad values


# key → raw YAML values, each clearly invalid for that key
BAD_VALUES: dict[str, tuple[str, ...]] = {
    "learning_rate": ("0", "-1e-5", "-0.0", ".nan", ".inf", "fast"),
    "temperature": ("0", "-1.0", "hot"),
    "top_p": ("1.5", "0", "-0.1"),
    "max_steps": ("-5", "ten", "٣"),
    "save_steps": ("0", "-1"),
    "lr_scheduler_type": ("no_such_scheduler",),
    "dtype": ("int8",),
    "report_to": ("[wandbb]", "wandbb"),
    "save_strategy": ("sometimes",),
    "loss_type": ("nope",),
    "reward_weights": ("[1.0]", "[1, 2, 3, 4]"),
    "reward_funcs": ("[accuracy, 3]", "[nosuchmod:f]", "[accuracy, nosuchmod.sub:f]", "[]", "[acuracy]"),
    "launch.vllm_command": ("[]", "''"),
    "launch.vllm_gpu_memory_utilization": ("1.7",),
    "vllm_gpu_memory_utilization": ("1.7",),
    "launch.vllm_port": ("0", "70000", "-1", "http", "８０００"),
    "launch.main_process_port": ("0", "70000", "-1", "http"),
    "launch.vllm_env": tuple(f'{{"{n}": x}}' for n in ("1BAD", "A B", "A=B", "")),
    "launch.train_env": tuple(f'{{"{n}": x}}' for n in ("1BAD", "A B", "A=B", "")),
    "launch.network_interface": ('"eth 0"',),
    "num_generations": (str(10**12), "four", "²"),
    "max_completion_length": (str(10**12),),
    "vllm_tensor_parallel_size": (str(10**9),),
    "launch.vllm_tensor_parallel_size": (str(10**9),),
    "per_device_train_batch_size": ("４", "0"),
    "gradient_accumulation_steps": ("0",),
    "generation_batch_size": ("0",),
    "steps_per_generation": ("0",),
    "launch.num_processes": ("²", "0"),
    "launch.vllm_gpus": ("0",),
    "launch.vllm": ("maybe",),
    "launch.backend": ("zero4",),
    "launch.offload": ("everything",),
    "launch.grace_period_s": ("-1",),
    "launch.vllm_health_timeout_s": ("0",),
    "launch.gpu_hour_price": ("-2",),
    "launch.no_such_setting": ("1",),
    "no_such_key": ("1",),
    # empty names, empty reward lists, dict-valued keys of another type, ports, names neither a path nor a Hub id
    "dataset_name": ("''",),
    "dataset_prompt_column": ("''", "' '"),
    "output_dir": ("''",),
    "launch.run_dir": ("''",),
    "gradient_checkpointing_kwargs": ("5", "[1, 2]"),
    "model_init_kwargs": ("true",),
    "vllm_server_port": ("0", "70000"),
    "vllm_group_port": ("-1", "65536"),
    "model_name_or_path": ("'my model; rm -rf x'", "'a b'"),
    "launch.vllm_host": ("'host name'", "'h;touch x'", "'$(id)'"),
    "scale_rewards": ("1", "[group]"),
}


def fixed_bad_values(ws: Workspace) -> list[tuple[tuple[str, str], ...]]:
    """(key, raw YAML) assignments, each group clearly invalid."""
    groups = [((k, v),) for k, values in BAD_VALUES.items() for v in values]
    groups += [((f"launch.{k}", f'{{"A;touch {ws.canary}": x}}'),) for k in ("vllm_env", "train_env")]
    groups += [(("launch.network_interface", f'"{v}"'),) for v in (f"eth0{ws.hostile(1)}", *map(ws.hostile, (0, 2)))]
    server = ("launch.vllm", "server")
    groups += [
        (("bf16", "true"), ("fp16", "true")),
        (server, ("launch.vllm_port", "29500")),
        (server, ("launch.main_process_port", "8000")),
        (server, ("launch.vllm_port", "4242"), ("launch.main_process_port", "4242")),
    ]
    return groups


HUGE_INT_KEYS = (
    *("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "generation_batch_size"),
    *("steps_per_generation", "max_steps", "max_completion_length", "save_steps"),
    *("launch.num_processes", "launch.vllm_gpus"),
)
INT_KEYS = ("num_generations", "max_steps", "per_device_train_batch_size", "launch.vllm_port", "launch.num_processes")
UNICODE_DIGITS = ("²", "³¹", "٣", "４", "௫", "Ⅻ", "߃", "१२")


def random_bad_values(ws: Workspace, rng: random.Random) -> list[tuple[tuple[str, str], ...]]:
    out: list[tuple[str, str]] = []
    for key in HUGE_INT_KEYS:
        out.append((key, str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(399))))
    out += [("learning_rate", f"-{rng.uniform(1e-7, 1):.3g}") for _ in range(3)]
    out += [("temperature", f"{-rng.uniform(0.01, 5):.3g}") for _ in range(2)]
    out += [("top_p", f"{rng.uniform(1.01, 50):.3g}") for _ in range(2)]
    for key in ("launch.vllm_port", "launch.main_process_port"):
        out += [(key, str(rng.choice([rng.randint(65536, 10**6), -rng.randint(1, 65535)]))) for _ in range(2)]
    for key in ("launch.vllm_env", "launch.train_env"):
        for _ in range(3):
            name = rng.choice(["9", "A-", "A B", "A=", "É", "A.B", "-"]) + "".join(rng.choices("ABC_12", k=3))
            out.append((key, json.dumps({name: "1"})))
    out += [(k, f"{rng.uniform(1.01, 10):.3g}") for k in ("vllm_gpu_memory_utilization",) * 2]
    out += [(k, f"{rng.uniform(1.01, 10):.3g}") for k in ("launch.vllm_gpu_memory_utilization",) * 2]
    out += [(rng.choice(INT_KEYS), rng.choice(UNICODE_DIGITS)) for _ in range(4)]
    return [(p,) for p in out]


def value_cases(ws: Workspace, rng: random.Random) -> list[Case]:
    cases = []
    for group in [*fixed_bad_values(ws), *random_bad_values(ws, rng)]:
        values = tuple(v for _, v in group if len(v) >= 3 and v not in ("true", "false", "null", "server"))
        expect = tuple(k.rsplit(".", 1)[-1] for k, _ in group) + values
        label = " ".join(f"{k}={v if len(v) < 24 else v[:20] + '…'}" for k, v in group)
        in_file = ws.recipe(group)
        overrides = tuple(f"{k}={v}" for k, v in group)
        # `plan` is offline (it may plan for another machine): whether a reward module imports is checked where the
        # run starts (run and sbatch, --dry-run included).
        offline_ok = any("nosuchmod" in v for _, v in group)
        for verb in (v for v in RECIPE_VERBS if not (offline_ok and v == "plan")):
            cases.append(Case("value", f"{verb}, file: {label}", recipe_argv(ws, verb, in_file), expect=expect))
            argv = recipe_argv(ws, verb, ws.base_recipe, overrides)
            cases.append(Case("value", f"{verb}, override: {label}", argv, expect=expect))
    return cases


# --------------------------------------------------------------------------------------------- 3. bad --gpus specs


def gpu_spec_cases(ws: Workspace, rng: random.Random) -> list[Case]:
    specs = [
        *("8xFOO-0GB", "-1xH100", "0xH100", "8x", "x8", "8xH100-0GB", "8xH100-0.0GB", "99999999999xH100"),
        *("0x8xH100", "5000x8xH100", "8xH100-80GB-extra", "8xH100-80TB", "8xH100--80GB", "8xH100-nanGB"),
        *("8xH100-99999999999999999999GB", "²xH100", "８xH100", "8xH100-８０GB", "٨xH100"),
        *("", " ", "8x" + ws.hostile(0), str(rng.randint(65, 10**6)) + "xH100"),
        "1x" + "".join(rng.choices("XYZQ", k=8)),
    ]
    cases = []
    for spec in specs:
        expect = ("--gpus", spec.strip()) if spec.strip() else ("--gpus",)
        for verb in TOPOLOGY_VERBS:
            argv = topology_argv(ws, verb, f"--gpus={spec}")
            cases.append(Case("gpus", f"{verb}: --gpus={spec!r}", argv, expect=expect))
    return cases


# ------------------------------------------------------------------------------------------------- 4. bad hostfiles


def hostfile_cases(ws: Workspace, rng: random.Random) -> list[Case]:
    canary = ws.canary
    files: list[tuple[str, str, tuple[str, ...]]] = [
        ("non-UTF-8", ws.file(b"node1 slots=2\nn\xf6de2 slots=2\n", ".hf"), ("hostfile", "UTF-8", "text")),
        ("slots=²", ws.file("node1 slots=²\n", ".hf"), ("slots", "²")),
        ("slots=٣", ws.file("node1 slots=٣\n", ".hf"), ("slots", "٣")),
        ("slots=-1", ws.file("node1 slots=-1\n", ".hf"), ("slots",)),
        ("slots=0", ws.file("node1 slots=0\n", ".hf"), ("slots",)),
        ("slots=8.5", ws.file("node1 slots=8.5\n", ".hf"), ("slots",)),
        ("slots=", ws.file("node1 slots=\n", ".hf"), ("slots",)),
        ("slots=100000", ws.file("node1 slots=100000\n", ".hf"), ("slots", "100000")),
        ("missing slots", ws.file("node1\nnode2 slots=2\n", ".hf"), ("slots", "node1")),
        ("slots twice", ws.file("node1 slots=2 slots=4\n", ".hf"), ("slots",)),
        ("duplicate hosts", ws.file("node1 slots=2\nnode1 slots=2\n", ".hf"), ("node1", "twice")),
        ("hosts differing in case", ws.file("node1 slots=2\nNODE1 slots=2\n", ".hf"), ("NODE1", "node1")),
        ("empty", ws.file("", ".hf"), ("hosts", "hostfile")),
        ("comment only", ws.file("# node1 slots=2\n\n", ".hf"), ("hosts", "hostfile")),
        ("rm -rf", ws.file("a;rm -rf / slots=1\n", ".hf"), ("a;rm",)),
        ("$(touch)", ws.file(f"$(touch${{IFS}}{canary}) slots=1\n", ".hf"), ("touch",)),
        (";touch", ws.file(f"node1;touch${{IFS}}{canary} slots=1\n", ".hf"), ("touch",)),
        ("`touch`", ws.file(f"`touch${{IFS}}{canary}` slots=1\n", ".hf"), ("touch",)),
        ("NUL byte", ws.file("node1 slots=1\x00\n", ".hf"), ("slots", "node1", "\\x00")),
        ("10k hosts", ws.file("".join(f"node{i} slots=8\n" for i in range(10_000)), ".hf"), ("host", "10000")),
        ("a directory", str(ws.root / "model"), ("directory",)),
        ("missing file", str(ws.root / "no-such.hf"), ("no such file", "not found")),
        ("random junk", ws.file("".join(rng.choices("ab=\t #!;", k=40)) + " slots=x\n", ".hf"), ("slots", ":1")),
    ]
    cases = []
    for name, path, expect in files:
        for verb in TOPOLOGY_VERBS:
            argv = topology_argv(ws, verb, "--hostfile", path)
            cases.append(Case("hostfile", f"{verb}: {name}", argv, expect=expect))
    return cases


# -------------------------------------------------------------------------------------------- 5. bad environment


def env_cases(ws: Workspace, rng: random.Random) -> list[Case]:
    values = [
        *("²", "0,²", "٣", "１", "abc", "0,,1", "0,0", "GPU-zz", "MIG-", "99999999"),
        *("0 1", "0," + ws.hostile(1), ws.hostile(0), "".join(rng.choices("0123456789,;x-", k=12))),
    ]
    cases = []
    for value in values:
        for verb in TOPOLOGY_VERBS:
            argv = ("inspect",) if verb == "inspect" else topology_argv(ws, verb)
            cases.append(
                Case(
                    "env",
                    f"{verb}: CUDA_VISIBLE_DEVICES={value!r}",
                    argv,
                    (("CUDA_VISIBLE_DEVICES", value),),
                    expect=("CUDA_VISIBLE_DEVICES",),
                )
            )
    return cases


def sbatch_cases(ws: Workspace, rng: random.Random) -> list[Case]:
    """sbatch values no cluster has, or that are not names."""
    bad = [
        (("--nodes", "100000", "--gpus-per-node", "8"), ("--nodes",)),
        (("--nodes", "1", "--gpus-per-node", str(rng.randint(65, 10**6))), ("--gpus-per-node",)),
        (("--nodes", "1", "--gpus-per-node", "2", "--job-name", ""), ("--job-name",)),
        (("--nodes", "1", "--gpus-per-node", "2", "--job-name", " "), ("--job-name",)),
        (("--nodes", "1", "--gpus-per-node", "2", "--gpu-type", f"h100;touch {ws.canary}"), ("--gpu-type",)),
        (("--nodes", "1", "--gpus-per-node", "2", "--gpu-type", "$(id)"), ("--gpu-type",)),
    ]
    return [
        Case("sbatch", f"sbatch: {' '.join(args)}",
             ("sbatch", ws.base_recipe, *args, "--dry-run", "--run-dir", ws.run_dir()), expect=expect)
        for args, expect in bad
    ]  # fmt: skip


def generate(root: Path, seed: int = 1234) -> tuple[Workspace, list[Case], list[Case]]:
    """The workspace, the control cases (must succeed) and the bad inputs (must be refused), in a fixed order."""
    rng = random.Random(seed)
    ws = Workspace(root)
    bad = [
        *recipe_file_cases(ws, rng),
        *value_cases(ws, rng),
        *gpu_spec_cases(ws, rng),
        *hostfile_cases(ws, rng),
        *env_cases(ws, rng),
        *sbatch_cases(ws, rng),
    ]
    return ws, base_cases(ws), bad
