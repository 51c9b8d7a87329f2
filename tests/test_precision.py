"""Precision's dtype rules, the two-moment memory peak and issue 12's GPT-2 XL targets.

Each precision is a torch 2.13 recipe (perfmodel/workload.py PRECISIONS):
- fp32 / tf32: every part 4 bytes a parameter or element;
- bf16-mixed / fp16-mixed: torch.autocast with DDP and PS (fp32 params, grads and DDP buckets,
  4-byte all-reduce, a 2-byte weight cache during the step); FSDP2
  MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): fp32 shards, 2-byte
  all-gather, 4-byte reduce-scatter;
- bf16 (pure, Megatron-style): 2-byte params and grads, fp32 master weights with the
  optimizer, 2-byte collectives.
"""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from perfmodel.cli import cli
from perfmodel.cluster import load_cluster
from perfmodel.memory import ddp_memory, fsdp_memory, ps_memory
from perfmodel.sim.scenario import Scenario
from perfmodel.sim.strategy import make_strategy
from perfmodel.workload import Unit, load_workload
from tests.factories import make_cluster, make_workload

REL_TOL = 1e-12
A100 = make_cluster("a100")
BUCKETS = {"bucket_cap_MiB": 25.0, "first_bucket_MiB": 1.0}

# precision: (param, grad, master, all-gathered, reduced) bytes per parameter, from the recipe
RULES = {
    "fp32": (4, 4, 0, 4, 4),
    "tf32": (4, 4, 0, 4, 4),
    "bf16-mixed": (4, 4, 0, 2, 4),
    "fp16-mixed": (4, 4, 0, 2, 4),
    "bf16": (2, 2, 4, 2, 2),
}


def scenario(workload, workers: int = 4, batch_size: int = 8, steps: int = 3) -> Scenario:
    return Scenario(cluster=A100, workload=workload, workers=workers, batch_size=batch_size,
                    steps=steps, jitter="none")


def no_activations(precision: str, optimizer: str = "adam"):
    return make_workload(precision=precision, optimizer=optimizer,
                         activation_bytes_per_sample=0.0)


def bytes_per_step(result, kind: str, steps: int) -> float:
    return sum(c.bytes for c in result.comms if c.kind == kind) / steps


@pytest.mark.parametrize("precision", list(RULES))
def test_ddp_memory_parts_follow_the_dtype_rule(precision):
    param, grad, master, _, _ = RULES[precision]
    w = no_activations(precision)
    m = ddp_memory(scenario(w), **BUCKETS)          # the end of backward: every gradient
    assert m.params_bytes == pytest.approx(param * w.params, rel=REL_TOL)
    assert m.grads_bytes == pytest.approx(grad * w.params, rel=REL_TOL)
    assert m.optimizer_bytes == pytest.approx((master + 8) * w.params, rel=REL_TOL)
    assert m.comm_buffers_bytes == pytest.approx(grad * w.params, rel=REL_TOL)   # bucket


@pytest.mark.parametrize("precision", list(RULES))
@pytest.mark.parametrize("compression", ["none", "bf16"])
def test_ddp_all_reduces_the_reduce_dtype_or_bf16_compressed(precision, compression):
    *_, reduced = RULES[precision]
    wire = 2 if compression == "bf16" else reduced       # bf16_compress_hook: 2 bytes
    w = no_activations(precision)
    steps = 3
    result = make_strategy("ddp", grad_compression=compression).simulate(
        scenario(w, steps=steps))
    assert bytes_per_step(result, "all-reduce", steps) == pytest.approx(wire * w.params,
                                                                        rel=1e-9)


@pytest.mark.parametrize("precision", list(RULES))
def test_fsdp_gathers_param_dtype_and_reduce_scatters_reduce_dtype(precision):
    param, grad, master, gathered, reduced = RULES[precision]
    w = no_activations(precision)
    steps, n = 3, 4
    s = scenario(w, workers=n, steps=steps)
    result = make_strategy("fsdp", variant="full-shard").simulate(s)
    # full-shard gathers every unit in forward and again in backward
    assert bytes_per_step(result, "all-gather", steps) == pytest.approx(
        2 * gathered * w.params, rel=1e-9)
    assert bytes_per_step(result, "reduce-scatter", steps) == pytest.approx(
        reduced * w.params, rel=1e-9)
    m = fsdp_memory(s, "full-shard", prefetch=1)
    assert m.params_bytes == pytest.approx(param * w.params / n, rel=REL_TOL)
    assert m.grads_bytes == pytest.approx(grad * w.params / n, rel=REL_TOL)
    assert m.optimizer_bytes == pytest.approx((master + 8) * w.params / n, rel=REL_TOL)


@pytest.mark.parametrize("precision", list(RULES))
def test_ps_pushes_grads_and_pulls_params_in_their_dtypes(precision):
    param, grad, *_ = RULES[precision]
    w = no_activations(precision)
    steps = 3
    result = make_strategy("sync-ps").simulate(scenario(w, workers=2, steps=steps))
    pushes = [c.bytes for c in result.comms if c.kind == "push"]
    pulls = [c.bytes for c in result.comms if c.kind == "pull"]
    assert pushes and pulls
    assert max(pushes) == pytest.approx(grad * w.params, rel=1e-9)
    assert max(pulls) == pytest.approx(param * w.params, rel=1e-9)
    worker = ps_memory(scenario(w, workers=2), servers=1)["worker"]
    assert worker.model_state_bytes == pytest.approx((param + grad) * w.params, rel=REL_TOL)


def lm_units(*, layers: int, params: int, saved: float, out: float, logits: float,
             cache: int = 0) -> tuple[Unit, ...]:
    """embedding, `layers` blocks, LM head: per-sample bytes counted at 2 per element."""
    def unit(name, p, sv, o, c):
        return Unit(name=name, params=p, forward_flops_per_sample=1e9,
                    activation_bytes_per_sample=sv, output_bytes_per_sample=o,
                    autocast_activation_bytes_per_sample=sv,
                    autocast_output_bytes_per_sample=o, autocast_weight_cache_bytes=c)
    return ((unit("embed", params, out, out, 0),)
            + tuple(unit(f"block{i}", params, saved, out, cache) for i in range(layers))
            + (unit("head", params, logits, logits, cache),))


def lm(precision: str, checkpointing: str = "none", **kwargs):
    base = make_workload(precision=precision, optimizer="adam")
    return dataclasses.replace(base, units=lm_units(**kwargs), activation_element_bytes=2,
                               activation_checkpointing=checkpointing)


def test_peak_is_the_larger_of_start_and_end_of_backward():
    # DDP under autocast with A saved bytes, a weight cache C and the loss's fp32 gradients
    # L = 2 x 4 bytes per logit: start = F + 4Ψ + 8Ψ + 4Ψ(bucket) + A + C + L; end = start's
    # state + 4Ψ grads, no activations. The batch moves the peak from one to the other.
    p, layers, saved, out, logits, cache = 10**6, 4, 1e6, 1e5, 8e5, 2 * 10**6
    w = lm("bf16-mixed", layers=layers, params=p, saved=saved, out=out, logits=logits,
           cache=cache)
    psi, f_bytes = w.params, A100.device.framework_overhead_GiB * 2**30
    for batch in (1, 64):
        m = ddp_memory(scenario(w, batch_size=batch), **BUCKETS)
        a = (out + layers * saved + logits) * batch
        c = (layers + 1) * cache
        loss = 2 * 4 * (logits / 2) * batch
        start = f_bytes + 16 * psi + a + c + loss
        end = f_bytes + 20 * psi
        assert m.peak_bytes == pytest.approx(max(start, end), rel=REL_TOL)
        assert m.phase == ("start of backward" if start > end else "end of backward")
    assert ddp_memory(scenario(w, batch_size=1), **BUCKETS).phase == "end of backward"
    assert ddp_memory(scenario(w, batch_size=64), **BUCKETS).phase == "start of backward"


def test_full_checkpointing_keeps_inputs_and_drops_the_weight_cache():
    # Every block keeps only its input (the previous unit's output) and replays its forward
    # in backward: the replay's saved bytes plus the gradients of its output and input
    # (saved + 2 x out) are the transient if larger than the loss's; its weight cache goes.
    p, layers, saved, out, logits, cache = 10**3, 6, 5e6, 1e5, 1e4, 10**6
    w = lm("bf16-mixed", "full", layers=layers, params=p, saved=saved, out=out, logits=logits,
           cache=cache)
    b = 16
    m = ddp_memory(scenario(w, batch_size=b), **BUCKETS)
    assert m.phase == "start of backward"
    assert m.activations_bytes == pytest.approx((out + layers * out + logits) * b, rel=REL_TOL)
    assert m.cast_cache_bytes == pytest.approx(cache, rel=REL_TOL)      # the head's only
    assert m.transient_bytes == pytest.approx((saved + 2 * out) * b, rel=REL_TOL)
    # selective: every other block (1st, 3rd, 5th) checkpointed
    sel = ddp_memory(scenario(dataclasses.replace(w, activation_checkpointing="selective"),
                              batch_size=b), **BUCKETS)
    assert sel.activations_bytes == pytest.approx(
        (out + 3 * out + 3 * saved + logits) * b, rel=REL_TOL)
    assert sel.cast_cache_bytes == pytest.approx(4 * cache, rel=REL_TOL)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_no_weight_cache_without_autocast(precision):
    w = lm(precision, layers=2, params=10**3, saved=1e6, out=1e5, logits=1e5, cache=10**6)
    m = ddp_memory(scenario(w), **BUCKETS)
    assert m.cast_cache_bytes == 0
    fsdp = fsdp_memory(scenario(lm("bf16-mixed", layers=2, params=10**3, saved=1e6, out=1e5,
                                   logits=1e5, cache=10**6)), "full-shard", prefetch=1)
    assert fsdp.cast_cache_bytes == 0          # MixedPrecisionPolicy casts in the all-gather


# Issue 12's GPT-2 XL targets, on the shipped workload and the 40 GB A100 (p4d) profile.
GPT2_ARGS = ["predict", "--workers", "8", "--cluster", "a100", "--workload", "gpt2-xl",
             "--batch-size", "4", "--precision", "bf16-mixed"]


def gpt2_xl(checkpointing: str = "none") -> Scenario:
    w = load_workload("gpt2-xl").with_precision("bf16-mixed").with_checkpointing(checkpointing)
    return Scenario(cluster=load_cluster("a100"), workload=w, workers=8, batch_size=4)


def test_gpt2_xl_autocast_ddp_batch_4_is_refused_on_a_40gb_a100():
    # fp32 params + fp32 bucket + Adam = 16Ψ = 23.2 GiB before any activation, the bf16
    # weight cache, the activations and the 1.5 GiB loss gradient: over 38 GiB usable.
    m = ddp_memory(gpt2_xl(), **BUCKETS)
    assert m.oom and m.phase == "start of backward"
    result = CliRunner().invoke(cli, ["predict", "--strategy", "ddp"] + GPT2_ARGS[1:])
    assert result.exit_code == 2
    assert "GiB the allocator can hand out" in result.output
    assert "--strategy fsdp" in result.output and "--activation-checkpointing full" in result.output


def test_gpt2_xl_fsdp_full_shard_with_full_checkpointing_cuts_the_peak_at_least_4x():
    fsdp = fsdp_memory(gpt2_xl("full"), "full-shard", prefetch=1)
    ddp = ddp_memory(gpt2_xl(), **BUCKETS)
    ddp_checkpointed = ddp_memory(gpt2_xl("full"), **BUCKETS)
    assert not fsdp.oom
    assert ddp.peak_bytes / fsdp.peak_bytes >= 4.0
    assert ddp_checkpointed.peak_bytes / fsdp.peak_bytes >= 4.0
