"""Workloads: a model's units (layers or blocks) in forward order, loaded from TOML data files.

Each unit carries its parameter count, forward FLOPs per sample and the activation bytes it
keeps for backward per sample. The files are generated from real PyTorch module definitions
by `python -m measure.make_workloads` (FLOP counter on meta tensors); add your own model there.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from perfmodel.cluster import data_home
from perfmodel.errors import PerfmodelError
from perfmodel.tomlfile import Fields, load_toml

WORKLOAD_DIR = Path(__file__).resolve().parent / "data" / "workloads"
# Op class "matmul" (compute-bound, charged by FLOPs); every other non-view op is memory-bound.
# One set for the workload files (measure/make_workloads.py) and profiler traces
# (calibration/from_profiler.py).
MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "convolution", "linear", "matmul",
              "_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
              "_scaled_dot_product_cudnn_attention", "_convolution", "cudnn_convolution"}

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def user_workload_dir() -> Path:
    """Where `perfmodel workloads add` writes: $PERFMODEL_WORKLOADS, else
    <data home>/workloads beside the measured profiles."""
    env = os.environ.get("PERFMODEL_WORKLOADS")
    return Path(env) if env else data_home() / "workloads"


@dataclass(frozen=True, kw_only=True, slots=True)
class Precision:
    """Bytes per parameter or element of each part, as the torch 2.13 recipe keeps them.

    - fp32 / tf32: everything 4 bytes.
    - bf16-mixed / fp16-mixed: `torch.autocast` (DDP, PS) keeps fp32 parameters, gradients
      and DDP buckets, all-reduces 4 bytes a parameter and caches the 2-byte weight copies
      it makes during the step; FSDP2 MixedPrecisionPolicy(param_dtype=bf16,
      reduce_dtype=fp32) keeps fp32 sharded parameters and gradients, all-gathers 2 bytes
      and reduce-scatters 4 (the project's own FSDP run reduces in fp32).
    - bf16 ("pure", Megatron-style): bf16 parameters and gradients, fp32 master weights in
      the optimizer, 2-byte all-reduce.
    """

    param_bytes: int        # the stored parameters (the optimizer updates these, or master)
    grad_bytes: int         # .grad and DDP's bucket
    master_bytes: int       # fp32 master weights kept by pure bf16 (0 otherwise)
    compute_bytes: int      # matmul inputs, activations, FSDP's all-gathered parameters
    reduce_bytes: int       # one gradient element all-reduced / reduce-scattered
    autocast: bool          # torch.autocast (DDP, PS): bf16 weight cache during the step
    compute_key: str        # which peak in the cluster profile applies


PRECISIONS = {
    "fp32": Precision(param_bytes=4, grad_bytes=4, master_bytes=0, compute_bytes=4,
                      reduce_bytes=4, autocast=False, compute_key="fp32"),
    "tf32": Precision(param_bytes=4, grad_bytes=4, master_bytes=0, compute_bytes=4,
                      reduce_bytes=4, autocast=False, compute_key="tf32"),
    "bf16-mixed": Precision(param_bytes=4, grad_bytes=4, master_bytes=0, compute_bytes=2,
                            reduce_bytes=4, autocast=True, compute_key="bf16"),
    "fp16-mixed": Precision(param_bytes=4, grad_bytes=4, master_bytes=0, compute_bytes=2,
                            reduce_bytes=4, autocast=True, compute_key="fp16"),
    "bf16": Precision(param_bytes=2, grad_bytes=2, master_bytes=4, compute_bytes=2,
                      reduce_bytes=2, autocast=False, compute_key="bf16"),
}
CHECKPOINTING = ("none", "full", "selective")
# Optimizer state in fp32 per parameter: momentum buffer; Adam's first and second moments.
OPTIMIZER_STATE_BYTES = {"sgd": 0, "momentum": 4, "adam": 8}


@dataclass(frozen=True, kw_only=True, slots=True)
class Unit:
    name: str
    params: int
    forward_flops_per_sample: float
    activation_bytes_per_sample: float
    # Memory-bound op class: bytes read + written per sample by the forward's other kernels
    # (norms, activations, elementwise, softmax, embedding, loss), and kernels per pass.
    forward_bytes_per_sample: float = 0.0
    forward_kernels: int = 0
    # Memory (measure/make_workloads.py): the unit's output (what checkpointing keeps of the
    # next unit; an LM head's logits), and the saved and output bytes again under autocast
    # with fp32 parameters, with the bf16 weight copies autocast makes in the unit.
    output_bytes_per_sample: float = 0.0
    autocast_activation_bytes_per_sample: float = 0.0
    autocast_output_bytes_per_sample: float = 0.0
    autocast_weight_cache_bytes: int = 0
    # Dropout's 1-byte bool masks saved for backward (native_dropout, as on a GPU), the same
    # at every precision, so kept out of the activation bytes that scale with it.
    dropout_mask_bytes_per_sample: float = 0.0
    # Parameter counts of the unit's tensors in `unit.parameters()` order (summing to
    # `params`): DDP fills its gradient buckets with whole tensors (perfmodel/sim/ddp.py).
    # Empty where unknown (a hand-written workload): the model then splits the unit pro rata.
    tensor_params: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    name: str
    description: str
    generated_by: str
    precision: str
    optimizer: str
    batch_size: int                 # default per-worker batch
    units: tuple[Unit, ...]
    path: Path
    activation_element_bytes: int = 2   # element size the bytes were counted at
    activation_checkpointing: str = "none"   # none | full | selective (checkpointed())
    # the accuracy model that applies (perfmodel/accuracy/lookup.py): a model name or a path;
    # "" = the one named like the workload, if any
    accuracy_model: str = ""

    def with_precision(self, precision: str) -> Workload:
        """This workload trained at another precision (perfmodel's --precision)."""
        if precision not in PRECISIONS:
            raise PerfmodelError(f"unknown precision '{precision}'; choose from "
                                 f"{', '.join(PRECISIONS)}")
        return replace(self, precision=precision)

    def with_checkpointing(self, mode: str) -> Workload:
        """This workload with activation checkpointing (perfmodel's --activation-checkpointing)."""
        if mode not in CHECKPOINTING:
            raise PerfmodelError(f"unknown activation checkpointing '{mode}'; choose from "
                                 f"{', '.join(CHECKPOINTING)}")
        return replace(self, activation_checkpointing=mode)

    def checkpointed(self, index: int) -> bool:
        """Whether unit `index` runs under activation checkpointing. The first and last units
        (embeddings or stem, head with the loss) never do; `full` checkpoints every unit
        between them, `selective` every other one (0th, 2nd, ...: torchtitan's selective
        layer checkpointing at frequency 2, about half the memory and half the recompute)."""
        if self.activation_checkpointing == "none" or not 0 < index < len(self.units) - 1:
            return False
        return self.activation_checkpointing == "full" or (index - 1) % 2 == 0

    @property
    def element_bytes(self) -> int:
        """Bytes per activation element at this precision: 4 for fp32/tf32, else 2."""
        return 4 if self.precision in ("fp32", "tf32") else 2

    @property
    def precision_spec(self) -> Precision:
        return PRECISIONS[self.precision]

    @property
    def params(self) -> int:
        return sum(u.params for u in self.units)

    @property
    def param_bytes(self) -> int:
        """Bytes of the stored parameters (what a checkpoint or a broadcast moves)."""
        return self.params * self.precision_spec.param_bytes

    @property
    def model_state_bytes_per_param(self) -> int:
        """16 for Adam at every precision: autocast 4 + 4 + 8, pure bf16 2 + 2 + 4 + 8."""
        p = self.precision_spec
        return p.param_bytes + p.grad_bytes + p.master_bytes + OPTIMIZER_STATE_BYTES[self.optimizer]

    @property
    def forward_flops_per_sample(self) -> float:
        return sum(u.forward_flops_per_sample for u in self.units)


def parse_workload(data: dict, path: Path) -> Workload:
    f = Fields(data, path)
    precision, optimizer = f.str("precision"), f.str("optimizer")
    if precision not in PRECISIONS:
        raise PerfmodelError(f"{path}: precision '{precision}' is not one of "
                             f"{', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise PerfmodelError(f"{path}: optimizer '{optimizer}' is not one of "
                             f"{', '.join(OPTIMIZER_STATE_BYTES)}")
    raw_units = data.get("units")
    if not isinstance(raw_units, list) or not raw_units:
        raise PerfmodelError(f"{path}: needs at least one [[units]] table")
    units = []
    for i, raw in enumerate(raw_units):
        if not isinstance(raw, dict):
            raise PerfmodelError(f"{path}: units[{i}] is not a table")
        u = Fields(raw, path, f"units[{i}].")
        units.append(Unit(
            name=u.str("name"),
            params=u.integer("params"),
            forward_flops_per_sample=u.number("forward_flops_per_sample"),
            activation_bytes_per_sample=u.number("activation_bytes_per_sample"),
            forward_bytes_per_sample=u.number("forward_bytes_per_sample", 0.0),
            forward_kernels=u.integer("forward_kernels", 0),
            output_bytes_per_sample=u.number("output_bytes_per_sample", 0.0),
            autocast_activation_bytes_per_sample=u.number(
                "autocast_activation_bytes_per_sample", 0.0),
            autocast_output_bytes_per_sample=u.number("autocast_output_bytes_per_sample", 0.0),
            autocast_weight_cache_bytes=u.integer("autocast_weight_cache_bytes", 0),
            dropout_mask_bytes_per_sample=u.number("dropout_mask_bytes_per_sample", 0.0),
            tensor_params=_tensor_params(u),
        ))
    return Workload(
        name=f.str("name"),
        description=f.str("description"),
        generated_by=f.str("generated_by"),
        precision=precision,
        optimizer=optimizer,
        batch_size=f.integer("batch_size", minimum=1),
        units=tuple(units),
        path=path,
        activation_element_bytes=f.integer("activation_element_bytes",
                                           4 if precision == "fp32" else 2, minimum=1),
        accuracy_model=f.str("accuracy_model") if f.has("accuracy_model") else "",
    )


def _tensor_params(u: Fields) -> tuple[int, ...]:
    """A unit's optional `tensor_params`: non-negative integers that add up to its params."""
    if not u.has("tensor_params"):
        return ()
    value = u.data["tensor_params"]
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise PerfmodelError(f"{u.path}: field '{u.prefix}tensor_params' must be a list of "
                             "parameter counts (integers >= 0)")
    if sum(value) != u.data.get("params"):
        raise PerfmodelError(f"{u.path}: field '{u.prefix}tensor_params' adds up to "
                             f"{sum(value)}, not the unit's params ({u.data.get('params')})")
    return tuple(value)


def workload_paths() -> dict[str, Path]:
    """Every workload by name; the user's (`perfmodel workloads add`) shadow shipped ones."""
    found = {p.stem: p for p in sorted(WORKLOAD_DIR.glob("*.toml"))}
    user = user_workload_dir()
    if user.is_dir():
        found.update({p.stem: p for p in sorted(user.glob("*.toml"))})
    return found


def write_user_workload(name: str, text: str, *, force: bool = False) -> Path:
    """Check `text` parses as a workload named `name`, then write it atomically to the user
    workload folder; an existing workload of that name is refused unless `force`."""
    if not NAME.fullmatch(name):
        raise PerfmodelError(f"workload name '{name}' must be letters, digits, '_', '-' or '.' "
                             f"(it becomes the file name)")
    folder = user_workload_dir()
    target = folder / f"{name}.toml"
    existing = workload_paths().get(name)
    if existing is not None and not force:
        raise PerfmodelError(f"a workload '{name}' exists ({existing}); choose another name or "
                             f"pass --force to write over (or shadow) it")
    parse_workload(tomllib.loads(text), target)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        import tempfile  # here: with shutil, bz2 and lzma ~8 ms, which every predict paid

        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as e:
        raise PerfmodelError(f"cannot write {target}: {e.strerror or e}") from None
    return target


def load_workload(name_or_path: str) -> Workload:
    """A workload by name (the user's shadow shipped ones), or any workload file by path."""
    paths = workload_paths()
    if name_or_path in paths:
        path = paths[name_or_path]
    elif name_or_path.endswith(".toml"):
        path = Path(name_or_path)
    else:
        raise PerfmodelError(
            f"unknown workload '{name_or_path}'; choose from: {', '.join(sorted(paths))} "
            f"(or give a path to a .toml workload file)")
    return parse_workload(load_toml(path), path)
