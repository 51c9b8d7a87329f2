"""The user's own models as ModelSpecs, for `perfmodel workloads add`.

Two sources, both measured by measure/make_workloads.py exactly as the shipped workloads are
(meta device, FakeTensorMode: no weights, no GPU, no download):

- `module_spec`: `pkg.mod:factory`, a callable returning an `nn.Module`. An `nn.Sequential`'s
  named children are its units (one tensor in, one out), as in measure/models.py; any other
  module is one unit, `model`. Input: `--input-shape C,H,W` (float features per sample) or
  `--seq-len S` (token ids; the vocabulary is the first `nn.Embedding`'s). Loss: cross-entropy
  over the last dimension of the output against class 0 (what it saves is what a real loss
  saves; the targets' values do not matter on fake tensors), or the mean square of a 1-D
  output.
- `config_spec`: a Hugging Face-style `config.json` read as plain JSON (no transformers):
  `model_type` llama/mistral (pre-RMSNorm, grouped-query attention, SwiGLU, untied head:
  measure/models.py build_llama), gpt2 (pre-LayerNorm, learned positions, tied head:
  build_gpt) or bert (post-LayerNorm encoder, pooler + classifier: build_bert). Architectural
  details these builders leave out (rotary embeddings, biases of some variants, sliding
  windows) move FLOPs and bytes by well under 1 %.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 (the PyTorch convention)
from torch import Tensor, nn

from measure.models import (
    ModelSpec,
    build_bert,
    build_gpt,
    build_llama,
    classification_loss,
    lm_loss,
    token_batch,
)
from perfmodel.errors import PerfmodelError

PRECISIONS = ("fp32", "bf16-mixed")
OPTIMIZERS = ("sgd", "momentum", "adam")


def load_callable(target: str, option: str = "module") -> Callable[[], Any]:
    """`pkg.mod:function` given as --OPTION -> the function; the current folder is importable,
    as for python -m. Used for model factories and data makers alike."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise PerfmodelError(f"--{option} '{target}' must look like pkg.module:function")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PerfmodelError(f"--{option} '{target}': cannot import {module_name}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise PerfmodelError(f"--{option} '{target}': {module_name} has no function '{attr}' "
                             "(no callable of that name)")
    return fn


def _as_units(model: nn.Module) -> nn.Sequential:
    if isinstance(model, nn.Sequential):
        return model
    if not isinstance(model, nn.Module):
        raise PerfmodelError(f"the factory returned {type(model).__name__}, not an nn.Module")
    return nn.Sequential(OrderedDict(model=model))


def _user_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    if outputs.dim() < 2:
        return outputs.float().pow(2).mean()
    logits = outputs.flatten(0, -2).float()
    return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long))


def _features(shape: tuple[int, ...]):
    def example_batch(batch_size: int, generator: torch.Generator):
        return torch.zeros((batch_size, *shape)), torch.zeros(batch_size, dtype=torch.long)
    return example_batch


def module_spec(name: str, target: str, *, input_shape: tuple[int, ...] | None,
                seq_len: int | None, precision: str, optimizer: str, batch_size: int
                ) -> ModelSpec:
    _check(precision, optimizer, batch_size)
    factory = load_callable(target)
    if (input_shape is None) == (seq_len is None):
        raise PerfmodelError("give the input per sample: --input-shape C,H,W (features) or "
                             "--seq-len S (token ids), one of the two")
    build = lambda: _as_units(factory())  # noqa: E731
    if input_shape is not None:
        example = _features(input_shape)
        what = f"input {'x'.join(map(str, input_shape))}"
    else:
        with torch.device("meta"):
            embeddings = [m for m in build().modules() if isinstance(m, nn.Embedding)]
        if not embeddings:
            raise PerfmodelError(f"--seq-len needs token ids, but {target}() has no "
                                 f"nn.Embedding to take them; give --input-shape instead")
        example = token_batch(embeddings[0].num_embeddings, seq_len)
        what = f"seq {seq_len}"
    return ModelSpec(name=name, description=f"{target}() ({what}), the user's module",
                     precision=precision, optimizer=optimizer, batch_size=batch_size,
                     learning_rate=1e-3, build=build, example_batch=example, loss=_user_loss)


def read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise PerfmodelError(f"{path}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise PerfmodelError(f"{path}:{e.lineno}: not JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise PerfmodelError(f"{path}: not a config.json (a JSON object)")
    return data


def _int(config: dict, path: Path, *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    if default is not None:
        return default
    raise PerfmodelError(f"{path}: needs a whole number > 0 in '{keys[0]}'")


def config_spec(name: str, path: Path, *, seq_len: int | None, precision: str,
                optimizer: str, batch_size: int) -> ModelSpec:
    _check(precision, optimizer, batch_size)
    c = read_config(path)
    kind = str(c.get("model_type", "")).lower()
    vocab = _int(c, path, "vocab_size")
    if kind in ("llama", "mistral", "qwen2"):
        d, layers = _int(c, path, "hidden_size"), _int(c, path, "num_hidden_layers")
        heads = _int(c, path, "num_attention_heads")
        kv = _int(c, path, "num_key_value_heads", default=heads)
        hidden = _int(c, path, "intermediate_size")
        seq = seq_len or _int(c, path, "max_position_embeddings")
        if c.get("tie_word_embeddings"):
            raise PerfmodelError(f"{path}: tie_word_embeddings = true is not modelled for "
                                 f"{kind}-style models (the head is built untied)")
        build = lambda: build_llama(layers, d, heads, kv, hidden, vocab)  # noqa: E731
        shape = f"{layers} layers, d={d}, {heads} heads, {kv} KV heads, SwiGLU {hidden}"
        example, loss = token_batch(vocab, seq), lm_loss
    elif kind == "gpt2":
        d, layers = _int(c, path, "n_embd", "hidden_size"), _int(c, path, "n_layer")
        heads = _int(c, path, "n_head")
        hidden = _int(c, path, "n_inner", default=4 * d)
        positions = _int(c, path, "n_positions", "n_ctx")
        seq = seq_len or positions
        tied = bool(c.get("tie_word_embeddings", True))
        build = lambda: build_gpt(layers, d, heads, vocab, positions, tied, hidden)  # noqa: E731
        shape = f"{layers} layers, d={d}, {heads} heads, MLP {hidden}"
        example, loss = token_batch(vocab, seq), lm_loss
    elif kind in ("bert", "roberta"):
        d, layers = _int(c, path, "hidden_size"), _int(c, path, "num_hidden_layers")
        heads = _int(c, path, "num_attention_heads")
        hidden = _int(c, path, "intermediate_size", default=4 * d)
        positions = _int(c, path, "max_position_embeddings")
        seq = seq_len or positions
        build = lambda: build_bert(layers, d, heads, vocab, positions, hidden)  # noqa: E731
        shape = f"{layers} layers, d={d}, {heads} heads, FFN {hidden}, classifier head"
        example, loss = token_batch(vocab, seq, classes=2), classification_loss
    else:
        raise PerfmodelError(f"{path}: model_type '{kind or '?'}' is not one perfmodel reads; "
                             f"choose from: llama, mistral, qwen2, gpt2, bert, roberta (or use "
                             f"--module with your nn.Module)")
    if seq > _positions(c, kind, seq):
        raise PerfmodelError(f"--seq-len {seq} is longer than the config's "
                             f"{_positions(c, kind, seq)} positions")
    return ModelSpec(name=name, description=f"{kind} from {_where(path)}: {shape}, vocab "
                     f"{vocab}, seq {seq}", precision=precision, optimizer=optimizer,
                     batch_size=batch_size, learning_rate=1e-4, build=build,
                     example_batch=example, loss=loss)


def _where(path: Path) -> str:
    path = Path(path)
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def _positions(c: dict, kind: str, seq: int) -> int:
    if kind in ("llama", "mistral", "qwen2"):
        return seq                    # rotary: no learned table limits the length
    return int(c.get("n_positions") or c.get("n_ctx") or c.get("max_position_embeddings"))


def _check(precision: str, optimizer: str, batch_size: int) -> None:
    if precision not in PRECISIONS:
        raise PerfmodelError(f"--precision '{precision}': choose from {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise PerfmodelError(f"--optimizer '{optimizer}': choose from {', '.join(OPTIMIZERS)}")
    if batch_size < 1:
        raise PerfmodelError(f"--batch-size must be >= 1, got {batch_size}")
