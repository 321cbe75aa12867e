// The ops the library exports to Python (bindings.cpp), each documented where it is defined.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace voicepipe {

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, int64_t N,
                       const std::optional<at::Tensor>& bias);
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, const at::Tensor& mins,
                       int64_t group, int64_t N, const std::optional<at::Tensor>& bias);
void rotary_write_kv(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
                     const at::Tensor& slots, const at::Tensor& k_cache, const at::Tensor& v_cache, int64_t n_heads);
at::Tensor decode_attention(const at::Tensor& qkv, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& block_tables, const at::Tensor& kv_lens, int64_t n_heads, double scale);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor silu_mul(const at::Tensor& gate_up);

}  // namespace voicepipe
