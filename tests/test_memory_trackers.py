"""perfmodel's memory parts against PyTorch's own trackers (issue 12).

PyTorch's `MemTracker` (DDP) and `FSDPMemTracker` (FSDP2) see every tensor storage of one
training step under FakeTensorMode in a fake process group (measure/torch_memory.py), so
GPT-2 XL's real modules can be tracked on a CPU. To keep each case to about a second the
model is GPT-2 XL cut to a few blocks (embeddings, L blocks, the tied LM head, batch 4,
seq 1024); perfmodel's side is the shipped gpt2-xl workload with the same units (the
embeddings, the first L blocks and the head), at bf16-mixed, with the same activation
checkpointing, on the a100 profile without framework overhead (which the trackers cannot
see), through perfmodel/memory.py's ddp_memory / fsdp_memory.

Tolerances (the issue's, fixed before measuring): each compared part within 10 % of the
tracker's, the compared total within 5 %. A configuration that misses is marked
xfail(strict=True) with its numbers; the bounds are never loosened.

Parts compared, at the tracker's peak (both sides put it at the start of backward):
params (Parameter + Buffer / Sharded Param), grads (Gradient / Sharded Grad; none yet at
that moment), optimizer state, activations (Activation; for autocast DDP this includes
autocast's bf16 weight cache, perfmodel's cast_cache_bytes), the loss's fp32 gradient over
the logits (the tracker's Temp, perfmodel's transient_bytes) and, for FSDP grad-op, the
unsharded parameters (Unsharded Param, perfmodel's comm_buffers_bytes).

Not compared, because the trackers do not count them:
- DDP's gradient buckets: the reducer allocates them when DDP is built, before tracking
  starts, so MemTracker sees them only when the first gradient is copied in (as Temp),
  after its peak at these depths (perfmodel's comm_buffers_bytes, one fp32 copy of the
  gradients; see test_deep_ddp_trackers_temp_is_the_bucket_seen_late);
- FSDP full-shard's unsharded parameters: FSDPMemTracker reports 0 for them at the peak,
  while perfmodel counts the gathered units (comm_buffers_bytes, ~215 MiB here).
These are removed from both sides' totals, so the compared total is the sum of the parts
both sides count (plus any other category the tracker reports, which would count against
the model).

Measured on torch 2.13 CPU (MiB, tracker vs model, 4 blocks, batch 4, dropout 0.1 on the
embeddings and both residual branches, 1-byte masks):
  DDP autocast: activations incl. weight cache and masks 2168.6 vs 2168.8; with full
  checkpointing 1082.5 vs 1082.5; params 782.1 / optimizer 1564.1 / loss gradient 1570.5
  exact (2 blocks: activations 1575.5 vs 1575.6, checkpointed 1032.5 vs 1032.5).
  FSDP full-shard world 8: activations 1668.3 vs 1668.3 (full checkpointing 866.6 vs
  866.6), loss gradient 1570.5 vs 1570.5, sharded params 97.8 / optimizer 195.5 exact.
  FSDP grad-op world 8: as full-shard, plus unsharded params 391.1 vs 391.0.
  World 64: sharded params 12.2 / optimizer 24.4 exact, grad-op's unsharded params 391.2
  vs 391.0, the rest as at world 8.
Every case passes; the twelve take about 60 s together on 2 loaded cores. Deeper DDP (16
blocks), where the tracker starts to see DDP's bucket, is the last test below.
"""

from __future__ import annotations

import dataclasses

import pytest

PART_REL = 0.10         # each compared part
TOTAL_REL = 0.05        # the compared total
BATCH = 4
MiB = 2**20

# Tracker category -> compared part; "Unsharded Param" only where the tracker counts it.
CATEGORY_PART = {
    "Parameter": "params", "Buffer": "params", "Sharded Param": "params",
    "Gradient": "grads", "Sharded Grad": "grads",
    "Optstate": "optimizer", "OptState": "optimizer",
    "Activation": "activations",
    "Temp": "transient",
    "Unsharded Param": "unsharded",
}

CASES = [
    # (strategy, ranks, variant, blocks, checkpointing)
    *(("ddp", 8, "", blocks, ck) for blocks in (2, 4) for ck in ("none", "full")),
    *(("fsdp", ranks, variant, 4, ck)
      for ranks in (8, 64) for variant in ("full-shard", "grad-op") for ck in ("none", "full")),
]


def _case_id(case) -> str:
    strategy, ranks, variant, blocks, ck = case
    name = "ddp-autocast" if strategy == "ddp" else f"fsdp-{variant}"
    return f"{name}-world{ranks}-{blocks}blocks-ckpt-{ck}"


def _reduced_spec(blocks: int, dropout: float = 0.1):
    from measure.models import MODELS, build_gpt

    return dataclasses.replace(
        MODELS["gpt2-xl"], name=f"gpt2-xl-{blocks}blocks",
        build=lambda: build_gpt(blocks, 1600, 25, vocab=50257, seq=1024, tied=True,
                                dropout=dropout))


def _model_breakdown(strategy: str, ranks: int, variant: str, blocks: int, ck: str):
    from perfmodel.cluster import load_cluster
    from perfmodel.memory import ddp_memory, fsdp_memory
    from perfmodel.sim.scenario import Scenario
    from perfmodel.workload import load_workload

    full = load_workload("gpt2-xl")
    units = (full.units[0], *full.units[1:1 + blocks], full.units[-1])
    assert units[0].name == "embeddings" and units[-1].name == "head"
    workload = dataclasses.replace(full, units=units).with_precision(
        "bf16-mixed").with_checkpointing(ck)
    base = load_cluster("a100")
    cluster = dataclasses.replace(base, device=dataclasses.replace(
        base.device, framework_overhead_GiB=0.0, memory_overhead_fraction=0.0))
    sc = Scenario(cluster=cluster, workload=workload, workers=ranks, batch_size=BATCH)
    return (fsdp_memory(sc, variant, 1) if strategy == "fsdp"
            else ddp_memory(sc, 25.0, 1.0))


def _compared(strategy: str, variant: str, categories: dict[str, int], m):
    """({part: tracker bytes}, {part: model bytes}, tracker total, model total)."""
    tracker = dict.fromkeys(("params", "grads", "optimizer", "activations", "transient"), 0)
    model = {"params": m.params_bytes, "grads": m.grads_bytes,
             "optimizer": m.optimizer_bytes,
             "activations": m.activations_bytes + m.cast_cache_bytes,
             "transient": m.transient_bytes}
    counts_unsharded = strategy == "fsdp" and variant == "grad-op"
    if counts_unsharded:
        tracker["unsharded"] = 0
        model["unsharded"] = m.comm_buffers_bytes
    other = 0
    for name, nbytes in categories.items():
        part = CATEGORY_PART.get(name)
        if name == "Total" or (part == "unsharded" and not counts_unsharded):
            continue                # FSDPMemTracker's 0 for full-shard's gathered units
        if part is None:
            other += nbytes         # counted against the model in the total
        else:
            tracker[part] += nbytes
    tracker_total = sum(tracker.values()) + other
    # Left out of the model's total: DDP's buckets and full-shard's gathered units, which
    # the trackers do not see; framework and overhead are 0 on this profile.
    model_total = sum(model.values()) + m.overhead_bytes
    left_out = 0.0 if counts_unsharded else m.comm_buffers_bytes
    assert model_total + left_out + m.framework_bytes == pytest.approx(m.peak_bytes), \
        "perfmodel's breakdown has a part this test does not know"
    return tracker, model, tracker_total, model_total


# Configurations that miss the bounds get their measured numbers here (none so far).
XFAIL: dict[str, str] = {}


def _params():
    out = []
    for case in CASES:
        cid = _case_id(case)
        marks = ([pytest.mark.xfail(strict=True, reason=XFAIL[cid])] if cid in XFAIL else [])
        out.append(pytest.param(*case, id=cid, marks=marks))
    return out


@pytest.mark.parametrize(("strategy", "ranks", "variant", "blocks", "ck"), _params())
def test_memory_parts_agree_with_pytorchs_trackers(strategy, ranks, variant, blocks, ck):
    pytest.importorskip("torch")
    from measure.torch_memory import estimate

    r = estimate(_reduced_spec(blocks), strategy, ranks, variant or "full-shard", BATCH,
                 "bf16-mixed", ck)
    assert r["peak_bytes"] > 0 and r["checkpointing"] == ck
    m = _model_breakdown(strategy, ranks, variant, blocks, ck)
    assert m.phase == "start of backward"
    tracker, model, tracker_total, model_total = _compared(
        strategy, variant, r["categories"], m)
    table = ", ".join(f"{k} {tracker[k] / MiB:.1f} vs {model[k] / MiB:.1f}" for k in tracker)
    summary = (f"{_case_id((strategy, ranks, variant, blocks, ck))} (MiB, tracker vs "
               f"model): {table}; total {tracker_total / MiB:.1f} vs {model_total / MiB:.1f}")
    print(summary)
    assert tracker["activations"] > 0 and tracker["transient"] > 0, summary
    for part in tracker:
        assert model[part] == pytest.approx(tracker[part], rel=PART_REL), \
            f"{part} off by more than {PART_REL:.0%}: {summary}"
    assert model_total == pytest.approx(tracker_total, rel=TOTAL_REL), \
        f"compared total off by more than {TOTAL_REL:.0%}: {summary}"


# ---------------------------------------------------------------- deeper DDP: the bucket

BUCKET_BLOCKS = 16      # the fp32 bucket (2.1 GiB) outgrows the loss gradient (1.5 GiB) here


def load_gpt2_xl():
    from perfmodel.workload import load_workload
    return load_workload("gpt2-xl")


def _temp_storages_at_peak(monkeypatch) -> list[int]:
    """Patch MemTracker so the sizes of the Temp storages alive at its peak are kept
    (a private hook of torch 2.13's tracker; the test fails loudly if it changes)."""
    from torch.distributed._tools import mem_tracker as mt

    seen: list[int] = []
    original = mt.MemTracker._update_peak_stats

    def update_peak_stats(self, peak_state):
        before = dict(self._peak_mem)
        original(self, peak_state)
        if self._peak_mem != before:
            seen[:] = sorted((w.mem_consumed for w, _ in self._WINFO.values()
                              if w.reftype == mt._MemRefType.TEMP), reverse=True)

    monkeypatch.setattr(mt.MemTracker, "_update_peak_stats", update_peak_stats)
    return seen


def test_deep_ddp_trackers_temp_is_the_bucket_seen_late(monkeypatch):
    """At full depth MemTracker's "Temp" (6.2 GiB for GPT-2 XL) is DDP's gradient bucket.

    The reducer allocates its flat fp32 bucket when DDP is built, before tracking starts;
    the tracker first sees that storage when the reducer copies the first gradient into it,
    and labels it Temp from then on. From ~12 blocks up the bucket outweighs the loss
    gradient, so the tracker's peak moves into the last block's backward: bucket + the tied
    embedding's fp32 gradient from the head (held until the embeddings' backward finishes
    the accumulation) + that block's backward temporaries, with the loss gradient freed.

    perfmodel counts the bucket all step (comm_buffers_bytes), so it must (1) equal the
    tracker's largest Temp storage (the bucket is the fp32 gradients: the same bytes), and
    (2) put its peak above the tracker's, by no more than what it holds at the start of
    backward and the tracker's later moment has freed: the loss gradient (which a real run
    holds beside the bucket; the tracker cannot see that) and the head's saved activations
    and bf16 weight copy.
    """
    pytest.importorskip("torch")
    from measure.torch_memory import estimate

    temps = _temp_storages_at_peak(monkeypatch)
    r = estimate(_reduced_spec(BUCKET_BLOCKS), "ddp", 8, "full-shard", BATCH, "bf16-mixed",
                 "none")
    m = _model_breakdown("ddp", 8, "", BUCKET_BLOCKS, "none")
    tied_grad = 50257 * 1600 * 4                     # the head's fp32 gradient of the table
    summary = (f"tracker Temp storages (MiB) {[round(t / MiB, 1) for t in temps[:4]]}, "
               f"categories { {k: round(v / MiB, 1) for k, v in r['categories'].items()} }, "
               f"total {r['peak_bytes'] / MiB:.1f}; model bucket "
               f"{m.comm_buffers_bytes / MiB:.1f}, peak {m.peak_bytes / MiB:.1f}")
    print(summary)
    assert temps[0] == pytest.approx(m.comm_buffers_bytes, rel=1e-3), summary
    assert tied_grad in temps, summary
    # Held at the start of backward, gone by the tracker's later moment: the loss gradient
    # and the head's saved activations and bf16 weight copy.
    head = load_gpt2_xl().units[-1]
    gone = m.transient_bytes + BATCH * head.autocast_activation_bytes_per_sample \
        + head.autocast_weight_cache_bytes
    model_total = m.peak_bytes - m.framework_bytes
    assert r["peak_bytes"] <= model_total <= r["peak_bytes"] + gone, summary


def test_dropout_masks_are_what_the_tracker_adds_for_dropout():
    """Dropout 0.1 against 0 under MemTracker (DDP autocast, 2 blocks): the activations the
    tracker sees grow by exactly the workload's mask bytes (1 byte an element; a mask at the
    input's dtype, as F.dropout keeps on a CPU, would be 2-4x that)."""
    pytest.importorskip("torch")
    from measure.torch_memory import estimate

    blocks = 2
    act = {p: estimate(_reduced_spec(blocks, p), "ddp", 8, "full-shard", BATCH, "bf16-mixed",
                       "none")["categories"]["Activation"] for p in (0.0, 0.1)}
    units = load_gpt2_xl().units[:1 + blocks]
    masks = BATCH * sum(u.dropout_mask_bytes_per_sample for u in units)
    assert masks > 0
    assert act[0.1] - act[0.0] == pytest.approx(masks, rel=1e-3), \
        f"tracker {(act[0.1] - act[0.0]) / MiB:.2f} MiB vs model masks {masks / MiB:.2f} MiB"
