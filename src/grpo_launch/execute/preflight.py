"""Checks before a run starts anything, reported together, in one call: :func:`preflight`, once per run (``run``,
its dry run, and the submit verbs ``sbatch``, ``sky``, ``ray-submit``: cli/submitting.py), before anything starts,
is written to the run directory, or is queued. What it checks depends on the :class:`Stage`:

- always: the recipe's inputs (model, data, rewards, the report_to integrations) and launch.pass_env (said, not
  refused, for a dry run or a submission: the job's own environment is checked where it runs);
- a run that starts its processes, besides: whether its trainers can load a Hub model (:func:`check_models_load`),
  vLLM in every Python that will import it (:func:`check_vllm`), and the output directory (writable, with room for
  the checkpoints the plan implies).

It returns what the run needs of it (:class:`Checked`: the output directory, warnings to say once the run starts).
The backend's own checks (its hosts, their ports) come once the run holds its run directory's lock
(``Backend.preflight``); torch extension build locks DeepSpeed would wait on forever are said per attempt."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from grpo_launch.enums import StrEnum, VllmMode
from grpo_launch.errors import ConfigError, LaunchError, install_hint, size_text
from grpo_launch.planning.cost.storage import checkpoints_kept, save_bytes
from grpo_launch.planning.plan_types import Plan
from grpo_launch.probe.dataset import looks_local
from grpo_launch.probe.pythons import interpreter_of, vllm_version_of
from grpo_launch.recipe import LOCAL_DATA_SUFFIXES
from grpo_launch.recipe.rewards import OPEN_R1_INSTALL, reward_imports
from grpo_launch.recipe.trl_schema import DEFAULTS as TRL_DEFAULTS
from grpo_launch.recipe.versions import TRL_VLLM_RANGE, TRL_VLLM_RANGE_TEXT, version_tuple
from grpo_launch.rundir.trusted_files import private_dir
from grpo_launch.spec import RunContext, frozen


class Stage(StrEnum):
    """What the checks are for: a run that starts its processes here, its dry run, or a submission (a batch job, a
    SkyPilot task, a Ray job) whose own ``grpo-launch run`` starts them in the job's environment."""

    RUN = "run"
    DRY_RUN = "dry run"
    SUBMIT = "submission"


@frozen
class Checked:
    """What :func:`preflight` found and the run goes on with: where its trainers write (``output_dir``, from the
    working directory they start in) and what to say once it starts (``warnings``)."""

    output_dir: Path
    warnings: tuple[str, ...] = ()


def preflight(plan: Plan, ctx: RunContext, stage: Stage, *, warn: Callable[[str], None] | None = None) -> Checked:
    """Every check of ``stage`` (see the module), in order; a problem raises (ConfigError or LaunchError) before
    anything has started. ``warn`` says what a dry run or a submission only warns of (launch.pass_env names unset
    here)."""
    check_inputs(plan, ctx.workdir)
    output_dir = output_dir_of(plan, ctx.workdir)
    if stage is not Stage.RUN:
        problem = unset_pass_env(plan, ctx.environ)
        if problem and warn is not None:
            warn(problem)
        return Checked(output_dir)
    check_pass_env(plan, ctx.environ)
    check_vllm(plan)
    return Checked(output_dir, tuple(check_output_dir(plan, ctx.workdir)))


def check_inputs(plan: Plan, workdir: str) -> None:
    """Everything about the recipe's inputs that can be checked before a process starts, reported together.
    ``workdir`` (where the processes start; the CLI runs there) names the base of relative paths in messages."""
    values = plan.trainer_values
    problems: list[str] = []
    model = str(values.get("model_name_or_path") or "")
    if not model:
        problems.append("model_name_or_path is not set")
    elif looks_local(model) and not (Path(model).expanduser() / "config.json").is_file():
        problems.append(
            f"model path {model!r} has no config.json (is the path right? relative paths start from {workdir})"
        )
    data = str(values.get("dataset_name") or "")
    if not data:
        problems.append("dataset_name is not set")
    elif Path(data).suffix in LOCAL_DATA_SUFFIXES and not Path(data).expanduser().is_file():
        problems.append(f"dataset file {data!r} not found")
    elif looks_local(data) and not Path(data).expanduser().exists():
        problems.append(f"dataset path {data!r} not found")
    # The reward names themselves were checked with the recipe (recipe/rewards.py); here, whether the trainers import
    # their modules, and report_to's integrations.
    problems += missing_imports(plan, workdir)
    if problems:
        raise ConfigError("cannot start the run:", problems=problems)


def missing_imports(plan: Plan, workdir: str) -> list[str]:
    """What the trainers' Python cannot import, found by one probe of it (:func:`_not_found`: nothing is imported and
    nothing of the recipe's runs), each with its fix: the modules of import-path rewards and open-r1's rewards (only
    for a run on this machine: other hosts have their own environment), and report_to's integrations (what
    otherwise fails in Trainer.__init__, after the queue wait and the model load; the launcher's Python stands for
    the trainers' on every host: plan.python)."""
    modules, open_r1 = reward_imports(plan.trainer_values)
    if len(plan.topology.hosts) > 1:
        modules = []
    reporters = planned_reporters(plan.trainer_values)
    if not modules and not reporters:
        return []
    path = _trainer_path(plan)
    # report_to's integrations are not searched in the working directory: a leftover directory named like a package
    # there is not the package.
    groups = [([workdir, *path], modules), ([p for p in path if p != workdir], [REPORTERS[n][0] for n in reporters])]
    lacking = _not_found(plan, workdir, groups)
    if lacking is None:
        return []
    rewards_lacking, reporters_lacking = lacking
    return [
        f"reward_funcs {', '.join(open_r1)}: open-r1's rewards, and open_r1 is not importable by {plan.python}; "
        f"install it there: {OPEN_R1_INSTALL}"
        if m == "open_r1" and open_r1
        else f"reward_funcs: module {m!r} is not importable from {workdir} by {plan.python} (check the name, or add "
        "its directory to PYTHONPATH: launch.train_env)"
        for m in rewards_lacking
    ] + [
        f"report_to: {name} is not importable by the trainers' Python ({plan.python}); install it there: "
        f"{shlex.join([plan.python, '-m', 'pip', 'install', *REPORTERS[name][1].split()])}, or take {name} out of "
        "report_to"
        for name in reporters
        if REPORTERS[name][0] in reporters_lacking
    ]


def _trainer_path(plan: Plan) -> list[str]:
    """The PYTHONPATH entries the trainers start with (the launcher's, or launch.train_env's in its place)."""
    value = (dict(os.environ) | dict(plan.recipe.launch.train_env)).get("PYTHONPATH", "")
    return [p for p in value.split(os.pathsep) if p]


# The import probe, run in the trainers' Python isolated (``python -I``: no PYTHONPATH, no user site, no working
# directory on sys.path), so that no sitecustomize.py, usercustomize.py or .pth file of the recipe's, and no module
# of its, runs: a dry run (``run``, ``sbatch``, ``sky``, ``ray-submit``) runs nothing the recipe controls. The
# directories the trainers would search besides the installation (their working directory, the run's PYTHONPATH,
# the user site) come as an argument with each group of names, and are only searched: finding a module reads
# directories, and a dotted name's packages are searched, not imported. Prints, for each group, the names not found:
# "a|b" is either module, "a+b" both. wandb must be a package (a leftover wandb/ run directory is a namespace
# package with no wandb.run, which transformers' is_wandb_available would take for W&B).
_PROBE = """
import importlib, importlib.machinery, importlib.util, json, site, sys
user = [site.getusersitepackages()] if sys.prefix == sys.base_prefix else []
installed = list(sys.path)
def find(name):
    top, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    for i in range(len(rest)):
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join([top, *rest[: i + 1]]),
                                                        list(spec.submodule_search_locations))
    return spec
def found(name):
    spec = find(name)
    return spec is not None and (name != "wandb" or spec.origin not in (None, "namespace"))
lacking = []
for paths, names in json.loads(sys.argv[1]):
    sys.path[:] = [*paths, *user, *installed]
    importlib.invalidate_caches()
    lacking.append([a for a in names if not any(all(found(m) for m in alt.split("+")) for alt in a.split("|"))])
print(json.dumps(lacking))
"""


def _not_found(plan: Plan, workdir: str, groups: list[tuple[list[str], list[str]]]) -> list[list[str]] | None:
    """For each group (paths, names): which of the names the trainers' Python does not find, searching those paths
    besides its installation; one run of it, in ``workdir``, with the launcher's environment and none of the
    recipe's. None when the probe itself failed (the interpreter is checked when the trainers start)."""
    argv = [plan.python, "-I", "-c", _PROBE, json.dumps(groups)]
    try:
        out = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=120)
        lacking = json.loads(out.stdout.strip().splitlines()[-1])
        return [[str(n) for n in names] for names in lacking] if len(lacking) == len(groups) else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, TypeError):
        return None


# report_to's integrations as transformers finds them (transformers/integrations/integration_utils.py: the
# is_*_available checks behind INTEGRATION_TO_CALLBACK): "a|b" either module, "a+b" both; and what installs them.
# kubeflow is none of them: transformers enables it from KUBEFLOW_TRAINER_SERVER_URL, with nothing to import.
REPORTERS: dict[str, tuple[str, str]] = {
    "azure_ml": ("azureml.core.run", "azureml-core"),
    "clearml": ("clearml", "clearml"),
    "codecarbon": ("codecarbon", "codecarbon"),
    "comet_ml": ("comet_ml", "comet-ml"),
    "dagshub": ("dagshub+mlflow", "dagshub mlflow"),
    "dvclive": ("dvclive", "dvclive"),
    "flyte": ("flytekit", "flytekit flytekitplugins-deck-standard"),
    "mlflow": ("mlflow", "mlflow"),
    "neptune": ("neptune", "neptune"),
    "swanlab": ("swanlab", "swanlab"),
    "tensorboard": ("tensorboard|tensorboardX", "tensorboard"),
    "trackio": ("trackio", "trackio"),
    "wandb": ("wandb", "wandb"),
}


def planned_reporters(values: Mapping[str, Any]) -> list[str]:
    """The integrations report_to names, as transformers' TrainingArguments reads it: unset is TRL's default
    ("none"); "none" is none; "all" is those installed, so none can be missing."""
    value = values.get("report_to", TRL_DEFAULTS["report_to"])
    names = [value] if isinstance(value, str) else list(value or [])
    return [] if names in (["none"], ["all"]) else [str(n) for n in names if n in REPORTERS]


def unset_pass_env(plan: Plan, environ: Mapping[str, str]) -> str | None:
    """What is wrong when a name of launch.pass_env is not set in ``environ`` (the launcher's environment, which
    the processes get it from), or None."""
    unset = [n for n in plan.recipe.launch.pass_env if n not in environ]
    if not unset:
        return None
    return (
        f"launch.pass_env names {', '.join(unset)}, not set in this environment: the processes would start without "
        f"{'it' if len(unset) == 1 else 'them'}. Export {' and '.join(unset)} before grpo-launch (the value travels "
        "by name, never written), or take the name out of launch.pass_env"
    )


def check_pass_env(plan: Plan, environ: Mapping[str, str]) -> None:
    """What the environment the processes start in (``environ``, the launcher's) lacks, for a run that starts
    them: a name of launch.pass_env not set there refuses the run (LaunchError), and so do trainers that cannot
    load a model they would load (:func:`check_models_load`). A dry run and a submission load nothing, and a
    submitted job checks in its own environment when it runs."""
    if problem := unset_pass_env(plan, environ):
        raise LaunchError(
            problem,
            hint="A secret reaches every process by its name in launch.pass_env; its value "
            "comes from the environment grpo-launch starts in.",
        )
    check_models_load(plan, environ)


# A Hub model the trainers load: (repo id, revision, cache_dir, what it is, gguf_file).
HubModel = tuple[str, str | None, str | None, str, str | None]


def hub_models(plan: Plan) -> list[HubModel]:
    """The Hub models the trainers load, as (repo id, revision, cache_dir, what, gguf_file): the policy model (its
    weights at model_init_kwargs' revision, else model_revision; in model_init_kwargs' cache_dir), its tokenizer
    (model_revision, the default cache; vLLM loads both from the same repository) and a reward_model_name_or_path
    (its model and tokenizer). A local path is none of them (preflight checks its config.json)."""
    values = plan.trainer_values
    given = values.get("model_init_kwargs")
    init: dict[str, Any] = given if isinstance(given, dict) else {}
    out: list[HubModel] = []
    model = str(values.get("model_name_or_path") or "")
    if model and not looks_local(model):
        revision = values.get("model_revision")
        rev = str(init.get("revision") or revision or "") or None
        cache, gguf = init.get("cache_dir"), init.get("gguf_file")
        out.append((model, rev, str(cache) if cache else None, "model", str(gguf) if gguf else None))
        out.append((model, str(revision) if revision else None, None, "tokenizer", None))
    reward = str(values.get("reward_model_name_or_path") or "")
    if reward and not looks_local(reward):
        out += [(reward, None, None, "reward model", None), (reward, None, None, "reward tokenizer", None)]
    return out


def check_models_load(plan: Plan, environ: Mapping[str, str]) -> None:
    """Refuse, before anything starts, a run whose trainers cannot load a Hub model (or its tokenizer): offline
    (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE) and not in the Hugging Face cache, or not cached and the Hub not
    reachable (or it has no such model, or it is gated). Otherwise every rank fails in from_pretrained after the
    start, each with its traceback. Asked of huggingface_hub in the trainers' Python with the trainers' environment
    (``environ`` and launch.train_env), so the cache is the one transformers reads (HF_HUB_CACHE, HF_HOME, …):
    :data:`_MODEL_PROBE`. Only where the run's hosts are this machine or a Slurm allocation (the launcher runs on
    its first node, whose processes get this environment); other hosts have their own caches."""
    models = hub_models(plan)
    if not models or not plan.topology.trainers_share_this_cache:
        return
    env = {**environ, **plan.recipe.launch.train_env}
    found = _probe_models(plan.python, env, models)
    if found is None:
        return
    offline, cache, cli = str(found["offline"]), str(found["cache"]), str(found["cli"])
    lacking: dict[tuple[str, str | None, str | None], tuple[list[str], list[str], str | None]] = {}
    for (repo, rev, cache_dir, what, _), result in zip(models, found["models"], strict=True):
        if result["missing"] and (offline or result["reach"] is not None):
            whats, parts, _ = lacking.setdefault((repo, rev, cache_dir), ([], [], result["reach"]))
            whats.append(what)
            parts += [m for m in result["missing"] if m not in parts]
    if not lacking:
        return
    problems, downloads = [], []
    for (repo, rev, cache_dir), (whats, parts, reach) in lacking.items():
        why = f"the trainers run offline ({offline} is set)" if offline else reach
        nothing = "config.json" in parts and any(p.startswith("the weights") for p in parts)
        said = "not" if nothing else f"{', '.join(parts)} not"  # nothing of it, or what is missing
        problems.append(
            f"{repo}{'@' + rev if rev else ''} ({' and '.join(whats)}): {said} in the Hugging Face "
            f"cache {cache_dir or cache}, and {why}"
        )
        downloads.append(
            shlex.join(
                [
                    cli,
                    "download",
                    repo,
                    *(["--revision", rev] if rev else []),
                    *(["--cache-dir", cache_dir] if cache_dir else []),
                ]
            )
        )
    hint = f"Download it first, into the cache the trainers read ({cache}): {'; '.join(dict.fromkeys(downloads))}"
    if any("cannot be reached" in str(reach) for _, _, reach in lacking.values()):
        hint += " (copy the cache over from a machine that reaches the Hub, or fix the network, proxy or HF_ENDPOINT)"
    if offline:
        hint += (
            f"; or unset {offline} (the launcher's environment, or launch.train_env) and let the trainers download it"
        )
    raise ConfigError("the trainers cannot load the model:", problems=problems, hint=hint)


def _probe_models(python: str, env: Mapping[str, str], models: list[HubModel]) -> dict[str, Any] | None:
    """:data:`_MODEL_PROBE`'s answer, or None when it could not answer (the trainers' start then says why)."""
    argv = [python, "-I", "-c", _MODEL_PROBE, json.dumps(models)]
    try:
        out = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=120)
        found = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    if not isinstance(found, dict) or len(found.get("models") or []) != len(models):
        return None
    return found


# In the trainers' Python with their environment: huggingface_hub's own cache (constants.HF_HUB_CACHE, resolved from
# HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME as transformers' from_pretrained resolves it) and offline flag, and
# try_to_load_from_cache for what from_pretrained reads: config.json and the weights (model.safetensors, its index and
# every shard it names, or pytorch_model.bin likewise; a gguf_file), and a tokenizer's files. What is missing online
# is asked of the Hub once (the metadata of config.json, with huggingface_hub's own timeout): unreachable, no such
# model, gated or no such revision is said; any other answer is left to the start.
_MODEL_PROBE = """
import json, sys
try:
    import huggingface_hub
    from huggingface_hub import constants, try_to_load_from_cache
except Exception:
    sys.exit(0)
def lookup(repo, name, rev, cache):
    try:
        found = try_to_load_from_cache(repo, name, cache_dir=cache, revision=rev)
    except Exception:
        return None
    return found if isinstance(found, str) else None
def cached(repo, name, rev, cache):
    return lookup(repo, name, rev, cache) is not None
def weights(repo, rev, cache, gguf):
    if gguf:
        return [] if cached(repo, gguf, rev, cache) else [gguf]
    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if cached(repo, single, rev, cache):
            return []
        path = lookup(repo, index, rev, cache)
        if path is not None:
            try:
                shards = sorted(set(json.load(open(path))["weight_map"].values()))
            except Exception:
                return ["the weight shards (" + index + " unreadable)"]
            lacking = [s for s in shards if not cached(repo, s, rev, cache)]
            return ["%d of %d weight shards (%s)" % (len(lacking), len(shards), lacking[0])] if lacking else []
    return ["the weights (model.safetensors or pytorch_model.bin, or their index)"]
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
def missing(repo, rev, cache, what, gguf):
    if what.endswith("tokenizer"):
        found = any(cached(repo, n, rev, cache) for n in TOKENIZER)
        return [] if found else ["the tokenizer files (tokenizer.json, tokenizer_config.json, …)"]
    out = [] if cached(repo, "config.json", rev, cache) else ["config.json"]
    return out + weights(repo, rev, cache, gguf)
def reach(repo, rev):
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub import errors
    try:
        get_hf_file_metadata(hf_hub_url(repo, "config.json", revision=rev))
        return None
    except errors.GatedRepoError:
        return "it is gated: accept its terms on the Hub and give the trainers a token (HF_TOKEN in launch.pass_env)"
    except errors.RepositoryNotFoundError:
        return "the Hub has no such model (or it is private: give the trainers a token, HF_TOKEN in launch.pass_env)"
    except errors.RevisionNotFoundError:
        return "the Hub has no revision %r of it" % (rev,)
    except errors.HfHubHTTPError:
        return None
    except Exception as exc:
        name = type(exc).__name__
        if isinstance(exc, OSError) or any(w in name for w in ("Connect", "Timeout", "Network", "Proxy")):
            return "the Hub (%s) cannot be reached: %s" % (constants.ENDPOINT, name)
        return None
import os
offline = next((n for n in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
                if constants.HF_HUB_OFFLINE and os.environ.get(n, "").upper() in constants.ENV_VARS_TRUE_VALUES), "")
out = []
asked = {}
for repo, rev, cache, what, gguf in json.loads(sys.argv[1]):
    lacking = missing(repo, rev, cache, what, gguf)
    said = None
    if lacking and not offline:
        if (repo, rev) not in asked:
            asked[repo, rev] = reach(repo, rev)
        said = asked[repo, rev]
    out.append({"missing": lacking, "reach": said})
major = int(huggingface_hub.__version__.split(".")[0])
print(json.dumps({"offline": offline, "cache": constants.HF_HUB_CACHE, "cli": "hf" if major >= 1 else "huggingface-cli",
                  "models": out}))
"""


def check_vllm(plan: Plan) -> str | None:
    """The trainers import vLLM in both modes (TRL's client and the NCCL weight transfer, whose wire format changes
    between versions), so vLLM must be importable in the trainers' Python, within TRL 1.16's range, and (server
    mode) the same version as the server's; and the plan (whose server flags depend on it) must have been made for
    that version. Returns the server's version; raises one error with every problem."""
    if plan.vllm.mode == VllmMode.OFF:
        return None
    low, high = TRL_VLLM_RANGE
    problems = []
    trainer = vllm_version_of(plan.python)
    versions = {f"the trainers' Python ({plan.python})": trainer}
    if plan.vllm.mode == VllmMode.SERVER:
        command = plan.recipe.launch.vllm_command
        python = interpreter_of(command[0])
        if python is None:
            problems.append(f"cannot find the Python behind the server command {command[0]!r} (launch.vllm_command)")
        else:
            versions[f"the server's Python ({python})"] = vllm_version_of(python)
    for where, version in versions.items():
        v = version_tuple(version)
        if version == "missing":
            problems.append(f"vLLM is not installed in {where}")
        elif v is None:
            problems.append(f"cannot read the vLLM version in {where}: {version}")
        elif not low <= v <= high:
            problems.append(f"vLLM {version} in {where} is outside TRL 1.16's range {TRL_VLLM_RANGE_TEXT}")
    found = {version_tuple(v) for v in versions.values()}
    if not problems and len(found) > 1:
        problems.append(
            "the trainers and the server run different vLLM versions: "
            + ", ".join(f"{v} in {w}" for w, v in versions.items())
        )
    planned = version_tuple(plan.vllm_version)
    if not problems and planned is not None and planned not in found:
        problems.append(
            f"the plan was made for vLLM {plan.vllm_version}, but the run's Pythons import "
            + ", ".join(f"{v} ({w})" for w, v in versions.items())
        )
    if problems:
        raise LaunchError(
            "vLLM is not ready for this run:",
            problems=problems,
            hint=f"Install the same vLLM ({TRL_VLLM_RANGE_TEXT}) where the trainers run and where the server runs: "
            f"{install_hint('train,vllm')}, or point launch.vllm_command at the trainers' environment.",
        )
    return list(versions.values())[-1]  # the server's in server mode, else the trainers'


def stale_build_locks(environ: Mapping[str, str]) -> list[Path]:
    """Lock files of torch's JIT extension builds (DeepSpeed compiles its ops on first use)."""
    root = Path(
        environ.get("TORCH_EXTENSIONS_DIR") or Path(environ.get("HOME", "~")).expanduser() / ".cache/torch_extensions"
    )
    return sorted({*root.glob("*/lock"), *root.glob("*/*/lock")})


def output_dir_of(plan: Plan, workdir: str) -> Path:
    """The trainers' output_dir as a path from ``workdir`` (where they start)."""
    return Path(workdir) / Path(plan.output_dir).expanduser()


def check_output_dir(plan: Plan, workdir: str, *, free_bytes: Callable[[Path], int] | None = None) -> list[str]:
    """Problems with the output directory that would otherwise show after the model has loaded: not writable, or
    too little free space for one checkpoint and the final model (what the plan implies). Returns warnings (space
    for one checkpoint, not for every checkpoint the run keeps)."""
    out = output_dir_of(plan, workdir)
    try:  # as the trainers will: create it, write in it (permission bits say nothing for root or read-only mounts)
        private_dir(
            out
        )  # 0700: auto-resume loads what is there (rundir/trusted_files.py refuses what others may change)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise LaunchError(
            f"output_dir {str(out)!r} cannot be written: {exc.strerror or exc}",
            hint="Set output_dir to a writable directory (e.g. output_dir=runs/NAME).",
        ) from None
    base = out
    if plan.model is None:
        return []
    free = (free_bytes or (lambda p: shutil.disk_usage(p).free))(base)
    checkpoint, final = save_bytes(
        plan.model, plan.train.backend, plan.trainer_values, mixed_precision=plan.train.mixed_precision
    )
    kept = checkpoints_kept(plan.trainer_values, int(plan.trainer_values.get("max_steps") or -1))
    if free < checkpoint + final:
        raise LaunchError(
            f"output_dir {str(out)!r} has {size_text(free)} free, but one checkpoint ({size_text(checkpoint)} "
            f"with {plan.train.backend}) and the final model ({size_text(final)}) need {size_text(checkpoint + final)}",
            hint="Free space there, or set output_dir to a larger file system (a full disk leaves a damaged "
            "checkpoint behind).",
        )
    if kept and free < kept * checkpoint + final:
        return [
            f"output_dir has {size_text(free)} free: room for {int((free - final) // checkpoint)} of the "
            f"{kept} checkpoints this run keeps ({size_text(checkpoint)} each); set save_total_limit or free space"
        ]
    return []
