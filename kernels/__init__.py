"""Paged attention: a PyTorch reference that runs anywhere and Triton kernels for the GPU.

Kernels know nothing of requests: they see queries, a paged KV cache and block tables.
"""

from kernels.reference import PagedLayout, paged_attention_reference, paged_layout, write_kv


def paged_attention(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, scale, max_q_len=None, layout=None,
                    scales=None):
    """Dispatch to Triton on a CUDA device, else to the PyTorch reference (with its per-step `layout`).

    An fp8 cache comes with its `scales` (`kernels.fp8`), which both kernels read.
    """
    if q.is_cuda:
        from kernels.triton_paged import paged_attention_triton

        return paged_attention_triton(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, scale, scales)
    return paged_attention_reference(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, scale, max_q_len,
                                     layout, scales)


__all__ = ["PagedLayout", "paged_attention", "paged_attention_reference", "paged_layout", "write_kv"]
