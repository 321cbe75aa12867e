"""The model runner: one forward pass over a packed batch of decodes and prefill shards.

We run transformers' own decoder modules and register a paged attention function with them, rather than
writing a compact model of our own: every Llama-family variant (Llama, Qwen2's biased projections,
Mistral, the rope scalings) then loads and computes exactly as transformers computes it, which is what
makes greedy output match `generate` token for token. The step is packed as one batch row of all its
tokens with their own positions; the attention function finds each sequence's rows and pages through the
step's metadata, writes the new keys and values into the paged cache and calls `kernels.paged_attention`.
"""

import threading
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

import kernels
from scheduler.config import EngineConfig
from scheduler.planner import StepPlan

ATTN_NAME = "voicepipe_paged"


@dataclass(slots=True)
class StepMeta:
    slots: torch.Tensor
    block_tables: torch.Tensor
    cu_q_lens: torch.Tensor
    kv_lens: torch.Tensor
    max_q_len: int
    kv: torch.Tensor  # [2, layers, pages, page_tokens, kv_heads, head_dim]
    layout: kernels.PagedLayout | None  # the reference kernel's per-step index work, shared by all layers


_step = threading.local()


def _paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers calls this with [1, heads, T, D] tensors; T is every token of the step."""
    meta: StepMeta = _step.meta
    k_cache, v_cache = meta.kv[0, module.layer_idx], meta.kv[1, module.layer_idx]
    kernels.write_kv(k_cache, v_cache, key[0].transpose(0, 1), value[0].transpose(0, 1), meta.slots)
    out = kernels.paged_attention(query[0].transpose(0, 1), k_cache, v_cache, meta.block_tables,
                                  meta.cu_q_lens, meta.kv_lens, scaling, meta.max_q_len, meta.layout)
    return out.unsqueeze(0), None


def _no_mask(*args, **kwargs):
    """The paged kernels mask by position themselves; transformers must not build a dense mask."""
    return None


AttentionInterface.register(ATTN_NAME, _paged_attention)
AttentionMaskInterface.register(ATTN_NAME, _no_mask)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, config: EngineConfig):
        self.model = model
        cfg = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.n_layers, self.n_kv = cfg.num_hidden_layers, cfg.num_key_value_heads
        self.page_tokens = config.page_tokens
        page_bytes = config.page_tokens * 2 * self.n_kv * self.head_dim * self.dtype.itemsize
        self.pages_per_slab = max(1, config.slab_bytes // page_bytes)
        self.num_pages = config.num_slabs * self.pages_per_slab
        self.kv = torch.zeros(2, self.n_layers, self.num_pages, config.page_tokens, self.n_kv, self.head_dim,
                              dtype=self.dtype, device=self.device)

    @torch.inference_mode()
    def run(self, plan: StepPlan) -> torch.Tensor:
        """Run the step; returns the logits of the chunks that sample a token, in plan order."""
        ids, positions, slots, q_lens, kv_lens, sample_rows = [], [], [], [0], [], []
        for chunk in plan.chunks:
            seq, end = chunk.seq, chunk.start + chunk.n
            ids += seq.tokens[chunk.start:end]
            pos = range(chunk.start, end)
            positions += pos
            slots += [seq.pages[p // self.page_tokens] * self.page_tokens + p % self.page_tokens for p in pos]
            q_lens.append(q_lens[-1] + chunk.n)
            kv_lens.append(end)
            if chunk.samples:
                sample_rows.append(q_lens[-1] - 1)
        width = max(len(c.seq.pages) for c in plan.chunks)
        tables = [c.seq.pages + [0] * (width - len(c.seq.pages)) for c in plan.chunks]
        as_tensor = lambda x: torch.tensor(x, dtype=torch.int32, device=self.device)  # noqa: E731
        tables, q_lens, kv_lens = as_tensor(tables), as_tensor(q_lens), as_tensor(kv_lens)
        max_q = max(c.n for c in plan.chunks)
        layout = None if self.kv.is_cuda else kernels.paged_layout(tables, q_lens, kv_lens, self.page_tokens, max_q)
        _step.meta = StepMeta(as_tensor(slots).long(), tables, q_lens, kv_lens, max_q, self.kv, layout)
        saved = self.model.config._attn_implementation
        self.model.config._attn_implementation = ATTN_NAME
        try:
            hidden = self.model.model(input_ids=torch.tensor([ids], device=self.device),
                                      position_ids=torch.tensor([positions], device=self.device),
                                      use_cache=False).last_hidden_state[0]
        finally:
            self.model.config._attn_implementation = saved
            _step.meta = None
        return self.model.lm_head(hidden[sample_rows]).float()

    def copy_pages(self, moves: dict[int, int]) -> None:
        """Carry out a compaction: copy pages to their new slots in every layer."""
        src = torch.tensor(list(moves), device=self.device)
        dst = torch.tensor(list(moves.values()), device=self.device)
        self.kv[:, :, dst] = self.kv[:, :, src]
