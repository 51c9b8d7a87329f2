"""Turn the models of measure/models.py into the workload TOML files perfmodel reads.

    python -m measure.make_workloads [NAME ...] [--out DIR]

Writes one `<name>.toml` per model (default: all models, into perfmodel/data/workloads/).
Nothing is materialised: the model is built on the meta device and run once under
`FakeTensorMode`, so GPT-2 XL's 1.5B parameters cost no memory. Per unit it records:

- `params`: the exact parameter count of the unit (a tied weight belongs to one unit only);
  `tensor_params`: the same per parameter tensor, in `unit.parameters()` order (DDP fills
  its gradient buckets with whole tensors).
- `forward_flops_per_sample`: `torch.utils.flop_counter.FlopCounterMode` for one forward at
  the model's default batch, divided by the batch. The counter charges 2 FLOPs per
  multiply-add and counts only matrix products (mm, addmm, bmm, convolution, attention);
  normalisation, activations, pooling and elementwise ops are free. Attention is charged
  for the full s x s score matrix even when causal, as FlopCounterMode does for GPU kernels.
- `activation_bytes_per_sample`: bytes of the tensors autograd saves for backward during the
  unit's forward (`torch.autograd.graph.saved_tensors_hooks`), divided by the batch.
  Parameters and buffers are not activations and are skipped; a storage saved several times
  (a tensor and its views, a block output saved again as the next unit's input) is counted
  once, in the first unit that saves it; its bytes are the whole storage. bf16-mixed runs with
  bf16 parameters and inputs, as FSDP's MixedPrecisionPolicy(param_dtype=bfloat16) computes,
  so saved activations are 2 bytes per element (LayerNorm's mean and rstd stay fp32).
  What the loss saves (GPT-2's fp32 log-softmax over the vocabulary) is charged to the last
  unit, which computes it in practice.

Same command, same torch version -> byte-identical files.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from measure.models import MODELS, ModelSpec
from perfmodel.errors import PerfmodelError
from perfmodel.workload import MATMUL_OPS

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "perfmodel" / "data" / "workloads"


@dataclass(frozen=True, kw_only=True)
class UnitMeasure:
    name: str
    params: int
    forward_flops_per_sample: float
    activation_bytes_per_sample: float
    forward_bytes_per_sample: float
    forward_kernels: int
    output_bytes_per_sample: float = 0.0
    autocast_activation_bytes_per_sample: float = 0.0
    autocast_output_bytes_per_sample: float = 0.0
    autocast_weight_cache_bytes: int = 0
    dropout_mask_bytes_per_sample: float = 0.0
    tensor_params: tuple[int, ...] = ()


NO_KERNEL_OPS = {"_unsafe_view", "detach", "lift_fresh"}


def _is_view(func) -> bool:
    """A view or metadata op (or a prim:: query): launches no kernel, moves no bytes."""
    name = func._schema.name
    if not name.startswith("aten::") or name[6:] in NO_KERNEL_OPS:
        return True
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                 for r in returns)


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    return 0


class OpClassCounter(TorchDispatchMode):
    """Kernels and bytes moved (every tensor argument read once, every output written once)
    of the memory-bound ops; matmul, conv and attention launch a kernel but their bytes are
    left to the FLOP term."""

    def __init__(self):
        super().__init__()
        self.bytes = 0
        self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if _is_view(func):
            return out
        self.kernels += 1
        name = func._schema.name.split("::")[-1]
        if name == "embedding":        # a gather: reads the rows it writes, not the table
            self.bytes += 2 * _nbytes(out)
        elif name not in MATMUL_OPS:
            self.bytes += _nbytes(list(args)) + _nbytes(list(kwargs.values())) + _nbytes(out)
        return out


class WeightCasts(TorchDispatchMode):
    """Storages made by casting a parameter (autocast's bf16 weight copies): counted as the
    autocast weight cache (2 bytes a parameter), not as activations."""

    def __init__(self, param_keys: set[int]):
        super().__init__()
        self.param_keys, self.keys = param_keys, set()
        self.bytes: dict[str, int] = {}       # unit -> bytes of the casts made in it
        self.unit = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (func._schema.name == "aten::_to_copy" and isinstance(args[0], torch.Tensor)
                and _storage_key(args[0]) in self.param_keys
                and _storage_key(out) not in self.keys):
            self.keys.add(_storage_key(out))
            self.bytes[self.unit] = self.bytes.get(self.unit, 0) + _nbytes(out)
        return out


def _cpu_flash_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None,
                               **kwargs) -> int:
    """Same formula FlopCounterMode uses for the GPU flash/efficient attention kernels; torch
    2.13 registers none for the CPU flash kernel that fake CPU tensors dispatch to."""
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


CUSTOM_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_attention_flops,
}


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _materialise_fake(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Replace meta parameters and buffers by fake CPU tensors (floating ones in `dtype`);
    call inside FakeTensorMode. CPU, not meta, so attention dispatches to the fused kernel."""
    for module in model.modules():
        for name, t in [*module.named_parameters(recurse=False),
                        *module.named_buffers(recurse=False)]:
            new = torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype)
            if isinstance(t, torch.nn.Parameter):
                new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
            setattr(module, name, new)


def measure_units(spec: ModelSpec, batch_size: int | None = None) -> list[UnitMeasure]:
    """Params, forward FLOPs, saved-activation and output bytes per sample of each unit of
    `spec`: once at the spec's precision (bf16 parameters and inputs for bf16-mixed, as
    FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16) computes) and once more under
    `torch.autocast(bfloat16)` with fp32 parameters (the DDP recipe: fp32 residual stream,
    fp32 LayerNorm, bf16 matmul outputs)."""
    batch = batch_size or spec.batch_size
    dtype = torch.bfloat16 if spec.precision == "bf16-mixed" else torch.float32
    params, flops, moved, (saved, masks), out, _ = _pass(spec, batch, dtype, autocast=False)
    with torch.device("meta"):
        tensors = {name: tuple(p.numel() for p in unit.parameters())
                   for name, unit in spec.build().named_children()}
    _, _, _, (ac_saved, _), ac_out, ac_cache = _pass(spec, batch, torch.float32, autocast=True)
    return [UnitMeasure(name=name, params=n, forward_flops_per_sample=flops[name] / batch,
                        activation_bytes_per_sample=saved[name] / batch,
                        dropout_mask_bytes_per_sample=masks[name] / batch,
                        forward_bytes_per_sample=moved[name].bytes / batch,
                        forward_kernels=moved[name].kernels,
                        output_bytes_per_sample=out[name] / batch,
                        autocast_activation_bytes_per_sample=ac_saved[name] / batch,
                        autocast_output_bytes_per_sample=ac_out[name] / batch,
                        autocast_weight_cache_bytes=ac_cache[name],
                        tensor_params=tensors[name])
            for name, n in params.items()]


def _pass(spec: ModelSpec, batch: int, dtype: torch.dtype, autocast: bool):
    """One forward (and the loss) under fake tensors: per unit its params, FLOPs, op-class
    counter, saved bytes and output bytes."""
    inputs, targets = spec.example_batch(batch, torch.Generator().manual_seed(0))
    saved_by: dict[int, str] = {}          # storage -> first unit that saved it
    saved_bytes: dict[str, int] = {}
    mask_bytes: dict[str, int] = {}        # bool storages saved: dropout masks
    keep_alive: list[torch.Tensor] = []    # storages must outlive the pass for unique keys
    current = [""]

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in saved_by and key not in casts.keys:
            saved_by[key] = current[0]
            counts = mask_bytes if t.dtype == torch.bool else saved_bytes
            counts[current[0]] += t.untyped_storage().nbytes()
            keep_alive.append(t)
        return t

    flops: dict[str, int] = {}
    moved: dict[str, OpClassCounter] = {}
    out_bytes: dict[str, int] = {}
    with torch.device("meta"):
        model = spec.build().train()
    with FakeTensorMode() as mode, \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        _materialise_fake(model, dtype)
        units = list(model.named_children())
        params = {name: sum(p.numel() for p in unit.parameters()) for name, unit in units}
        total = sum(p.numel() for p in model.parameters())
        if sum(params.values()) != total:
            raise ValueError(f"{spec.name}: units hold {sum(params.values())} params but the "
                             f"model has {total}; a parameter is shared between units")
        for t in [*model.parameters(), *model.buffers()]:
            saved_by[_storage_key(t)] = "(parameter or buffer)"
        casts = WeightCasts({_storage_key(p) for p in model.parameters()})
        x = mode.from_tensor(inputs)
        if x.is_floating_point():
            x = x.to(dtype)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            for name, unit in units:
                current[0] = casts.unit = name
                saved_bytes[name] = mask_bytes[name] = 0
                moved[name] = OpClassCounter()
                with FlopCounterMode(display=False, custom_mapping=CUSTOM_FLOPS) as counter, \
                        moved[name], casts:
                    x = unit(x)
                flops[name] = counter.get_total_flops()
                out_bytes[name] = _nbytes(x)
            with moved[name]:                            # the loss runs in the last unit
                spec.loss(x, mode.from_tensor(targets))  # saves e.g. log-softmax
    return params, flops, moved, (saved_bytes, mask_bytes), out_bytes, \
        {name: casts.bytes.get(name, 0) for name in params}


def _number(value: float) -> str:
    """An exact TOML number: an integer when it is one, else Python's shortest float repr."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_workload(spec: ModelSpec, units: list[UnitMeasure], command: str | None = None
                    ) -> str:
    """The workload TOML of `spec`; `command` is what regenerates it (`generated_by`)."""
    command = command or f"python -m measure.make_workloads {spec.name}"
    lines = [
        "# GENERATED FILE: do not edit by hand. Regenerate with:",
        f"#   {command}",
        f"# Made with torch {torch.__version__} on fake tensors at batch {spec.batch_size}; "
        f"per-sample values are the batch's / {spec.batch_size}.",
        "# forward_flops_per_sample: FlopCounterMode, 2 FLOPs per multiply-add; matmul, conv and",
        "#   attention only. activation_bytes_per_sample: distinct storages autograd saves for",
        "#   backward, parameters excluded, at the model's precision; the loss's go to the last",
        "#   unit. forward_bytes_per_sample: bytes read + written by the memory-bound ops",
        "#   (all but matmul/conv/attention) at the model's precision; forward_kernels: non-view",
        "#   ops of one forward pass. output_bytes_per_sample: the unit's output (what activation",
        "#   checkpointing keeps, the LM head's logits). autocast_*: the same two counted again",
        "#   under torch.autocast(bfloat16) with fp32 parameters (the DDP recipe);",
        "#   autocast_weight_cache_bytes: the bf16 weight copies autocast makes in the unit.",
        "#   dropout_mask_bytes_per_sample (units with dropout only): the 1-byte bool masks",
        "#   native_dropout saves, at every precision; not in the activation bytes above.",
        "#   tensor_params: each parameter tensor's count, in unit.parameters() order.",
        "#   Exactly what is counted: measure/make_workloads.py.",
        f"name = {_string(spec.name)}",
        f"description = {_string(spec.description)}",
        f"generated_by = {_string(command)}",
        f"precision = {_string(spec.precision)}",
        f"optimizer = {_string(spec.optimizer)}",
        f"batch_size = {spec.batch_size}",
        f"activation_element_bytes = {4 if spec.precision == 'fp32' else 2}",
    ]
    for u in units:
        lines += [
            "",
            "[[units]]",
            f"name = {_string(u.name)}",
            f"params = {u.params}",
            f"forward_flops_per_sample = {_number(u.forward_flops_per_sample)}",
            f"activation_bytes_per_sample = {_number(u.activation_bytes_per_sample)}",
            f"forward_bytes_per_sample = {_number(u.forward_bytes_per_sample)}",
            f"forward_kernels = {u.forward_kernels}",
            f"output_bytes_per_sample = {_number(u.output_bytes_per_sample)}",
            "autocast_activation_bytes_per_sample = "
            f"{_number(u.autocast_activation_bytes_per_sample)}",
            f"autocast_output_bytes_per_sample = {_number(u.autocast_output_bytes_per_sample)}",
            f"autocast_weight_cache_bytes = {u.autocast_weight_cache_bytes}",
        ]
        if u.dropout_mask_bytes_per_sample:
            lines.append("dropout_mask_bytes_per_sample = "
                         f"{_number(u.dropout_mask_bytes_per_sample)}")
        if u.tensor_params:
            lines.append(f"tensor_params = [{', '.join(str(n) for n in u.tensor_params)}]")
    return "\n".join(lines) + "\n"


def workload_text(spec: ModelSpec, command: str | None = None) -> str:
    """Measure `spec` on fake tensors and render its workload TOML: the one path shipped and
    user workloads (`perfmodel workloads add`) take."""
    try:
        units = measure_units(spec)
    except ValueError as e:
        raise PerfmodelError(str(e)) from None
    return render_workload(spec, units, command)


def write_workloads(names: list[str], out_dir: Path) -> list[Path]:
    """Measure and write `<name>.toml` for each model in `names` into `out_dir`."""
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; "
                         f"choose from: {', '.join(MODELS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        spec = MODELS[name]
        path = out_dir / f"{name}.toml"
        path.write_text(workload_text(spec), encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m measure.make_workloads",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"models to write (default all: {', '.join(MODELS)})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="output folder (default: perfmodel/data/workloads)")
    args = parser.parse_args(argv)
    try:
        paths = write_workloads(args.names or list(MODELS), args.out)
    except (ValueError, PerfmodelError) as e:
        parser.error(str(e))
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
