"""The model runner: one forward pass over a packed batch of decodes and prefill shards.

The step is packed as one row of all its tokens with their own positions; each sequence's rows and pages
are found through the step's metadata (`PagedStep`), computed once per step. Two forwards run it:
- "lean" (the default): our own Llama-family modules (`scheduler.model.llama`), which spend far less host time
  per step than transformers' generic decoder modules;
- "transformers": transformers' own decoder modules with a paged attention function registered with them.
  Every variant transformers loads computes exactly as transformers computes it, which makes this path the
  exactness reference, and the fallback for models the lean forward does not support.
"""

import logging
import threading

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

import kernels
from kernels import decode_ops
from scheduler.config import EngineConfig
from scheduler.model.device import place_model
from scheduler.model.kv_dtype import SCALE_DTYPE, is_scaled, kv_torch_dtype, num_slabs, pages_per_slab
from scheduler.model.llama import LayerKV, LeanLlama, PagedStep, UnsupportedModel, build_lean_llama
from scheduler.model.quantize import quantize_linears
from scheduler.planner import StepPlan

log = logging.getLogger(__name__)
ATTN_NAME = "voicepipe_paged"
_step = threading.local()


def _paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers calls this with [1, heads, T, D] tensors; T is every token of the step."""
    step: PagedStep = _step.meta
    kv = step.caches[module.layer_idx]
    kernels.write_kv(kv.k, kv.v, key[0].transpose(0, 1), value[0].transpose(0, 1), step.slots, kv.scales)
    out = kernels.paged_attention(query[0].transpose(0, 1), kv.k, kv.v, step.block_tables,
                                  step.cu_q_lens, step.kv_lens, scaling, layout=step.layout, scales=kv.scales)
    return out.unsqueeze(0), None


def _no_mask(*args, **kwargs):
    """The paged kernels mask by position themselves; transformers must not build a dense mask."""
    return None


AttentionInterface.register(ATTN_NAME, _paged_attention)
AttentionMaskInterface.register(ATTN_NAME, _no_mask)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, config: EngineConfig):
        self.precision = place_model(model, config.device, config.precision)
        self.model = model
        cfg = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.n_layers, self.n_kv = cfg.num_hidden_layers, cfg.num_key_value_heads
        self.page_tokens = config.page_tokens
        self.kv_dtype = kv_torch_dtype(config.kv_dtype, self.dtype)
        self.pages_per_slab = pages_per_slab(config.slab_bytes, config.page_tokens, self.n_kv, self.head_dim,
                                             self.kv_dtype)
        self.num_slabs = num_slabs(config, self.n_layers)
        self.num_pages = self.num_slabs * self.pages_per_slab
        self.kv = torch.zeros(2, self.n_layers, self.num_pages, config.page_tokens, self.n_kv, self.head_dim,
                              dtype=self.kv_dtype, device=self.device)
        # fp8 pages: one scale per page, kv head and K or V (kernels.fp8); set when a page is first written.
        self.kv_scales = (torch.zeros(2, self.n_layers, self.num_pages, self.n_kv, dtype=SCALE_DTYPE,
                                      device=self.device) if is_scaled(self.kv_dtype) else None)
        self.caches = [LayerKV(self.kv[0, i], self.kv[1, i],
                               None if self.kv_scales is None else (self.kv_scales[0, i], self.kv_scales[1, i]))
                       for i in range(self.n_layers)]
        self.lean = self._lean_model() if config.runner == "lean" else None
        if self.precision in ("int8", "int4"):
            if self.lean is None:
                raise ValueError(f"{self.precision} weights need the lean forward, which cannot run this model")
            # Only the lean model's layers are swapped: the transformers model stays the float32 reference.
            quantize_linears(self.lean, self.precision)
        # The C++ decode ops where they cover the model and its cache; their norms and silu * up only under
        # quantized weights, so that float32 keeps transformers' bits.
        self.native = self.lean is not None and decode_ops.usable(
            self.kv_dtype, self.device, self.head_dim, cfg.num_attention_heads, self.n_kv)
        if self.native:
            self.lean.use_native_ops(elementwise=self.precision in ("int8", "int4"))

    def _lean_model(self) -> LeanLlama | None:
        try:
            return build_lean_llama(self.model)
        except UnsupportedModel as e:
            log.info("running transformers' modules: %s", e)
            return None

    @torch.inference_mode()
    def run(self, plan: StepPlan) -> torch.Tensor:
        """Run the step; returns the logits of the chunks that sample a token, in plan order, then those of
        the rows a pending probe reads (`Chunk.probe_row`), in plan order."""
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
        sample_rows += [q_start + c.probe_row for q_start, c in zip(q_lens, plan.chunks, strict=False)
                        if c.probe_row is not None]
        width = max(len(c.seq.pages) for c in plan.chunks)
        tables = [c.seq.pages + [0] * (width - len(c.seq.pages)) for c in plan.chunks]
        as_tensor = lambda x, dtype=torch.int32: torch.tensor(x, dtype=dtype, device=self.device)  # noqa: E731
        max_kv = max(kv_lens)
        decode = self.native and all(c.n == 1 for c in plan.chunks)  # one row a sequence: the decode op's case
        tables, q_lens, kv_lens = as_tensor(tables), as_tensor(q_lens), as_tensor(kv_lens)
        layout = None if self.kv.is_cuda or decode else kernels.paged_layout(tables, q_lens, kv_lens,
                                                                             self.page_tokens, self.dtype)
        step = PagedStep(as_tensor(slots, torch.long), tables, q_lens, kv_lens, max_kv, layout, self.caches, decode)
        ids, positions = as_tensor(ids, torch.long), as_tensor(positions, torch.long)
        rows = as_tensor(sample_rows, torch.long)
        if self.lean is not None:
            return self.lean(ids, positions, step, rows).float()
        return self._run_transformers(ids, positions, step, rows)

    def _run_transformers(self, ids: torch.Tensor, positions: torch.Tensor, step: PagedStep,
                          rows: torch.Tensor) -> torch.Tensor:
        _step.meta = step
        saved = self.model.config._attn_implementation
        self.model.config._attn_implementation = ATTN_NAME
        try:
            hidden = self.model.model(input_ids=ids[None], position_ids=positions[None],
                                      use_cache=False).last_hidden_state[0]
        finally:
            self.model.config._attn_implementation = saved
            _step.meta = None
        return self.model.lm_head(hidden[rows]).float()

    def copy_pages(self, moves: dict[int, int]) -> None:
        """Carry out a compaction: copy pages to their new slots in every layer."""
        src = torch.tensor(list(moves), device=self.device)
        dst = torch.tensor(list(moves.values()), device=self.device)
        self.kv[:, :, dst] = self.kv[:, :, src]
        if self.kv_scales is not None:
            self.kv_scales[:, :, dst] = self.kv_scales[:, :, src]
