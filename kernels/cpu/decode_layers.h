// The decoder layers a decode step runs in one call (decode_layers.cpp), as the Python module builds them.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

namespace voicepipe {

// A quantized projection: int4 panels with their group scales and minimums (group > 0), or int8 panels with
// a scale per column (group 0, mins unused).
struct PackedLinear {
  at::Tensor w, scales, mins;
  std::optional<at::Tensor> bias;
  int64_t group, n;
  at::Tensor operator()(const at::Tensor& x) const;
};

struct DecodeLayer {
  at::Tensor attn_norm, mlp_norm;  // RMS norm weights
  PackedLinear qkv, o, gate_up, down;
};

struct DecodeLayers {
  std::vector<DecodeLayer> layers;
  int64_t n_heads;
  double eps, scale;  // the norms' epsilon, attention's 1 / sqrt(head_dim)
  // The residual stream after every layer, for x [S, D] of one decode row per sequence.
  at::Tensor run(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
                 const at::Tensor& slots, const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                 const at::Tensor& block_tables, const at::Tensor& kv_lens) const;
};

}  // namespace voicepipe
