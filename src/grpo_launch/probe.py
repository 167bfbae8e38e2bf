"""Read this machine: NVML and ``CUDA_VISIBLE_DEVICES`` → :class:`Topology`, and the model's shape from a local
``config.json`` or the built-in table. (Slurm allocations and hostfiles are read by their backends.)

This is the I/O edge of planning. Parsers are pure functions; the environment is passed in as a mapping.
NVML missing or failing is a warning and a fallback, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_launch.catalog import ModelShape, find_model_shape
from grpo_launch.errors import ProbeError, is_decimal
from grpo_launch.modelconfig import shape_from_config
from grpo_launch.topology import Gpu, Host, Topology

_UUID = re.compile(r"^GPU-[0-9a-fA-F]{2,}(-[0-9a-fA-F]+)*$")
_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+/\d+/\d+|[0-9a-fA-F]{2,}(-[0-9a-fA-F]+)*)$")
CVD_HELP = (
    "CUDA_VISIBLE_DEVICES takes comma-separated GPU indices (0,1,2), GPU-UUIDs or MIG ids, each once; "
    "unset it to use every GPU, or set it to '' for none."
)


def parse_cuda_visible_devices(value: str | None) -> tuple[str, ...] | None:
    """The tokens of ``CUDA_VISIBLE_DEVICES``; None when unset (all GPUs), () when it hides every GPU."""
    if value is None:
        return None
    text = value.strip()
    if text in ("", "-1", "NoDevFiles", "none"):
        return ()
    tokens = tuple(t.strip() for t in text.split(","))
    seen: set[str] = set()
    for t in tokens:
        ok = (is_decimal(t) and len(t) < 6) or _UUID.match(t) or _MIG.match(t)
        if not ok:
            raise ProbeError(f"CUDA_VISIBLE_DEVICES={value!r}: cannot read {t!r}", hint=CVD_HELP)
        if t in seen:
            raise ProbeError(f"CUDA_VISIBLE_DEVICES={value!r}: {t!r} appears twice", hint=CVD_HELP)
        seen.add(t)
    return tokens


@dataclass(frozen=True)
class NvmlDevice:
    index: int
    name: str
    memory_bytes: int
    uuid: str
    mig: tuple[tuple[str, int], ...] = ()  # (MIG uuid, memory bytes) when MIG mode is on


def read_nvml() -> list[NvmlDevice]:
    """Every GPU NVML sees, in NVML (PCI bus) order. Raises whatever pynvml raises; callers fall back."""
    import pynvml

    pynvml.nvmlInit()
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            mem = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            migs: list[tuple[str, int]] = []
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(h)
            except pynvml.NVMLError:
                current = 0
            if current:
                for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    except pynvml.NVMLError:
                        continue
                    muuid = pynvml.nvmlDeviceGetUUID(mh)
                    muuid = muuid.decode() if isinstance(muuid, bytes) else muuid
                    migs.append((muuid, int(pynvml.nvmlDeviceGetMemoryInfo(mh).total)))
            devices.append(NvmlDevice(i, name, mem, uuid, tuple(migs)))
        return devices
    finally:
        pynvml.nvmlShutdown()


def _nvml_or_warning(read: Callable[[], list[NvmlDevice]]) -> tuple[list[NvmlDevice] | None, str | None]:
    try:
        return read(), None
    except ImportError:
        return None, "nvidia-ml-py is not installed: cannot read GPU names and memory"
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, …: a machine without an NVIDIA driver
        return None, f"NVML unavailable ({type(exc).__name__}: {exc})"


def _local_gpus(devices: Sequence[NvmlDevice], tokens: Sequence[str] | None, raw: str | None) -> tuple[Gpu, ...]:
    def as_gpus(d: NvmlDevice, token: str) -> list[Gpu]:
        if d.mig:
            # A MIG-enabled GPU is addressed through its instances; list each as its own device.
            return [Gpu(visible_id=u, name=f"{d.name} MIG", memory_bytes=m, uuid=u) for u, m in d.mig]
        return [Gpu(visible_id=token, name=d.name, memory_bytes=d.memory_bytes, uuid=d.uuid)]

    if tokens is None:
        return tuple(g for d in devices for g in as_gpus(d, str(d.index)))
    out: list[Gpu] = []
    for t in tokens:
        if is_decimal(t):
            idx = int(t)
            if idx >= len(devices):
                raise ProbeError(
                    f"CUDA_VISIBLE_DEVICES={raw!r} names GPU {idx}, but this machine has {len(devices)} GPU(s)",
                    hint=CVD_HELP,
                )
            out += as_gpus(devices[idx], t)
        elif t.startswith("GPU-"):
            match = [d for d in devices if d.uuid.startswith(t)]
            if len(match) != 1:
                raise ProbeError(f"CUDA_VISIBLE_DEVICES={raw!r}: no single GPU has UUID {t!r}", hint=CVD_HELP)
            out += as_gpus(match[0], t)
        else:
            migs = [(d, u, m) for d in devices for u, m in d.mig if u == t or u.startswith(t)]
            if len(migs) != 1:
                raise ProbeError(f"CUDA_VISIBLE_DEVICES={raw!r}: no MIG device {t!r}", hint=CVD_HELP)
            d, u, m = migs[0]
            out.append(Gpu(visible_id=t, name=f"{d.name} MIG", memory_bytes=m, uuid=u))
    return tuple(out)


def probe_local(
    environ: Mapping[str, str], *, read: Callable[[], list[NvmlDevice]] = read_nvml, hostname: str | None = None
) -> Topology:
    """This machine's GPUs as the processes started from here would see them."""
    import socket

    name = hostname or socket.gethostname()
    cpus = os.cpu_count()
    ram = host_memory_bytes()
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    tokens = parse_cuda_visible_devices(raw)
    if tokens == ():
        return Topology(hosts=(Host(name=name, cpus=cpus, memory_bytes=ram),), source="cuda_visible_devices")
    devices, warning = _nvml_or_warning(read)
    if devices is None:
        if tokens:
            gpus = tuple(Gpu(visible_id=t) for t in tokens)
            warn = f"{warning}; using CUDA_VISIBLE_DEVICES={raw} with unknown GPU model and memory"
            return Topology((Host(name=name, gpus=gpus, cpus=cpus, memory_bytes=ram),), "cuda_visible_devices", (warn,))
        warn = f"{warning}; planning for CPU (use --gpus to plan for GPUs, e.g. --gpus 8xH100-80GB)"
        return Topology((Host(name=name, cpus=cpus, memory_bytes=ram),), "cpu", (warn,))
    gpus = _local_gpus(devices, tokens, raw)
    source = "nvml" if tokens is None else "nvml+cuda_visible_devices"
    return Topology((Host(name=name, gpus=gpus, cpus=cpus, memory_bytes=ram),), source if gpus else "cpu")


def parse_meminfo(text: str) -> int | None:
    """MemTotal of ``/proc/meminfo`` in bytes, or None."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "MemTotal:" and parts[1].isascii() and parts[1].isdigit():
            return int(parts[1]) * 1024
    return None


def host_memory_bytes(path: str = "/proc/meminfo") -> int | None:
    """This machine's RAM, or None where /proc/meminfo cannot be read."""
    try:
        return parse_meminfo(Path(path).read_text())
    except OSError:
        return None


def local_gpu_model(local: Topology | None) -> tuple[str, int | None]:
    """This node's GPU name and memory, assumed for every node of a Slurm job or hostfile."""
    gpus = local.hosts[0].gpus if local and local.hosts else ()
    return (gpus[0].name, gpus[0].memory_bytes) if gpus else ("unknown", None)


# Run on every host of a hostfile (over ssh) and every node of a Slurm allocation (one srun step each), with that
# host's grpo-launch: what the host has, as probe_local reads it there (NVML, CUDA_VISIBLE_DEVICES, /proc/meminfo).
HOST_REPORT_CODE = (
    "import json, os\n"
    "from grpo_launch.probe import probe_local\n"
    "h = probe_local(dict(os.environ)).hosts[0]\n"
    "print(json.dumps({'node': os.environ.get('SLURMD_NODENAME') or h.name, 'cpus': os.cpu_count(),\n"
    "                  'memory_bytes': h.memory_bytes, 'gpus': [[g.name, g.memory_bytes] for g in h.gpus]}))\n"
)


def collect_reports(
    names: Sequence[str],
    argv_of: Callable[[str], list[str]],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> tuple[dict[str, dict], list[str]]:
    """Run ``argv_of(name)`` (a command printing HOST_REPORT_CODE's JSON last) for every name in parallel:
    ({name: report}, [why each other name gave none]). A command past ``timeout_s`` gets SIGTERM (srun passes it to
    its step), then SIGKILL."""
    import concurrent.futures
    import subprocess

    def one(name: str) -> tuple[str, dict | str]:
        try:
            proc = subprocess.Popen(argv_of(name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    stdin=subprocess.DEVNULL, env=dict(env) if env is not None else None)  # fmt: skip
        except OSError as exc:
            return name, f"{name}: cannot start {argv_of(name)[0]} ({exc.strerror or exc})"
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            return name, f"{name}: no report within {timeout_s:.0f} s"
        try:
            report = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return name, f"{name}: {(err.strip().splitlines() or ['no answer'])[-1][:160]}"
        return name, report if isinstance(report, dict) else f"{name}: no report"

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(names) or 1)) as pool:
        results = dict(pool.map(one, list(names)))
    return {n: r for n, r in results.items() if isinstance(r, dict)}, [
        r for r in results.values() if isinstance(r, str)
    ]


def reported_gpus(report: Mapping[str, Any], count: int) -> tuple[Gpu, ...]:
    """The first ``count`` GPUs of a host's report (HOST_REPORT_CODE's ``gpus``: [name, memory bytes] pairs)."""
    return tuple(
        Gpu(visible_id=str(i), name=str(g[0]), memory_bytes=g[1] if isinstance(g[1], int) else None)
        for i, g in enumerate((report.get("gpus") or [])[:count])
    )


def mixed_models_warning(models: Mapping[str, str]) -> tuple[str, ...]:
    """A warning when hosts (name → GPU model) differ: the planner sizes for the smallest GPU memory and times
    steps on the slowest GPU."""
    if len(set(models.values())) < 2:
        return ()
    listed = ", ".join(f"{h}: {m}" for h, m in list(models.items())[:6])
    return (f"the hosts' GPU models differ ({listed}): planned for the smallest GPU memory and the slowest GPU",)


def count_rows(dataset: str, workdir: str) -> int | None:
    """Rows of a local JSON Lines or CSV training file (for the time to train), without loading it; None for
    anything else (a hub dataset: set launch.dataset_rows)."""
    path = Path(workdir) / Path(dataset).expanduser() if dataset else None
    if path is None or path.suffix not in (".jsonl", ".csv") or not path.is_file():
        return None
    try:
        with path.open("rb") as f:
            lines = sum(1 for line in f if line.strip())
    except OSError:
        return None
    return max(0, lines - (1 if path.suffix == ".csv" else 0)) or None


def looks_local(path: str) -> bool:
    """A model or dataset value that names a local path rather than a hub id."""
    return path.startswith(("/", "./", "../", "~", ".")) or Path(path).exists()


# ------------------------------------------------------------------------------------------------ model shape


def cached_config(model: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """A hub model's config.json in the local Hugging Face cache (``HF_HUB_CACHE``, ``HF_HOME/hub`` or
    ~/.cache/huggingface/hub), the snapshot ``refs/main`` points at, else the newest; never downloads."""
    env = os.environ if environ is None else environ
    if model.count("/") != 1 or model.startswith(("/", ".")):
        return None
    home = env.get("HF_HOME") or str(Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface")
    repo = Path(env.get("HF_HUB_CACHE") or Path(home) / "hub") / ("models--" + model.replace("/", "--"))
    try:
        ref = (repo / "refs" / "main").read_text().strip()
        candidates = [repo / "snapshots" / ref / "config.json"]
    except OSError:
        candidates = sorted((repo / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime)[::-1]
    return next((c for c in candidates if c.is_file()), None)


def resolve_model_shape(
    model: str | None, environ: Mapping[str, str] | None = None
) -> tuple[ModelShape | None, str | None]:
    """The model's shape from a local ``config.json`` (a directory, or the hub cache's copy) or the built-in table;
    (None, warning) if unknown."""
    if not model:
        return None, "no model_name_or_path in the recipe"
    config = Path(model) / "config.json"
    if not config.is_file():
        config = cached_config(model, environ) or config
    if config.is_file():
        try:
            return shape_from_config(model, json.loads(config.read_text())), None
        except (ValueError, KeyError, TypeError) as exc:
            return None, f"cannot read model shape from {config}: {exc!r}"
    shape = find_model_shape(model)
    if shape:
        return shape, None
    return None, (
        f"model {model!r} is not in the built-in table and has no local config.json: "
        "tensor-parallel size and memory are not checked"
    )


# ------------------------------------------------------------------------------------------------ vLLM version

# Defines vllm_version(): the vLLM version an interpreter would import, without importing vLLM (seconds): its
# _version.py, read. Run here, in a trainer's Python, and on every ssh host.
VLLM_VERSION_FUNCTION = """\
def vllm_version():
    import importlib.util, pathlib
    spec = importlib.util.find_spec('vllm')
    text = ''
    if spec and spec.origin:
        f = pathlib.Path(spec.origin).with_name('_version.py')
        text = f.read_text() if f.is_file() else ''
    for line in text.splitlines():
        if line.startswith('__version__') and '=' in line:
            return line.split('=')[-1].strip().strip(chr(34) + chr(39))
    return 'unknown' if spec else 'missing'
"""
VLLM_VERSION_CODE = VLLM_VERSION_FUNCTION + "print(vllm_version())\n"


def vllm_version_here() -> str | None:
    """The vLLM version this interpreter would import, or None (not installed or unreadable)."""
    scope: dict[str, Any] = {}
    exec(VLLM_VERSION_FUNCTION, scope)
    found = str(scope["vllm_version"]())
    return None if found in ("missing", "unknown") else found


def vllm_version_of(python: str) -> str:
    """The vLLM version ``python`` would import: a version, "missing", "unknown", or "error: …"."""
    import subprocess

    try:
        done = subprocess.run([python, "-c", VLLM_VERSION_CODE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"error: {exc}"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return f"error: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"
    return lines[-1]


def interpreter_of(command: str) -> str | None:
    """The Python that runs ``command`` (a python itself, or a console script's shebang), or None."""
    import shutil

    path = command if "/" in command else shutil.which(command)
    if not path:
        return None
    if Path(path).name.startswith("python"):
        return path
    try:
        head = Path(path).read_bytes()[:1024].decode(errors="replace").splitlines()
    except OSError:
        return None
    first = head[0] if head else ""
    launcher = "'''exec' "
    if first == "#!/bin/sh" and len(head) > 1 and head[1].startswith(launcher):
        # pip's launcher when the interpreter's path is too long for a shebang: '''exec' /path/python "$0" "$@"
        import shlex

        words = shlex.split(head[1][len(launcher) :])
        return words[0] if words else None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if parts and Path(parts[0]).name == "env" and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0] if parts and "python" in Path(parts[0]).name else None
