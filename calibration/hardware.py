"""What devices this machine has, and which cluster profile a calibration here may write.

Found without importing torch (a refusal must be instant): GPUs from `nvidia-smi
--query-gpu=name,memory.total --format=csv,noheader,nounits` (the query NVIDIA documents for
scripts), else from /proc/driver/nvidia/gpus/*/information (the driver's own listing); CPU
model from /proc/cpuinfo; torch's version from its package metadata.

Honesty rule (issue 4): a shipped GPU profile (a100, a10g) describes one GPU model; it may be
replaced by measurements only on that GPU. `local` and new names calibrate whatever is here:
on a CPU host they build on the shipped `local` profile, on a GPU host on the shipped GPU
profile of the same model, else on the one whose memory is closest (and say so).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from perfmodel.cluster import SHIPPED_PROFILES, ClusterProfile, parse_profile
from perfmodel.errors import PerfmodelError
from perfmodel.tomlfile import load_toml

CPU_PROFILE = "local"            # the shipped profile of a CPU host
NVIDIA_SMI_TIMEOUT_S = 10.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Gpu:
    name: str                    # e.g. "NVIDIA A10G"
    memory_GiB: float | None     # None when the driver listing does not say


@dataclass(frozen=True, kw_only=True, slots=True)
class Hardware:
    host: str
    cpu: str                     # CPU model name
    cores: int
    gpus: tuple[Gpu, ...]

    @property
    def kind(self) -> str:
        """"cuda" with GPUs, else "cpu": what the measurement workers will run on."""
        return "cuda" if self.gpus else "cpu"

    def describe(self) -> str:
        """e.g. "1x NVIDIA H100 80GB HBM3" or "no CUDA device (2 cores of AMD EPYC)"."""
        if not self.gpus:
            return f"no CUDA device ({self.cores} cores of {self.cpu})"
        counts = Counter(g.name for g in self.gpus)
        return ", ".join(f"{n}x {name}" for name, n in counts.items())

    def device_names(self) -> tuple[str, ...]:
        if self.gpus:
            return tuple(g.name for g in self.gpus)
        return (f"CPU core ({self.cpu})",)


def detect() -> Hardware:
    return Hardware(host=socket.gethostname(), cpu=_cpu_model(), cores=os.cpu_count() or 1,
                    gpus=_nvidia_smi() or _driver_listing())


def torch_version() -> str | None:
    """The installed torch's version, without importing it; None if torch is missing."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _nvidia_smi() -> tuple[Gpu, ...]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run([exe, "--query-gpu=name,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return ()
    if out.returncode != 0:
        return ()
    gpus = []
    for line in out.stdout.splitlines():
        name, _, mem = line.rpartition(",")
        try:
            gpus.append(Gpu(name=name.strip(), memory_GiB=float(mem) / 1024))   # MiB
        except ValueError:
            if line.strip():
                gpus.append(Gpu(name=line.strip(), memory_GiB=None))
    return tuple(gpus)


def _driver_listing() -> tuple[Gpu, ...]:
    gpus = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            text = info.read_text()
        except OSError:
            continue
        model = re.search(r"^Model:\s*(.+)$", text, re.MULTILINE)
        gpus.append(Gpu(name=model.group(1).strip() if model else "NVIDIA GPU",
                        memory_GiB=None))
    return tuple(gpus)


# ---------------------------------------------------------------- which profile to build on


def shipped_profile(name: str) -> ClusterProfile:
    """A profile shipped in perfmodel/data/profiles/, ignoring any user profile of that name."""
    path = SHIPPED_PROFILES / f"{name}.toml"
    return parse_profile(load_toml(path), path)


def shipped_gpu_profiles() -> dict[str, ClusterProfile]:
    names = sorted(p.stem for p in SHIPPED_PROFILES.glob("*.toml") if p.stem != CPU_PROFILE)
    return {n: shipped_profile(n) for n in names}


def model_token(device_name: str) -> str:
    """The GPU model in a device name: "NVIDIA A100-SXM4-40GB" -> "A100"."""
    words = [w for w in re.split(r"[\s_]+", device_name.upper()) if w not in ("NVIDIA", "")]
    return words[0].split("-")[0] if words else ""


def _matches(gpu: Gpu, profile: ClusterProfile) -> bool:
    want = model_token(profile.device.name)
    return bool(want) and model_token(gpu.name) == want


@dataclass(frozen=True, kw_only=True, slots=True)
class BaseChoice:
    base: str                    # shipped profile whose unmeasured fields the new one keeps
    reason: str                  # one sentence saying why, shown to the user


def choose_base(cluster: str, hw: Hardware) -> BaseChoice:
    """The shipped profile a calibration of `cluster` on `hw` builds on, or a refusal.

    Raises PerfmodelError when `cluster` names a shipped GPU profile whose GPU is not here.
    """
    gpu_profiles = shipped_gpu_profiles()
    if cluster in gpu_profiles:
        profile = gpu_profiles[cluster]
        if hw.gpus and all(_matches(g, profile) for g in hw.gpus):
            return BaseChoice(base=cluster, reason=f"found {hw.describe()}, the GPU the "
                              f"'{cluster}' profile describes")
        raise PerfmodelError(
            f"cannot calibrate '{cluster}' here: found {hw.describe()}, not the "
            f"{profile.device.name} it describes; run `perfmodel calibrate --cluster {cluster}` on "
            f"that cluster (add --nnodes/--node-rank/--rdzv-endpoint for several nodes), keep "
            f"the shipped spec-derived profile, or calibrate this machine under another name "
            f"(--cluster local)")
    if not hw.gpus:
        return BaseChoice(base=CPU_PROFILE, reason=f"found {hw.describe()}; unmeasured fields "
                          f"come from the shipped '{CPU_PROFILE}' profile")
    same = [n for n, p in gpu_profiles.items() if all(_matches(g, p) for g in hw.gpus)]
    if same:
        return BaseChoice(base=same[0], reason=f"found {hw.describe()}; unmeasured fields "
                          f"come from the shipped '{same[0]}' profile of the same GPU")
    memory = [g.memory_GiB for g in hw.gpus if g.memory_GiB]
    if not gpu_profiles:
        raise PerfmodelError(f"found {hw.describe()} but no shipped GPU profile to build on")
    if memory:
        target = sum(memory) / len(memory)
        base = min(gpu_profiles, key=lambda n: abs(gpu_profiles[n].device.memory_GiB - target))
        why = "the closest in memory"
    else:
        base, why = sorted(gpu_profiles)[0], "memory unknown, the first"
    return BaseChoice(base=base, reason=(
        f"found {hw.describe()}, which no shipped profile describes; unmeasured fields (peak "
        f"TFLOPS, memory, topology) come from '{base}' ({why} of the shipped GPU profiles): "
        f"check them in the written profile"))
