"""The models perfmodel knows, as real PyTorch modules split into units.

Each model is an `nn.Sequential` whose named children are its UNITS in forward order: one
tensor in, one tensor out. FSDP wraps one unit at a time, the compute profiler times one unit
at a time and `python -m measure.make_workloads` writes one [[units]] table per unit.

Sources for the architectures:
- ResNet-50: He et al. 2016, "Deep Residual Learning", Table 1; the v1.5 variant of
  torchvision (stride 2 on the 3x3 conv of a bottleneck, not the first 1x1): 25,557,032 params.
- BERT-large: Devlin et al. 2019 (24 layers, hidden 1024, 16 heads, FFN 4096, vocab 30522,
  512 positions); post-LayerNorm encoder as in Google's and Hugging Face's code, with the
  pooler and a 2-class classifier as head (fine-tuning, e.g. GLUE or next-sentence).
- GPT-2 XL: Radford et al. 2019 (48 layers, d=1600, 25 heads, vocab 50257, 1024 positions);
  pre-LayerNorm decoder, tanh-GELU, LM head TIED to the token embedding as in OpenAI's code, so
  the shared weight is counted once (in `embeddings`): 1,557,611,200 params.
- mlp, cnn-small, transformer-small: CPU-sized models for real runs on this machine.

Dropout: GPT-2 XL and BERT-large train with dropout 0.1 on the residual branches and the
embeddings (OpenAI's GPT-2 and the HF `gpt2-xl` config: resid_pdrop = embd_pdrop = 0.1;
Devlin et al. 2019 sec. A.2 and NVIDIA's BERT config: hidden_dropout_prob 0.1); the
others train without (ResNet-50 has none; MPT in llm-foundry and Llama default to 0; the
CPU-sized models are ours). `Dropout` below calls `torch.native_dropout`, which is what
`F.dropout` runs on a GPU (aten/src/ATen/native/Dropout.cpp: is_fused_kernel_acceptable ->
native_dropout for CUDA tensors; its CUDA kernel returns a bool mask, 1 byte an element,
saved for backward). On a CPU `F.dropout` instead saves a mask at the input's dtype, so
calling native_dropout on every device makes the fake-tensor counts and the CPU trackers
see what a GPU holds. Attention-probability dropout is left out: inside the fused
scaled_dot_product_attention kernels (flash, memory-efficient) it keeps only the RNG seed
and offset, no mask. Attention uses `F.scaled_dot_product_attention`, which keeps only Q,
K, V, the output and the log-sum-exp for backward on the fused (flash) path, not the s x s
score matrix.

Weights use torch's default initialisation from its global generator: call
`torch.manual_seed` before `build()` when initial weights must repeat.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F  # noqa: N812 (the PyTorch convention)
from torch import Tensor, nn

Batch = tuple[Tensor, Tensor]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    description: str
    precision: Literal["fp32", "bf16-mixed"]
    optimizer: Literal["sgd", "momentum", "adam"]
    batch_size: int                                  # default per-worker batch
    learning_rate: float                             # used by make_optimizer
    build: Callable[[], nn.Sequential]               # units are the named children
    example_batch: Callable[[int, torch.Generator], Batch]   # synthetic (inputs, targets)
    loss: Callable[[Tensor, Tensor], Tensor]         # loss(outputs, targets) -> scalar


def make_optimizer(spec: ModelSpec, params) -> torch.optim.Optimizer:
    """The optimizer the workload file names, at the spec's learning rate."""
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.learning_rate)
    if spec.optimizer == "momentum":
        return torch.optim.SGD(params, lr=spec.learning_rate, momentum=0.9)
    return torch.optim.Adam(params, lr=spec.learning_rate)


def classification_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(outputs.float(), targets)


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Next-token cross-entropy; logits (batch, seq, vocab), targets (batch, seq)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def image_batch(shape: tuple[int, ...], classes: int) -> Callable[[int, torch.Generator], Batch]:
    def example_batch(batch_size: int, generator: torch.Generator) -> Batch:
        x = torch.randn((batch_size, *shape), generator=generator)
        return x, torch.randint(0, classes, (batch_size,), generator=generator)
    return example_batch


def token_batch(vocab: int, seq: int, classes: int | None = None
                ) -> Callable[[int, torch.Generator], Batch]:
    """Random token ids; targets are the next tokens, or a class per sequence."""
    def example_batch(batch_size: int, generator: torch.Generator) -> Batch:
        tokens = torch.randint(0, vocab, (batch_size, seq + 1), generator=generator)
        if classes is not None:
            return tokens[:, :seq], torch.randint(0, classes, (batch_size,), generator=generator)
        return tokens[:, :seq].contiguous(), tokens[:, 1:].contiguous()
    return example_batch


# ---------------------------------------------------------------- ResNet-50 (He et al. 2016)

class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride here: v1.5), 1x1 expand x4, projection shortcut when needed."""

    def __init__(self, in_channels: int, width: int, stride: int):
        super().__init__()
        out = width * 4
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or in_channels != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(y + shortcut)


def build_resnet50() -> nn.Sequential:
    units: dict[str, nn.Module] = {"stem": nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
        nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1))}
    in_channels = 64
    # He et al. Table 1: stages conv2_x..conv5_x with 3, 4, 6, 3 blocks.
    for stage, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=2):
        for i in range(blocks):
            stride = 2 if i == 0 and stage > 2 else 1
            units[f"conv{stage}_{i + 1}"] = Bottleneck(in_channels, width, stride)
            in_channels = width * 4
    units["head"] = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))
    return nn.Sequential(OrderedDict(units))


# ---------------------------------------------------------------- transformer pieces

class Dropout(nn.Module):
    """Dropout as a GPU runs it: `torch.native_dropout` (1-byte bool mask saved), a no-op
    when p is 0 or in eval mode (module docstring)."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        return torch.native_dropout(x, self.p, True)[0]


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection (same parameters as separate ones)."""

    def __init__(self, d: int, heads: int, causal: bool):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: Tensor) -> Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class FeedForward(nn.Sequential):
    def __init__(self, d: int, hidden: int, approximate: str):
        super().__init__(nn.Linear(d, hidden), nn.GELU(approximate=approximate),
                         nn.Linear(hidden, d))


class EncoderLayer(nn.Module):
    """BERT layer: post-LayerNorm, x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self, d: int, heads: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.attn = SelfAttention(d, heads, causal=False)
        self.ln1 = nn.LayerNorm(d, eps=1e-12)
        self.ffn = FeedForward(d, hidden, approximate="none")
        self.ln2 = nn.LayerNorm(d, eps=1e-12)
        self.drop = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = self.ln1(x + self.drop(self.attn(x)))
        return self.ln2(x + self.drop(self.ffn(x)))


class DecoderBlock(nn.Module):
    """GPT-2 block: pre-LayerNorm, x = x + drop(attn(LN(x))); x = x + drop(mlp(LN(x)));
    causal."""

    def __init__(self, d: int, heads: int, hidden: int | None = None, dropout: float = 0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = SelfAttention(d, heads, causal=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = FeedForward(d, hidden or 4 * d, approximate="tanh")
        self.drop = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class TokenEmbeddings(nn.Module):
    """Token + learned position embeddings (+ token type 0 and LayerNorm for BERT)."""

    def __init__(self, vocab: int, seq: int, d: int, bert: bool = False,
                 dropout: float = 0.0):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Embedding(seq, d)
        self.token_type = nn.Embedding(2, d) if bert else None
        self.norm = nn.LayerNorm(d, eps=1e-12) if bert else None
        self.drop = Dropout(dropout)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.tokens(ids) + self.positions.weight[: ids.shape[1]]
        if self.token_type is not None:
            x = self.norm(x + self.token_type.weight[0])     # one segment: type id 0
        return self.drop(x)


class ClassifierHead(nn.Module):
    """BERT pooler (dense + tanh on the first token) and a linear classifier."""

    def __init__(self, d: int, classes: int):
        super().__init__()
        self.pooler = nn.Linear(d, d)
        self.classifier = nn.Linear(d, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


class LMHead(nn.Module):
    """Final LayerNorm and the vocabulary projection, untied or tied to `embeddings`.

    A tied head holds the embeddings in a plain tuple, not as a submodule, so the shared
    weight belongs to the `embeddings` unit only and is counted once. FSDP must then keep
    the embeddings and the head in one wrapped group (as torchtitan and HF do for tied models).
    """

    def __init__(self, d: int, vocab: int, tied_to: TokenEmbeddings | None = None):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.proj = nn.Linear(d, vocab, bias=False) if tied_to is None else None
        self._tied = (tied_to,)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(x)
        if self.proj is not None:
            return self.proj(x)
        return F.linear(x, self._tied[0].tokens.weight)


def build_bert(layers: int, d: int, heads: int, vocab: int, seq: int,
               hidden: int | None = None, dropout: float = 0.0) -> nn.Sequential:
    units: dict[str, nn.Module] = {"embeddings": TokenEmbeddings(vocab, seq, d, bert=True,
                                                                 dropout=dropout)}
    for i in range(layers):
        units[f"layer{i}"] = EncoderLayer(d, heads, hidden or 4 * d, dropout)
    units["head"] = ClassifierHead(d, classes=2)
    return nn.Sequential(OrderedDict(units))


def build_gpt(layers: int, d: int, heads: int, vocab: int, seq: int, tied: bool,
              hidden: int | None = None, dropout: float = 0.0) -> nn.Sequential:
    embeddings = TokenEmbeddings(vocab, seq, d, dropout=dropout)
    units: dict[str, nn.Module] = {"embeddings": embeddings}
    for i in range(layers):
        units[f"block{i}"] = DecoderBlock(d, heads, hidden, dropout)
    units["head"] = LMHead(d, vocab, tied_to=embeddings if tied else None)
    return nn.Sequential(OrderedDict(units))


class MaskedLMHead(nn.Module):
    """BERT pre-training heads: the masked-LM transform (dense, GELU, LayerNorm) and the
    decoder tied to the token embedding over the first `masked` positions (NVIDIA's
    DeepLearningExamples gathers the masked positions only: max_predictions_per_seq = 20 at
    seq 128, 80 at 512), plus the next-sentence classifier on the pooled first token."""

    def __init__(self, d: int, masked: int, tied_to: TokenEmbeddings):
        super().__init__()
        self.masked = masked
        self.transform = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d, eps=1e-12))
        self.pooler = nn.Linear(d, d)
        self.nsp = nn.Linear(d, 2)
        self._tied = (tied_to,)

    def forward(self, x: Tensor) -> Tensor:
        mlm = F.linear(self.transform(x[:, : self.masked]), self._tied[0].tokens.weight)
        nsp = self.nsp(torch.tanh(self.pooler(x[:, 0])))
        return torch.cat([mlm.flatten(1), nsp], dim=1)


def build_bert_pretraining(seq: int, masked: int, dropout: float = 0.1) -> nn.Sequential:
    units: dict[str, nn.Module] = {"embeddings": TokenEmbeddings(30522, seq, 1024, bert=True,
                                                                 dropout=dropout)}
    for i in range(24):
        units[f"layer{i}"] = EncoderLayer(1024, 16, 4096, dropout)
    units["head"] = MaskedLMHead(1024, masked, tied_to=units["embeddings"])
    return nn.Sequential(OrderedDict(units))


def pretraining_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy of the masked-LM logits and the next-sentence logits, summed."""
    nsp, mlm = outputs[:, -2:], outputs[:, :-2].unflatten(1, (-1, 30522))
    return (F.cross_entropy(mlm.flatten(0, 1).float(), targets[:, 1:].flatten())
            + F.cross_entropy(nsp.float(), targets[:, 0] % 2))


def pretraining_batch(seq: int, masked: int) -> Callable[[int, torch.Generator], Batch]:
    def example_batch(batch_size: int, generator: torch.Generator) -> Batch:
        ids = torch.randint(0, 30522, (batch_size, seq), generator=generator)
        return ids, torch.randint(0, 30522, (batch_size, masked + 1), generator=generator)
    return example_batch


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    """Llama 2/3 block (Touvron et al. 2023; Meta's llama3 model.py): pre-RMSNorm, grouped-
    query attention without biases, SwiGLU. Rotary embeddings are left out (elementwise work
    on Q and K only; no parameters)."""

    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.norm1 = nn.RMSNorm(d, eps=1e-5)
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * kv_heads * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.norm2 = nn.RMSNorm(d, eps=1e-5)
        self.ffn = SwiGLU(d, hidden)

    def forward(self, x: Tensor) -> Tensor:
        b, s, d = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, s, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(h).view(b, s, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv_heads != self.heads)
        x = x + self.o(y.transpose(1, 2).reshape(b, s, d))
        return x + self.ffn(self.norm2(x))


class LlamaEmbeddings(nn.Module):
    def __init__(self, vocab: int, d: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)

    def forward(self, ids: Tensor) -> Tensor:
        return self.tokens(ids)


class LlamaHead(nn.Module):
    def __init__(self, d: int, vocab: int):
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-5)
        self.proj = nn.Linear(d, vocab, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.norm(x))


def build_llama(layers: int, d: int, heads: int, kv_heads: int, hidden: int, vocab: int
                ) -> nn.Sequential:
    units: dict[str, nn.Module] = {"embeddings": LlamaEmbeddings(vocab, d)}
    for i in range(layers):
        units[f"block{i}"] = LlamaBlock(d, heads, kv_heads, hidden)
    units["head"] = LlamaHead(d, vocab)
    return nn.Sequential(OrderedDict(units))


# ---------------------------------------------------------------- CPU-sized models

def build_mlp() -> nn.Sequential:
    """sklearn digits (8x8 = 64 inputs, 10 classes) through four 1024-wide ReLU layers."""
    widths = [64, 1024, 1024, 1024, 1024]
    units: dict[str, nn.Module] = {
        f"hidden{i}": nn.Sequential(nn.Linear(a, b), nn.ReLU())
        for i, (a, b) in enumerate(zip(widths, widths[1:], strict=False))}
    units["head"] = nn.Linear(1024, 10)
    return nn.Sequential(OrderedDict(units))


def build_cnn_small() -> nn.Sequential:
    """VGG-style CIFAR-10 net: four 3x3 conv + ReLU + 2x2 max-pool stages, then two dense
    layers (1024 wide), ~0.63M params."""
    channels = [3, 16, 32, 64, 128]
    units: dict[str, nn.Module] = {
        f"conv{i}": nn.Sequential(nn.Conv2d(a, b, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        for i, (a, b) in enumerate(zip(channels, channels[1:], strict=False))}
    units["head"] = nn.Sequential(nn.Flatten(), nn.Linear(128 * 2 * 2, 1024), nn.ReLU(),
                                  nn.Linear(1024, 10))
    return nn.Sequential(OrderedDict(units))


# MPT sizes of mosaicml/llm-foundry's benchmark yamls (scripts/train/yamls/pretrain/mpt-*.yaml):
# (d_model, n_heads, n_layers); vocab 50368, seq 2048, tied head. Built as GPT-2 blocks with
# learned positions (the benchmark's parameter counts grow with the sequence, as learned
# positions do); MPT's ALiBi bias and its absent biases are second-order here.
MPT_SIZES = {"125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24),
             "1b": (2048, 16, 24), "3b": (2560, 20, 32), "7b": (4096, 32, 32),
             "13b": (5120, 40, 40)}


def _mpt(size: str) -> ModelSpec:
    d, heads, layers = MPT_SIZES[size]
    return ModelSpec(
        name=f"mpt-{size}",
        description=f"MPT-{size} as in llm-foundry's benchmarks: {layers} layers, d={d}, "
                    f"{heads} heads, vocab 50368, seq 2048, tied head",
        precision="bf16-mixed", optimizer="adam", batch_size=1, learning_rate=1e-4,
        build=lambda: build_gpt(layers, d, heads, vocab=50368, seq=2048, tied=True),
        example_batch=token_batch(50368, 2048), loss=lm_loss)


GPU_MODELS = [
    *(_mpt(size) for size in MPT_SIZES),
    ModelSpec(
        name="llama2-13b",
        description="Llama 2 13B (Touvron et al. 2023): 40 layers, d=5120, 40 heads, SwiGLU "
                    "13824, vocab 32000, seq 4096, untied head",
        precision="bf16-mixed", optimizer="adam", batch_size=1, learning_rate=1e-4,
        build=lambda: build_llama(40, 5120, 40, 40, 13824, 32000),
        example_batch=token_batch(32000, 4096), loss=lm_loss),
    ModelSpec(
        name="llama3-8b",
        description="Llama 3 8B (Meta 2024): 32 layers, d=4096, 32 heads, 8 KV heads, SwiGLU "
                    "14336, vocab 128256, seq 8192, untied head",
        precision="bf16-mixed", optimizer="adam", batch_size=1, learning_rate=1e-4,
        build=lambda: build_llama(32, 4096, 32, 8, 14336, 128256),
        example_batch=token_batch(128256, 8192), loss=lm_loss),
    *(ModelSpec(
        name=f"bert-large-s{seq}",
        description=f"BERT-large pre-training (Devlin et al. 2019) at seq {seq}: 24 layers, "
                    f"hidden 1024, masked-LM head over {masked} positions tied to the "
                    f"embedding, next-sentence head, dropout 0.1 (NVIDIA DeepLearningExamples "
                    f"recipe)",
        precision="bf16-mixed", optimizer="adam", batch_size=2, learning_rate=1e-4,
        build=lambda seq=seq, masked=masked: build_bert_pretraining(seq, masked),
        example_batch=pretraining_batch(seq, masked), loss=pretraining_loss)
      for seq, masked in ((128, 20), (512, 80))),
]


MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in [
    ModelSpec(
        name="resnet50",
        description="ResNet-50 v1.5 (He et al. 2016; torchvision's stride-on-3x3 variant), "
                    "ImageNet 224x224, 1000 classes",
        precision="bf16-mixed", optimizer="momentum", batch_size=64, learning_rate=0.1,
        build=build_resnet50, example_batch=image_batch((3, 224, 224), 1000),
        loss=classification_loss),
    ModelSpec(
        name="bert-large",
        description="BERT-large encoder (Devlin et al. 2019), 24 layers, hidden 1024, "
                    "16 heads, seq 512, pooler + 2-class classifier head (fine-tuning), "
                    "dropout 0.1",
        precision="bf16-mixed", optimizer="adam", batch_size=8, learning_rate=2e-5,
        build=lambda: build_bert(24, 1024, 16, vocab=30522, seq=512, dropout=0.1),
        example_batch=token_batch(30522, 512, classes=2), loss=classification_loss),
    ModelSpec(
        name="gpt2-xl",
        description="GPT-2 XL decoder (Radford et al. 2019), 48 layers, d=1600, 25 heads, "
                    "vocab 50257, seq 1024, LM head tied to the token embedding, dropout 0.1",
        precision="bf16-mixed", optimizer="adam", batch_size=4, learning_rate=1.5e-4,
        build=lambda: build_gpt(48, 1600, 25, vocab=50257, seq=1024, tied=True,
                                dropout=0.1),
        example_batch=token_batch(50257, 1024), loss=lm_loss),
    ModelSpec(
        name="mlp",
        description="MLP for sklearn digits (64 inputs, 10 classes), four 1024-wide hidden "
                    "layers; CPU-sized",
        precision="fp32", optimizer="momentum", batch_size=64, learning_rate=0.05,
        build=build_mlp, example_batch=image_batch((64,), 10), loss=classification_loss),
    ModelSpec(
        name="cnn-small",
        description="Small VGG-style CNN for CIFAR-10 (3x32x32, 10 classes); CPU-sized",
        precision="fp32", optimizer="momentum", batch_size=32, learning_rate=0.05,
        build=build_cnn_small, example_batch=image_batch((3, 32, 32), 10),
        loss=classification_loss),
    ModelSpec(
        name="transformer-small",
        description="Tiny GPT-style decoder, 2 layers, d=128, 4 heads, byte vocab 256, "
                    "seq 64, untied head; CPU-sized",
        precision="fp32", optimizer="adam", batch_size=16, learning_rate=1e-3,
        build=lambda: build_gpt(2, 128, 4, vocab=256, seq=64, tied=False),
        example_batch=token_batch(256, 64), loss=lm_loss),
    *GPU_MODELS,
]}
