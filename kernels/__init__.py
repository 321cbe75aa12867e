"""Paged attention: a PyTorch reference that runs anywhere and Triton kernels for the GPU.

Kernels know nothing of requests: they see queries, a paged KV cache and block tables.
"""

from kernels.reference import paged_attention_reference, write_kv


def paged_attention(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, scale, max_q_len=None):
    """Dispatch to Triton on a CUDA device, else to the PyTorch reference."""
    if q.is_cuda:
        from kernels.triton_paged import paged_attention_triton

        return paged_attention_triton(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, scale)
    return paged_attention_reference(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, scale, max_q_len)


__all__ = ["paged_attention", "paged_attention_reference", "write_kv"]
