"""A lean Llama-family forward over the paged KV cache, built from a loaded transformers model.

Why not transformers' own modules: at small batches, dispatching 30 layers of generic decoder modules from
Python (keyword plumbing, per-layer rotary and mask work) is a large share of a step's time. This model does
only the calls a step needs: one fused QKV and one fused gate/up projection per layer, rotary embeddings
looked up in a table computed once, and paged attention through `kernels` with the step's layout computed
once per step. It computes what transformers computes, in the same order, so greedy tokens match. The fused
weights become the storage that the transformers projections view, so both models run side by side without
a second copy of the weights. Every projection is a plain `nn.Linear` (`qkv`, `o`, `gate_up`, `down`,
`lm_head`), so a pass that swaps `nn.Linear` modules applies to this model too.
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

import kernels
from kernels import decode_ops

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
# Rope types whose frequencies do not depend on the sequence length, so one table serves every step.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class UnsupportedModel(ValueError):
    """The model needs something this forward does not compute; run transformers' modules instead."""


class LayerKV(NamedTuple):
    """One layer's pages: keys, values, and for fp8 pages their (k_scale, v_scale) (`kernels.fp8`)."""

    k: torch.Tensor
    v: torch.Tensor
    scales: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass(slots=True)
class PagedStep:
    """What every layer's attention needs about a step, computed once per step."""

    slots: torch.Tensor  # [T] int64, flat cache slot of each token
    block_tables: torch.Tensor  # [S, max_pages] int32
    cu_q_lens: torch.Tensor  # [S + 1] int32
    kv_lens: torch.Tensor  # [S] int32
    max_kv_len: int
    layout: kernels.PagedLayout | None  # the reference kernel's index work, shared by all layers
    caches: list[LayerKV]  # each layer's pages
    decode: bool = False  # every row a decode, attended by `kernels.decode_ops` straight from the pages


class Rotation(NamedTuple):
    """A step's rotary angles: per token (cos, sin [T, 1, head_dim]), or for `kernels.decode_ops` the whole
    tables (cos, sin [L, head_dim]) with each token's position."""

    cos: torch.Tensor
    sin: torch.Tensor
    positions: torch.Tensor | None = None


class RMSNorm(nn.Module):
    """Root-mean-square norm as torch's one fused op (in float32 it gives Llama's own module's result), or
    with `native` as the C++ op, a third of its time at batch 1 and equal to it within float32's rounding."""

    def __init__(self, weight: nn.Parameter, eps: float):
        super().__init__()
        self.weight, self.eps = weight, eps
        self.shape = tuple(weight.shape)
        self.native = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native:
            return decode_ops.rms_norm(x, self.weight, self.eps)
        return nn.functional.rms_norm(x, self.shape, self.weight, self.eps)


class RotaryTable:
    """cos and sin of every position, computed once and grown by doubling when a sequence outgrows it.

    Llama rotates x as x * cos + (-x2, x1) * sin over the halves (x1, x2) of each head. The table keeps sin
    with its first half negated, so that the rotation is x * cos + (x2, x1) * sin: one roll instead of a
    split, a negation and a concatenation, with the same products bit for bit.
    """

    def __init__(self, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype, length: int = 4096):
        self.inv_freq, self.scaling, self.dtype = inv_freq.float(), scaling, dtype
        self.length = 0
        self._fill(length)

    def _fill(self, length: int) -> None:
        positions = torch.arange(length, device=self.inv_freq.device, dtype=torch.float)
        angles = positions[:, None] * self.inv_freq
        cos, sin = angles.cos() * self.scaling, angles.sin() * self.scaling
        # [positions, 1, head_dim]: broadcast over heads
        self.cos = torch.cat((cos, cos), dim=-1)[:, None].to(self.dtype)
        self.sin = torch.cat((-sin, sin), dim=-1)[:, None].to(self.dtype)
        self.length = length

    def __call__(self, positions: torch.Tensor, end: int, whole: bool = False) -> Rotation:
        """cos and signed sin of `positions`, all below `end`; with `whole`, the tables and the positions."""
        if end > self.length:
            self._fill(max(end, 2 * self.length))
        if whole:
            return Rotation(self.cos.view(self.length, -1), self.sin.view(self.length, -1), positions)
        return Rotation(self.cos.index_select(0, positions), self.sin.index_select(0, positions))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of [T, heads, head_dim] rows, with the signed sin of `RotaryTable`."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class Attention(nn.Module):
    def __init__(self, qkv: nn.Linear, o: nn.Linear, n_heads: int, n_kv: int, head_dim: int):
        super().__init__()
        self.qkv, self.o = qkv, o
        self.n_heads, self.n_kv, self.head_dim = n_heads, n_kv, head_dim
        self.qk_width = (n_heads + n_kv) * head_dim
        self.scale = head_dim ** -0.5

    def forward(self, x: torch.Tensor, rotation: Rotation, step: PagedStep, kv: LayerKV) -> torch.Tensor:
        n = x.shape[0]
        qkv = self.qkv.forward(x)
        if rotation.positions is not None:  # whole tables: the C++ ops rotate, store, and attend decodes
            decode_ops.rotary_write_kv(qkv, rotation.cos, rotation.sin, rotation.positions, step.slots, kv.k, kv.v,
                                       self.n_heads)
            if step.decode:
                return self.o.forward(decode_ops.decode_attention(qkv, kv.k, kv.v, step.block_tables,
                                                                  step.kv_lens, self.n_heads, self.scale))
            q = qkv[:, :self.n_heads * self.head_dim].view(n, self.n_heads, self.head_dim)
        else:
            # Queries and keys sit side by side in the projection: one rotation covers both.
            qk = rotate(qkv[:, :self.qk_width].view(n, -1, self.head_dim), rotation.cos, rotation.sin)
            q, k = qk[:, :self.n_heads], qk[:, self.n_heads:]
            v = qkv[:, self.qk_width:].view(n, self.n_kv, self.head_dim)
            kernels.write_kv(kv.k, kv.v, k, v, step.slots, kv.scales)
        out = kernels.paged_attention(q, kv.k, kv.v, step.block_tables, step.cu_q_lens, step.kv_lens,
                                      self.scale, layout=step.layout, scales=kv.scales)
        return self.o.forward(out.reshape(n, -1))


class MLP(nn.Module):
    """With `native`, silu(gate) * up is one C++ op (equal to torch's two within float32's rounding)."""

    def __init__(self, gate_up: nn.Linear, down: nn.Linear):
        super().__init__()
        self.gate_up, self.down = gate_up, down
        self.native = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native:
            return self.down.forward(decode_ops.silu_mul(self.gate_up.forward(x)))
        gate, up = self.gate_up.forward(x).chunk(2, dim=-1)
        return self.down.forward(nn.functional.silu(gate) * up)


class Block(nn.Module):
    """A decoder layer. Its parts are called through `forward`, past nn.Module's call machinery (hooks the
    lean model never has): about a microsecond each, some 270 times a decode step."""

    def __init__(self, attn_norm: RMSNorm, attn: Attention, mlp_norm: RMSNorm, mlp: MLP):
        super().__init__()
        self.attn_norm, self.attn, self.mlp_norm, self.mlp = attn_norm, attn, mlp_norm, mlp

    def forward(self, x: torch.Tensor, rotation: Rotation, step: PagedStep, kv: LayerKV) -> torch.Tensor:
        x = x + self.attn.forward(self.attn_norm.forward(x), rotation, step, kv)
        return x + self.mlp.forward(self.mlp_norm.forward(x))


class LeanLlama(nn.Module):
    """Embedding, decoder blocks, final norm and lm_head over one packed row of a step's tokens."""

    def __init__(self, embed: nn.Embedding, rotary: RotaryTable, layers: list[Block], norm: RMSNorm,
                 lm_head: nn.Linear):
        super().__init__()
        self.embed, self.rotary, self.norm, self.lm_head = embed, rotary, norm, lm_head
        self.layers = nn.ModuleList(layers)
        self.native = False
        self.one_call: decode_ops.DecodeLayers | None = None

    def use_native_ops(self, elementwise: bool) -> None:
        """Rotate, store and attend decodes with `kernels.decode_ops` (rotations and stores equal torch's to
        the bit); with `elementwise` also the norms and silu * up, which round differently from torch's
        (where the weights are quantized anyway, no bit of float32's is there to keep), and, where every
        projection runs in the C++ kernels, a decode step's layers in one call (the same ops, run from C++)."""
        self.native = True
        for module in self.modules():
            if isinstance(module, RMSNorm | MLP):
                module.native = elementwise
        self.one_call = self._one_call_layers() if elementwise else None

    def _one_call_layers(self) -> "decode_ops.DecodeLayers | None":
        norms = [n for b in self.layers for n in (b.attn_norm, b.mlp_norm)]
        packed = [[getattr(p, "packed", lambda: None)() for p in (b.attn.qkv, b.attn.o, b.mlp.gate_up, b.mlp.down)]
                  for b in self.layers]
        if any(p is None for ps in packed for p in ps) or len({n.eps for n in norms}) != 1:
            return None
        first = self.layers[0].attn
        return decode_ops.decode_layers([(b.attn_norm.weight, b.mlp_norm.weight, *ps)
                                         for b, ps in zip(self.layers, packed, strict=True)],
                                        first.n_heads, norms[0].eps, first.scale)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, step: PagedStep,
                sample_rows: torch.Tensor) -> torch.Tensor:
        """Logits [len(sample_rows), vocab] of the tokens at `sample_rows` of the packed row `ids` [T]."""
        x = self.embed(ids)
        rotation = self.rotary(positions, step.max_kv_len, whole=self.native)
        if step.decode and self.one_call is not None:
            x = self.one_call.run(x, rotation.cos, rotation.sin, rotation.positions, step.slots,
                                  [kv.k for kv in step.caches], [kv.v for kv in step.caches], step.block_tables,
                                  step.kv_lens)
        else:
            for layer, kv in zip(self.layers, step.caches, strict=True):
                x = layer.forward(x, rotation, step, kv)
        return self.lm_head(self.norm(x[sample_rows]))


def fuse(linears: list[nn.Linear]) -> nn.Linear:
    """One Linear computing the given ones' outputs side by side; they keep working as views of its weights."""
    first = linears[0]
    has_bias = first.bias is not None
    fused = nn.Linear(first.in_features, sum(m.out_features for m in linears), bias=has_bias,
                      device=first.weight.device, dtype=first.weight.dtype)
    fused.weight = nn.Parameter(torch.cat([m.weight for m in linears]), requires_grad=False)
    if has_bias:
        fused.bias = nn.Parameter(torch.cat([m.bias for m in linears]), requires_grad=False)
    start = 0
    for m in linears:
        end = start + m.out_features
        m.weight = nn.Parameter(fused.weight[start:end], requires_grad=False)
        if has_bias:
            m.bias = nn.Parameter(fused.bias[start:end], requires_grad=False)
        start = end
    return fused


def check_supported(model: nn.Module) -> None:
    """Raise UnsupportedModel unless this forward computes exactly what the model's own modules compute."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED_TYPES:
        raise UnsupportedModel(f"model type {cfg.model_type!r} is not one of {', '.join(SUPPORTED_TYPES)}")
    if cfg.hidden_act != "silu":
        raise UnsupportedModel(f"activation {cfg.hidden_act!r} is not silu")
    rope_type = getattr(model.model.rotary_emb, "rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        raise UnsupportedModel(f"rope type {rope_type!r} changes with the sequence length")
    sliding = getattr(cfg, "sliding_window", None) is not None and (
        cfg.model_type == "mistral" or "sliding_attention" in (getattr(cfg, "layer_types", None) or ()))
    if sliding:
        raise UnsupportedModel("sliding-window attention is not computed by the paged kernels")
    for layer in model.model.layers:
        sa, mlp = layer.self_attn, layer.mlp
        if any(type(m) is not nn.Linear for m in (sa.q_proj, sa.k_proj, sa.v_proj, mlp.gate_proj, mlp.up_proj)):
            raise UnsupportedModel("projections to fuse are not plain nn.Linear modules")


@torch.no_grad()
def build_lean_llama(model: nn.Module) -> LeanLlama:
    """The lean forward of a loaded `LlamaForCausalLM`-shaped model, sharing its weights."""
    check_supported(model)
    cfg, inner = model.config, model.model
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    blocks = []
    for layer in inner.layers:
        sa, mlp = layer.self_attn, layer.mlp
        attn = Attention(fuse([sa.q_proj, sa.k_proj, sa.v_proj]), sa.o_proj, n_heads, n_kv, head_dim)
        blocks.append(Block(RMSNorm(layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon), attn,
                            RMSNorm(layer.post_attention_layernorm.weight,
                                    layer.post_attention_layernorm.variance_epsilon),
                            MLP(fuse([mlp.gate_proj, mlp.up_proj]), mlp.down_proj)))
    rope = inner.rotary_emb
    rotary = RotaryTable(rope.inv_freq, rope.attention_scaling, inner.embed_tokens.weight.dtype)
    return LeanLlama(inner.embed_tokens, rotary, blocks, RMSNorm(inner.norm.weight, inner.norm.variance_epsilon),
                     model.lm_head)
