"""The shipped workload files: they load, match published figures, and regenerate exactly.

Published figures are checked from the TOML files alone (no torch); the regeneration and
model tests need torch and skip without it.
"""

from __future__ import annotations

import re

import pytest

from perfmodel.errors import PerfmodelError
from perfmodel.workload import WORKLOAD_DIR, load_workload, workload_paths

SHIPPED = ["resnet50", "bert-large", "gpt2-xl", "mlp", "cnn-small", "transformer-small",
           # issue 12: the models of the published points (perfmodel/data/published)
           "mpt-125m", "mpt-350m", "mpt-760m", "mpt-1b", "mpt-3b", "mpt-7b", "mpt-13b",
           "llama2-13b", "llama3-8b", "bert-large-s128", "bert-large-s512"]
SMALL = ["mlp", "cnn-small", "transformer-small"]

# Exact counts, from the architecture and from the reference implementations.
EXACT_TOLERANCE = 0.0
# torchvision's ResNet50_Weights.IMAGENET1K_V1 card: 25,557,032 params, "GFLOPS 4.09"
# (torchvision counts multiply-adds); FlopCounterMode counts 2 FLOPs per multiply-add.
TORCHVISION_GMACS_TOLERANCE = 0.01
# He et al. 2016 Table 1 gives 3.8e9 multiply-adds for v1 (stride on the first 1x1 conv);
# v1.5 (stride on the 3x3, as torchvision and we do) runs three 3x3 convs at the higher
# resolution, +7.6 %.
HE_V1_TOLERANCE = 0.10
# Devlin et al. 2019 round BERT-large to 340M; the encoder with pooler is 335.1M.
BERT_PARAM_TOLERANCE = 0.02
# Radford et al. 2019 list 1542M for the 48-layer model; with the LM head tied to the
# token embedding the exact count is 1557.6M (+1.0 %).
GPT2_PARAM_TOLERANCE = 0.015
# Kaplan et al. 2020 sec. 2.1: C_forward ~ 2N per token. Our count adds the s x s attention
# products (4 n_layer s d per token, ~10 % at s=1024), so the rough rule holds to 12 %.
KAPLAN_ROUGH_TOLERANCE = 0.12
# Kaplan et al. 2020 Table 1 term by term (matmul params, full attention): near exact.
KAPLAN_EXACT_TOLERANCE = 0.001
# Korthikanti et al. 2022 eq. 2: a transformer layer saves s b h (34 + 5 a s / h) bytes in
# 16-bit. Without dropout (two 1-byte masks, -2sbh) and with fused attention that stores no
# s x s scores, 32 s h bytes per sample; the rest is LayerNorm statistics and log-sum-exp.
KORTHIKANTI_TOLERANCE = 0.01


def test_every_shipped_workload_loads_with_positive_totals():
    assert sorted(workload_paths()) == sorted(SHIPPED)
    for name in SHIPPED:
        w = load_workload(name)
        assert w.name == name
        assert w.generated_by == f"python -m measure.make_workloads {name}"
        assert w.params > 0 and w.forward_flops_per_sample > 0
        assert all(u.params >= 0 and u.forward_flops_per_sample >= 0
                   and u.activation_bytes_per_sample >= 0 for u in w.units)
        assert sum(u.activation_bytes_per_sample for u in w.units) > 0


def test_resnet50_matches_torchvision_and_he_et_al():
    w = load_workload("resnet50")
    assert [u.name for u in w.units][:2] == ["stem", "conv2_1"] and len(w.units) == 18
    assert w.params == 25_557_032
    macs = w.forward_flops_per_sample / 2
    assert macs == pytest.approx(4.09e9, rel=TORCHVISION_GMACS_TOLERANCE)
    assert macs == pytest.approx(3.8e9, rel=HE_V1_TOLERANCE)


def test_bert_large_params_match_architecture_and_devlin():
    # Devlin et al. 2019: L=24, H=1024, A=16; vocab 30522, 512 positions, 2 token types.
    h, layers, vocab, positions = 1024, 24, 30522, 512
    embeddings = (vocab + positions + 2) * h + 2 * h
    layer = 12 * h * h + 13 * h                 # QKV, output, FFN 4h, two LayerNorms
    head = h * h + h + 2 * h + 2                 # pooler and 2-class classifier
    w = load_workload("bert-large")
    assert [u.params for u in w.units] == [embeddings] + [layer] * layers + [head]
    assert w.params == pytest.approx(340e6, rel=BERT_PARAM_TOLERANCE)


def test_gpt2_xl_params_and_forward_flops():
    h, layers, vocab, seq = 1600, 48, 50257, 1024
    block = 12 * h * h + 13 * h
    w = load_workload("gpt2-xl")
    # Tied LM head: the (vocab x h) matrix is counted once, in the embeddings.
    assert w.params == (vocab + seq) * h + layers * block + 2 * h == 1_557_611_200
    assert w.params == pytest.approx(1542e6, rel=GPT2_PARAM_TOLERANCE)
    assert w.forward_flops_per_sample == pytest.approx(2 * w.params * seq,
                                                       rel=KAPLAN_ROUGH_TOLERANCE)
    matmul_params = layers * 12 * h * h + vocab * h      # biases, norms, positions do no matmul
    expected = 2 * matmul_params * seq + layers * 4 * seq * seq * h
    assert w.forward_flops_per_sample == pytest.approx(expected, rel=KAPLAN_EXACT_TOLERANCE)


@pytest.mark.parametrize(("name", "prefix", "seq", "h"),
                         [("gpt2-xl", "block", 1024, 1600), ("bert-large", "layer", 512, 1024)])
def test_transformer_layer_activations_match_korthikanti(name, prefix, seq, h):
    w = load_workload(name)
    layers = [u for u in w.units if re.fullmatch(prefix + r"\d+", u.name)]
    assert len(layers) in (24, 48)
    for u in layers:
        assert u.activation_bytes_per_sample == pytest.approx(32 * seq * h,
                                                               rel=KORTHIKANTI_TOLERANCE)


@pytest.mark.parametrize(("name", "prefix", "seq", "h"),
                         [("gpt2-xl", "block", 1024, 1600), ("bert-large", "layer", 512, 1024)])
def test_dropout_masks_are_korthikantis_two_bytes_per_element(name, prefix, seq, h):
    """Korthikanti et al. 2022 sec. 4.1: a layer's two residual dropouts keep 1-byte masks,
    2 s b h bytes (their s b h terms 'dropout mask' in attention and MLP); exact here."""
    w = load_workload(name)
    layers = [u for u in w.units if re.fullmatch(prefix + r"\d+", u.name)]
    assert all(u.dropout_mask_bytes_per_sample == 2 * seq * h for u in layers)
    assert w.units[0].dropout_mask_bytes_per_sample == seq * h         # embedding dropout
    no_dropout = load_workload("resnet50")
    assert not any(u.dropout_mask_bytes_per_sample for u in no_dropout.units)


def test_mlp_activation_counting_rule_by_hand():
    # fp32, batch-independent: hidden0 saves its input (64 floats) and its ReLU output
    # (1024); hidden1 saves only its ReLU output, its input being hidden0's, counted there.
    units = {u.name: u for u in load_workload("mlp").units}
    assert units["hidden0"].activation_bytes_per_sample == 4 * (64 + 1024)
    assert units["hidden1"].activation_bytes_per_sample == 4 * 1024
    # head: its input is hidden3's output; the loss saves log-softmax (10 floats), the
    # int64 target, and one fp32 total-weight scalar for the whole batch of 64.
    assert units["head"].activation_bytes_per_sample == 4 * 10 + 8 + 4 / 64


_UNIT = ('name = "x"\ndescription = "d"\ngenerated_by = "g"\nprecision = "fp32"\n'
         'optimizer = "sgd"\nbatch_size = 4\n\n[[units]]\nname = "a"\nparams = 4\n'
         'forward_flops_per_sample = 8\nactivation_bytes_per_sample = 16\n')


@pytest.mark.parametrize("content", [
    'name = "x"\ndescription = "d"\n',                             # fields missing
    'name = "x"\ndescription = "d"\ngenerated_by = "g"\nprecision = "fp32"\n'
    'optimizer = "sgd"\nbatch_size = 4\n\n[[units]]\nname = "a"\nparams = 1\n',   # unit field
    'name = "x"\ndescription = "half-writ',                       # truncated mid-string
    _UNIT + 'tensor_params = [1, 2]\n',                          # adds up to 3, not 4
    _UNIT + 'tensor_params = [4.0]\n',                           # not integers
])
def test_malformed_workload_file_names_the_file(tmp_path, content):
    path = tmp_path / "broken.toml"
    path.write_text(content)
    with pytest.raises(PerfmodelError, match="broken.toml"):
        load_workload(str(path))


def test_unknown_workload_lists_the_choices():
    with pytest.raises(PerfmodelError, match="resnet50"):
        load_workload("no-such-model")


def test_small_workloads_regenerate_byte_for_byte(tmp_path):
    torch = pytest.importorskip("torch")
    from measure.make_workloads import write_workloads

    for name in SMALL:
        header = (WORKLOAD_DIR / f"{name}.toml").read_text()
        made_with = re.search(r"Made with torch (\S+) ", header)
        if made_with is None or made_with.group(1) != torch.__version__:
            pytest.skip(f"{name}.toml was made with another torch than {torch.__version__}")
    for path in write_workloads(SMALL, tmp_path):
        assert path.read_bytes() == (WORKLOAD_DIR / path.name).read_bytes(), path.name


def test_model_registry_matches_shipped_files():
    pytest.importorskip("torch")
    from measure.models import MODELS

    assert list(MODELS) == SHIPPED
    for name, spec in MODELS.items():
        w = load_workload(name)
        assert (w.description, w.precision, w.optimizer, w.batch_size) == (
            spec.description, spec.precision, spec.optimizer, spec.batch_size)


@pytest.mark.parametrize("name", SMALL)
def test_small_model_trains_a_step(name):
    torch = pytest.importorskip("torch")
    from measure.models import MODELS, make_optimizer

    spec = MODELS[name]
    torch.manual_seed(0)
    model = spec.build()
    assert isinstance(model, torch.nn.Sequential)
    assert [n for n, _ in model.named_children()] == [u.name for u in load_workload(name).units]
    inputs, targets = spec.example_batch(spec.batch_size, torch.Generator().manual_seed(0))
    optimizer = make_optimizer(spec, model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    loss = spec.loss(model(inputs), targets)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_example_batch_is_reproducible_from_its_generator():
    torch = pytest.importorskip("torch")
    from measure.models import MODELS

    for spec in MODELS.values():
        a = spec.example_batch(2, torch.Generator().manual_seed(7))
        b = spec.example_batch(2, torch.Generator().manual_seed(7))
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", ["mlp", "transformer-small"])
def test_fake_tensor_measurement_equals_a_real_cpu_run(name):
    """The workload files come from fake tensors; counting on real tensors, with storages
    told apart by data pointer instead, must give the same FLOPs and bytes."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from measure.make_workloads import CUSTOM_FLOPS, measure_units
    from measure.models import MODELS

    spec = MODELS[name]
    model = spec.build()
    x, targets = spec.example_batch(spec.batch_size, torch.Generator().manual_seed(0))
    seen = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved, flops, current, keep = {}, {}, [""], []

    def pack(t):
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            saved[current[0]] += t.untyped_storage().nbytes()
            keep.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for unit_name, unit in model.named_children():
            current[0], saved[unit_name] = unit_name, 0
            with FlopCounterMode(display=False, custom_mapping=CUSTOM_FLOPS) as counter:
                x = unit(x)
            flops[unit_name] = counter.get_total_flops()
        spec.loss(x, targets)
    b = spec.batch_size
    assert [(u.name, u.forward_flops_per_sample, u.activation_bytes_per_sample)
            for u in measure_units(spec)] == [
        (n, flops[n] / b, saved[n] / b) for n in flops]
