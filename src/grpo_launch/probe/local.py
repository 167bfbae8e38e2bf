"""This machine as the processes started here see it: NVML and ``CUDA_VISIBLE_DEVICES`` into a :class:`Topology`,
and the host's RAM. Parsers are pure; the environment is passed in. NVML missing or failing is a warning and a
fallback, never a traceback."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from grpo_launch.errors import ProbeError, is_decimal
from grpo_launch.machines.topology import Gpu, Host, Topology
from grpo_launch.spec import frozen

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


@frozen
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


def read_amdsmi() -> list[NvmlDevice]:
    """Every AMD GPU amdsmi sees (ROCm's management library, as vLLM's ROCm platform reads it: the ASIC's market
    name, total VRAM, UUID), in amdsmi order. Raises whatever amdsmi raises; callers fall back."""
    import amdsmi

    amdsmi.amdsmi_init()
    try:
        devices = []
        for i, h in enumerate(amdsmi.amdsmi_get_processor_handles()):
            name = str(amdsmi.amdsmi_get_gpu_asic_info(h).get("market_name") or "AMD GPU")
            mem = int(amdsmi.amdsmi_get_gpu_memory_total(h, amdsmi.AmdSmiMemoryType.VRAM))
            devices.append(NvmlDevice(i, name, mem, str(amdsmi.amdsmi_get_gpu_device_uuid(h))))
        return devices
    finally:
        amdsmi.amdsmi_shut_down()


def _nvml_or_warning(read: Callable[[], list[NvmlDevice]]) -> tuple[list[NvmlDevice] | None, str | None]:
    try:
        return read(), None
    except ImportError:
        return None, "nvidia-ml-py is not installed: cannot read GPU names and memory"
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, …: a machine without an NVIDIA driver
        return None, f"NVML unavailable ({type(exc).__name__}: {exc})"


def _amdsmi_or_none(read: Callable[[], list[NvmlDevice]]) -> list[NvmlDevice] | None:
    """AMD GPUs where NVML found no NVIDIA driver; None without amdsmi, an AMD driver or a GPU."""
    try:
        return read() or None
    except Exception:  # ImportError (no amdsmi), AmdSmiLibraryException (no driver), …
        return None


def visible_devices(environ: Mapping[str, str]) -> tuple[str, str | None]:
    """The variable that decides which GPUs a process sees, and its value. On ROCm torch prefers
    HIP_VISIBLE_DEVICES to CUDA_VISIBLE_DEVICES (torch.cuda._parse_visible_devices), and vLLM refuses the two when
    they differ (vllm/platforms/rocm.py): so does the probe."""
    hip, cuda = environ.get("HIP_VISIBLE_DEVICES") or None, environ.get("CUDA_VISIBLE_DEVICES")
    if hip is not None and cuda and hip != cuda:
        raise ProbeError(
            f"HIP_VISIBLE_DEVICES={hip!r} and CUDA_VISIBLE_DEVICES={cuda!r} differ: torch would use the first, "
            "and vLLM refuses to start",
            hint="Set only one of them, or the same list in both.",
        )
    return ("HIP_VISIBLE_DEVICES", hip) if hip is not None else ("CUDA_VISIBLE_DEVICES", cuda)


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
    environ: Mapping[str, str],
    *,
    read: Callable[[], list[NvmlDevice]] = read_nvml,
    read_amd: Callable[[], list[NvmlDevice]] = read_amdsmi,
    hostname: str | None = None,
) -> Topology:
    """This machine's GPUs as the processes started from here would see them: NVIDIA's through NVML, else AMD's
    through amdsmi."""
    name = hostname or socket.gethostname()
    cpus = os.cpu_count()
    ram = host_memory_bytes()
    _, raw = visible_devices(environ)
    tokens = parse_cuda_visible_devices(raw)
    if tokens == ():
        return Topology(hosts=(Host(name=name, cpus=cpus, memory_bytes=ram),), source="cuda_visible_devices")
    devices, warning = _nvml_or_warning(read)
    if devices is None and (amd := _amdsmi_or_none(read_amd)):
        gpus = _local_gpus(amd, tokens, raw)
        return Topology((Host(name=name, gpus=gpus, cpus=cpus, memory_bytes=ram),), "amdsmi" if gpus else "cpu")
    if devices is None:
        if tokens:
            gpus = tuple(Gpu(visible_id=t) for t in tokens)
            warn = f"{warning}; using CUDA_VISIBLE_DEVICES={raw} with unknown GPU model and memory"
            return Topology((Host(name=name, gpus=gpus, cpus=cpus, memory_bytes=ram),), "cuda_visible_devices", (warn,))
        warn = f"{warning}; planning for CPU (to plan for GPUs from here: grpo-launch plan RECIPE --gpus 8xH100-80GB)"
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


def port_free(port: int, host: str = "0.0.0.0") -> bool:
    """Whether a process here could listen on ``port`` (the server's, the rendezvous', the weight sync's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
