// The small per-layer operations of a decode step, one call each instead of a handful of torch ops:
// rotary embedding with the KV write, attention of one query row per sequence read straight from the
// pages, RMS norm, and SiLU(gate) * up.
//
// Why: at batch 1 each layer's own arithmetic takes microseconds, while every torch op called from Python
// costs a few; paged attention through the reference gathers the keys, builds a mask and pads, 10 ops a layer.

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ops.h"
#include "vec.h"

namespace {

using voicepipe::exp_f;
using voicepipe::LANES;
using voicepipe::load_f;
using voicepipe::store_f;
using voicepipe::sum_lanes;
using voicepipe::vf;

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.device().is_cpu(), name, " must be a float32 CPU tensor");
}

}  // namespace

namespace voicepipe {

// Rotate each query and key head of qkv [T, (H + Hkv + Hkv) * D] in place, x * cos + roll(x, D / 2) * sin
// with the signed sin of the rotary table (cos and sin [L, D]), and store keys and values at their flat
// cache slots. The products and the sum are rounded apart, as torch's three ops round them, so the result is
// torch's to the bit.
__attribute__((optimize("fp-contract=off"))) void rotary_write_kv(
    const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
    const at::Tensor& slots, const at::Tensor& k_cache, const at::Tensor& v_cache, int64_t n_heads) {
  check_float(qkv, "qkv");
  TORCH_CHECK(qkv.stride(1) == 1 && cos.is_contiguous() && sin.is_contiguous() && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(), "rotary_write_kv: bad layout");
  const int64_t T = qkv.size(0), D = cos.size(1), n_kv = k_cache.size(2), row = qkv.stride(0);
  TORCH_CHECK(k_cache.size(3) == D && qkv.size(1) == (n_heads + 2 * n_kv) * D, "rotary_write_kv: bad shapes");
  const int64_t half = D / 2;
  float* base = qkv.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  const int64_t *pos = positions.data_ptr<int64_t>(), *slot = slots.data_ptr<int64_t>();
  float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    float* x = base + t * row;
    const float *c = cp + pos[t] * D, *s = sp + pos[t] * D;
    float tmp[1024];
    TORCH_CHECK(D <= 1024, "head_dim too large");
    for (int64_t h = 0; h < n_heads + n_kv; ++h) {
      float* head = x + h * D;
      std::memcpy(tmp, head, D * sizeof(float));
      for (int64_t i = 0; i < D; ++i) {
        const float a = tmp[i] * c[i];
        const float b = tmp[(i + half) % D] * s[i];
        head[i] = a + b;
      }
    }
    std::memcpy(kc + slot[t] * n_kv * D, x + n_heads * D, n_kv * D * sizeof(float));
    std::memcpy(vc + slot[t] * n_kv * D, x + (n_heads + n_kv) * D, n_kv * D * sizeof(float));
  }
}

}  // namespace voicepipe

namespace {

// One (sequence, kv head) task of decode attention: the G query heads that share the kv head, head_dim
// V * LANES, over `len` cached positions found through the sequence's `table` of pages. The query and the
// output stay in registers; `scores` holds G rows of `len` rounded up to whole vectors.
template <int G, int V>
void attend(const float* q, const float* keys, const float* values, const int32_t* table, int64_t page,
            int64_t stride, int64_t len, float scale, float* scores, float* out) {
  constexpr int64_t D = V * LANES;
  const int64_t padded = (len + LANES - 1) / LANES * LANES;
  vf qv[G][V];
  for (int h = 0; h < G; ++h)
    for (int i = 0; i < V; ++i) qv[h][i] = load_f(q + h * D + i * LANES) * scale;
  for (int64_t t = len; t < padded; ++t)
    for (int h = 0; h < G; ++h) scores[h * padded + t] = -INFINITY;
  // Position t sits at offset t % page of page table[t / page]: walked page by page, with no division.
  for (int64_t first = 0, p = 0; first < len; first += page, ++p) {
    const float* k = keys + table[p] * page * stride;
    for (int64_t t = first; t < std::min(first + page, len); ++t, k += stride) {
      vf kv[V];
      for (int i = 0; i < V; ++i) kv[i] = load_f(k + i * LANES);
      for (int h = 0; h < G; ++h) {
        vf acc = qv[h][0] * kv[0];
        for (int i = 1; i < V; ++i) acc += qv[h][i] * kv[i];
        scores[h * padded + t] = sum_lanes(acc);
      }
    }
  }
  for (int h = 0; h < G; ++h) {  // softmax, each row scaled by its own total at the end
    float* sc = scores + h * padded;
    vf top = vf{} - INFINITY;
    for (int64_t t = 0; t < padded; t += LANES) {
      const vf x = load_f(sc + t);
      top = x > top ? x : top;
    }
    float highest = top[0];
    for (int i = 1; i < LANES; ++i) highest = std::max(highest, top[i]);
    vf total{};
    for (int64_t t = 0; t < padded; t += LANES) {
      const vf e = exp_f(load_f(sc + t) - highest);
      store_f(sc + t, e);
      total += e;
    }
    const vf inv = vf{} + 1.f / sum_lanes(total);
    for (int64_t t = 0; t < padded; t += LANES) store_f(sc + t, load_f(sc + t) * inv);
  }
  vf acc[G][V] = {};
  for (int64_t first = 0, p = 0; first < len; first += page, ++p) {
    const float* v = values + table[p] * page * stride;
    for (int64_t t = first; t < std::min(first + page, len); ++t, v += stride)
      for (int i = 0; i < V; ++i) {
        const vf vv = load_f(v + i * LANES);
        for (int h = 0; h < G; ++h) acc[h][i] += scores[h * padded + t] * vv;
      }
  }
  for (int h = 0; h < G; ++h)
    for (int i = 0; i < V; ++i) store_f(out + h * D + i * LANES, acc[h][i]);
}

typedef void (*AttendFn)(const float*, const float*, const float*, const int32_t*, int64_t, int64_t, int64_t,
                         float, float*, float*);

template <int V>
AttendFn attend_for(int64_t group) {
  switch (group) {
    case 1: return attend<1, V>;
    case 2: return attend<2, V>;
    case 3: return attend<3, V>;
    case 4: return attend<4, V>;
    case 5: return attend<5, V>;
    case 6: return attend<6, V>;
    case 7: return attend<7, V>;
    case 8: return attend<8, V>;
    default: return nullptr;
  }
}

}  // namespace

namespace voicepipe {

// Attention of one query row per sequence: the queries are the first H * D columns of qkv [S, ..]; sequence
// s attends to its kv_lens[s] cached positions, found through its block table. Each (sequence, kv head)
// pair is one task: its keys are read once for all the query heads that share them.
at::Tensor decode_attention(const at::Tensor& qkv, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& block_tables, const at::Tensor& kv_lens, int64_t n_heads,
                            double scale) {
  check_float(qkv, "qkv");
  check_float(k_cache, "k_cache");
  TORCH_CHECK(qkv.stride(1) == 1 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  block_tables.is_contiguous() && block_tables.scalar_type() == at::kInt &&
                  kv_lens.scalar_type() == at::kInt, "decode_attention: bad layout");
  const int64_t S = qkv.size(0), page = k_cache.size(1), n_kv = k_cache.size(2), D = k_cache.size(3);
  const int64_t group = n_kv > 0 && n_heads % n_kv == 0 ? n_heads / n_kv : 0;
  const AttendFn fn = D == 64 ? attend_for<64 / LANES>(group) : D == 128 ? attend_for<128 / LANES>(group) : nullptr;
  TORCH_CHECK(fn != nullptr, "decode_attention: head_dim 64 or 128, at most 8 query heads a kv head");
  const int64_t width = block_tables.size(1), row = qkv.stride(0);
  at::Tensor out = at::empty({S, n_heads * D}, qkv.options());
  const float *qp = qkv.data_ptr<float>(), *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
  const int32_t *tables = block_tables.data_ptr<int32_t>(), *lens = kv_lens.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  int64_t longest = 0;
  for (int64_t s = 0; s < S; ++s) longest = std::max<int64_t>(longest, lens[s]);
  at::parallel_for(0, S * n_kv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * ((longest + LANES - 1) / LANES * LANES));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task / n_kv, g = task % n_kv;
      fn(qp + s * row + g * group * D, kc + g * D, vc + g * D, tables + s * width, page, n_kv * D, lens[s],
         static_cast<float>(scale), scores.data(), op + (s * n_heads + g * group) * D);
    }
  });
  return out;
}

// x [M, D] * rsqrt(mean(x^2) + eps) * weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_float(x, "x");
  const at::Tensor x2 = x.reshape({-1, x.size(-1)}).contiguous();
  const int64_t M = x2.size(0), D = x2.size(1);
  at::Tensor y = at::empty_like(x2);
  const float *xp = x2.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* r = xp + m * D;
    float squares = 0.f;
    for (int64_t i = 0; i < D; ++i) squares += r[i] * r[i];
    const float inv = 1.f / std::sqrt(squares / D + static_cast<float>(eps));
    for (int64_t i = 0; i < D; ++i) yp[m * D + i] = r[i] * inv * wp[i];
  }
  return y.view(x.sizes());
}

// gate_up [M, 2 I] (gate, then up) -> silu(gate) * up [M, I].
at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_float(gate_up, "gate_up");
  const at::Tensor g2 = gate_up.reshape({-1, gate_up.size(-1)}).contiguous();
  const int64_t M = g2.size(0), I = g2.size(1) / 2;
  at::Tensor y = at::empty({M, I}, g2.options());
  const float* gp = g2.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  TORCH_CHECK(I % LANES == 0, "silu_mul: the width must be a multiple of the vector width");
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < I; i += LANES) {
      const vf g = load_f(gp + m * 2 * I + i);
      store_f(yp + m * I + i, g / (1.f + exp_f(-g)) * load_f(gp + m * 2 * I + I + i));
    }
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() = I;
  return y.view(shape);
}

}  // namespace voicepipe
