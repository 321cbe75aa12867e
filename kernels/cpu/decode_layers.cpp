// Every decoder layer of a decode step in one call: at batch 1 a layer's arithmetic takes tens of
// microseconds while each op called from Python costs a few, and a layer is a dozen of them (norms, four
// projections, rotary with the KV write, attention, silu * up, two residual adds). Run from here, the step
// pays for one call. The layers' weights are the quantized panels `quant_linear.cpp` reads, held by
// reference: the Python modules own them.

#include "decode_layers.h"

#include "ops.h"

namespace voicepipe {

at::Tensor PackedLinear::operator()(const at::Tensor& x) const {
  return group > 0 ? int4_linear(x, w, scales, mins, group, n, bias) : int8_linear(x, w, scales, n, bias);
}

at::Tensor DecodeLayers::run(const at::Tensor& embedded, const at::Tensor& cos, const at::Tensor& sin,
                             const at::Tensor& positions, const at::Tensor& slots, const std::vector<at::Tensor>& keys,
                             const std::vector<at::Tensor>& values, const at::Tensor& block_tables,
                             const at::Tensor& kv_lens) const {
  TORCH_CHECK(keys.size() == layers.size() && values.size() == layers.size(), "one key and value cache a layer");
  at::Tensor x = embedded.contiguous().clone();  // the residual stream, updated in place
  for (size_t i = 0; i < layers.size(); ++i) {
    const DecodeLayer& layer = layers[i];
    at::Tensor qkv = layer.qkv(rms_norm(x, layer.attn_norm, eps));
    rotary_write_kv(qkv, cos, sin, positions, slots, keys[i], values[i], n_heads);
    x.add_(layer.o(decode_attention(qkv, keys[i], values[i], block_tables, kv_lens, n_heads, scale)));
    x.add_(layer.down(silu_mul(layer.gate_up(rms_norm(x, layer.mlp_norm, eps)))));
  }
  return x;
}

}  // namespace voicepipe
