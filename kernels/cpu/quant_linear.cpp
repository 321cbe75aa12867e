// Weight-only quantized linear layers for the CPU: float32 activations times int8 or int4 weights.
//
// Why: a decode step at small batches reads every weight once, so its speed is set by the weights' bytes.
// These kernels read int8 (a quarter of float32) or int4 (an eighth, with group scales) and turn them into
// float32 in registers, inside the dot product, so the activations keep float32's precision. Weights are
// stored in panels of PANEL output columns, k-major inside a panel: for each input index k, the panel's
// PANEL weights sit side by side, so one load feeds PANEL / 16 vector accumulators and a panel streams
// from memory in order. Threads (torch's own pool) split the panels.

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops.h"
#include "vec.h"

#if !defined(__AVX2__)
#error "the quantized linear kernels need AVX2 (x86-64-v3) or newer"
#endif

namespace {

using voicepipe::LANES;
using voicepipe::load_f;
using voicepipe::load_h;
using voicepipe::store_f;
using voicepipe::vf;

constexpr int PANEL = 64;          // output columns per panel
constexpr int NV = PANEL / LANES;  // vectors across a panel
constexpr int MAX_ROWS = 6;        // activation rows per register tile (NV * MAX_ROWS accumulators)
// Bytes ahead of the reads that one row's loops ask the cache for: with int4's decoding, the hardware's own
// prefetch fell behind (1 thread, the whole model's layers at batch 1: 17 -> 8.5 ms).
constexpr int AHEAD = 2048;

// 16 bytes widened to 16 int32 lanes (the compiler's generic vector conversions come out scalar, so
// intrinsics), then to floats. A byte of int4 codes is split after widening: its low nibble is k, its high
// nibble k + 1.
#if defined(__AVX512F__)
typedef __m512i wide;
inline wide widen_s8(__m128i b) { return _mm512_cvtepi8_epi32(b); }
inline wide widen_u8(__m128i b) { return _mm512_cvtepu8_epi32(b); }
inline vf to_f(wide v) { return (vf)_mm512_cvtepi32_ps(v); }
inline wide low_nibble(wide v) { return _mm512_and_si512(v, _mm512_set1_epi32(15)); }
inline wide high_nibble(wide v) { return _mm512_srli_epi32(v, 4); }
#else
struct wide {
  __m256i lo, hi;
};
inline wide widen_s8(__m128i b) {
  return {_mm256_cvtepi8_epi32(b), _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b, b))};
}
inline wide widen_u8(__m128i b) {
  return {_mm256_cvtepu8_epi32(b), _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(b, b))};
}
inline vf to_f(wide v) {
  vf f;
  const __m256 lo = _mm256_cvtepi32_ps(v.lo), hi = _mm256_cvtepi32_ps(v.hi);
  std::memcpy(&f, &lo, sizeof lo);
  std::memcpy(reinterpret_cast<char*>(&f) + sizeof lo, &hi, sizeof hi);
  return f;
}
inline wide low_nibble(wide v) {
  const __m256i m = _mm256_set1_epi32(15);
  return {_mm256_and_si256(v.lo, m), _mm256_and_si256(v.hi, m)};
}
inline wide high_nibble(wide v) { return {_mm256_srli_epi32(v.lo, 4), _mm256_srli_epi32(v.hi, 4)}; }
#endif

inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline vf s8_to_f(const int8_t* p) { return to_f(widen_s8(load16(p))); }

// A panel's sums into `out`: times the columns' `scale` where there is one, plus their `bias` where there is one.
inline void finish(float* out, int64_t ldo, int rows, int cols, const vf acc[][NV], const float* scale,
                   const float* bias) {
  for (int m = 0; m < rows; ++m) {
    float tile[PANEL];
    for (int j = 0; j < NV; ++j) {
      vf v = acc[m][j];
      if (scale != nullptr) v *= load_f(scale + j * LANES);
      store_f(tile + j * LANES, v);
    }
    float* row = out + m * ldo;
    for (int c = 0; c < cols; ++c) {
      row[c] = tile[c] + (bias != nullptr ? bias[c] : 0.f);
    }
  }
}

// int8, one scale per output column: acc[m][j] += x[m][k] * w[k][j], then times the scale.
template <int ROWS>
void int8_tile(const float* x, int64_t ldx, const int8_t* w, int64_t K, vf acc[][NV]) {
  for (int m = 0; m < ROWS; ++m)
    for (int j = 0; j < NV; ++j) acc[m][j] = vf{};
  if (ROWS == 1) {  // one row: a second set of accumulators hides the multiply-add latency
    vf odd[NV] = {};
    int64_t k = 0;
    for (; k + 1 < K; k += 2) {
      const vf x0 = vf{} + x[k], x1 = vf{} + x[k + 1];
      __builtin_prefetch(w + k * PANEL + AHEAD);
      __builtin_prefetch(w + (k + 1) * PANEL + AHEAD);
      for (int j = 0; j < NV; ++j) {
        acc[0][j] += x0 * s8_to_f(w + k * PANEL + j * LANES);
        odd[j] += x1 * s8_to_f(w + (k + 1) * PANEL + j * LANES);
      }
    }
    for (; k < K; ++k)
      for (int j = 0; j < NV; ++j) acc[0][j] += (vf{} + x[k]) * s8_to_f(w + k * PANEL + j * LANES);
    for (int j = 0; j < NV; ++j) acc[0][j] += odd[j];
    return;
  }
  for (int64_t k = 0; k < K; ++k) {
    vf wv[NV];
    for (int j = 0; j < NV; ++j) wv[j] = s8_to_f(w + k * PANEL + j * LANES);
    for (int m = 0; m < ROWS; ++m) {
      const vf xb = vf{} + x[m * ldx + k];
      for (int j = 0; j < NV; ++j) acc[m][j] += xb * wv[j];
    }
  }
}

// int4 in groups along k, each group with its own scale and minimum per column (w = q * scale + min). Two
// codes share a byte: k even in the low nibble, k + 1 in the high one.
//
// One activation row: the codes are summed against x within a group, which then adds sum * scale plus
// (the group's sum of x, `xsum`) * min, so that a weight costs no multiply of its own.
void int4_row(const float* x, const float* xsum, const uint8_t* w, const uint16_t* scales, const uint16_t* mins,
              int64_t K, int64_t group, vf acc[NV]) {
  for (int j = 0; j < NV; ++j) acc[j] = vf{};
  for (int64_t g = 0; g < K / group; ++g) {
    vf even[NV] = {}, odd[NV] = {};  // k and k + 1 apart: twice the chains in flight
    for (int64_t k = g * group; k < (g + 1) * group; k += 2) {
      const vf x0 = vf{} + x[k], x1 = vf{} + x[k + 1];
      __builtin_prefetch(w + (k / 2) * PANEL + AHEAD);
      for (int j = 0; j < NV; ++j) {
        const wide b = widen_u8(load16(w + (k / 2) * PANEL + j * LANES));
        even[j] += x0 * to_f(low_nibble(b));
        odd[j] += x1 * to_f(high_nibble(b));
      }
    }
    const vf xs = vf{} + xsum[g];
    for (int j = 0; j < NV; ++j)
      acc[j] += (even[j] + odd[j]) * load_h(scales + g * PANEL + j * LANES) + xs * load_h(mins + g * PANEL + j * LANES);
  }
}

// Several rows: the panel's weights are decoded to float32 once, into `out` [K][PANEL], for all of them.
void int4_decode_panel(const uint8_t* w, const uint16_t* scales, const uint16_t* mins, int64_t K, int64_t group,
                       float* out) {
  for (int64_t k = 0; k < K; k += 2) {
    const int64_t g = k / group;
    __builtin_prefetch(w + (k / 2) * PANEL + AHEAD);
    for (int j = 0; j < NV; ++j) {
      const wide b = widen_u8(load16(w + (k / 2) * PANEL + j * LANES));
      const vf s = load_h(scales + g * PANEL + j * LANES), mn = load_h(mins + g * PANEL + j * LANES);
      store_f(out + k * PANEL + j * LANES, to_f(low_nibble(b)) * s + mn);
      store_f(out + (k + 1) * PANEL + j * LANES, to_f(high_nibble(b)) * s + mn);
    }
  }
}

template <int ROWS>
void float_tile(const float* x, int64_t ldx, const float* w, int64_t K, vf acc[][NV]) {
  for (int m = 0; m < ROWS; ++m)
    for (int j = 0; j < NV; ++j) acc[m][j] = vf{};
  for (int64_t k = 0; k < K; ++k) {
    vf wv[NV];
    for (int j = 0; j < NV; ++j) wv[j] = load_f(w + k * PANEL + j * LANES);
    for (int m = 0; m < ROWS; ++m) {
      const vf xb = vf{} + x[m * ldx + k];
      for (int j = 0; j < NV; ++j) acc[m][j] += xb * wv[j];
    }
  }
}

template <typename Tile>
void over_rows(int64_t M, Tile tile) {
  int64_t m = 0;
  for (; m + MAX_ROWS <= M; m += MAX_ROWS) tile(m, std::integral_constant<int, MAX_ROWS>{});
  switch (M - m) {
    case 5: tile(m, std::integral_constant<int, 5>{}); break;
    case 4: tile(m, std::integral_constant<int, 4>{}); break;
    case 3: tile(m, std::integral_constant<int, 3>{}); break;
    case 2: tile(m, std::integral_constant<int, 2>{}); break;
    case 1: tile(m, std::integral_constant<int, 1>{}); break;
    default: break;
  }
}

at::Tensor shaped(const at::Tensor& x, const at::Tensor& y, int64_t N) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  return y.view(shape);
}

void check_input(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "x must be a float32 CPU tensor");
  TORCH_CHECK(x.size(-1) == K, "x's last dimension must be the layer's input size");
}

}  // namespace

namespace voicepipe {

// x [.., K] float32; w [N / PANEL, K, PANEL] int8; scale [N / PANEL * PANEL] float32; returns [.., N].
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, int64_t N,
                       const std::optional<at::Tensor>& bias) {
  const int64_t K = w.size(1), panels = w.size(0);
  check_input(x, K);
  TORCH_CHECK(w.scalar_type() == at::kChar && w.size(2) == PANEL && panels * PANEL >= N, "bad int8 panels");
  const at::Tensor x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  at::Tensor y = at::empty({M, N}, x2.options());
  const float* xp = x2.data_ptr<float>();
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int cols = static_cast<int>(std::min<int64_t>(PANEL, N - p * PANEL));
      const float* bias = bp != nullptr ? bp + p * PANEL : nullptr;
      over_rows(M, [&](int64_t m, auto rows) {
        constexpr int R = decltype(rows)::value;
        vf acc[R][NV];
        int8_tile<R>(xp + m * K, K, wp + p * K * PANEL, K, acc);
        finish(yp + m * N + p * PANEL, N, R, cols, acc, sp + p * PANEL, bias);
      });
    }
  });
  return shaped(x, y, N);
}

// x [.., K] float32; w [N / PANEL, K / 2, PANEL] uint8 (two codes a byte); scales and mins
// [N / PANEL, K / group, PANEL] float16; returns [.., N].
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, const at::Tensor& mins,
                       int64_t group, int64_t N, const std::optional<at::Tensor>& bias) {
  const int64_t K = w.size(1) * 2, panels = w.size(0), groups = K / group;
  check_input(x, K);
  TORCH_CHECK(w.scalar_type() == at::kByte && w.size(2) == PANEL && panels * PANEL >= N, "bad int4 panels");
  TORCH_CHECK(group % 2 == 0 && K % group == 0 && scales.size(1) == groups, "bad int4 groups");
  const at::Tensor x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  const at::Tensor xsum = M == 1 ? x2.view({groups, group}).sum(-1) : at::Tensor();
  at::Tensor y = at::empty({M, N}, x2.options());
  const float* xp = x2.data_ptr<float>();
  const float* xs = M == 1 ? xsum.data_ptr<float>() : nullptr;
  const uint8_t* wp = w.data_ptr<uint8_t>();
  TORCH_CHECK(scales.scalar_type() == at::kHalf && mins.scalar_type() == at::kHalf, "int4 scales are float16");
  const auto* sp = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  const auto* mp = reinterpret_cast<const uint16_t*>(mins.data_ptr<at::Half>());
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> decoded(M > 1 ? K * PANEL : 0);
    for (int64_t p = begin; p < end; ++p) {
      const int cols = static_cast<int>(std::min<int64_t>(PANEL, N - p * PANEL));
      const float* bias = bp != nullptr ? bp + p * PANEL : nullptr;
      const uint8_t* wpan = wp + p * (K / 2) * PANEL;
      const uint16_t *span = sp + p * groups * PANEL, *mpan = mp + p * groups * PANEL;
      if (M == 1) {
        vf acc[1][NV];
        int4_row(xp, xs, wpan, span, mpan, K, group, acc[0]);
        finish(yp + p * PANEL, N, 1, cols, acc, nullptr, bias);
        continue;
      }
      int4_decode_panel(wpan, span, mpan, K, group, decoded.data());
      over_rows(M, [&](int64_t m, auto rows) {
        constexpr int R = decltype(rows)::value;
        vf acc[R][NV];
        float_tile<R>(xp + m * K, K, decoded.data(), K, acc);
        finish(yp + m * N + p * PANEL, N, R, cols, acc, nullptr, bias);
      });
    }
  });
  return shaped(x, y, N);
}

}  // namespace voicepipe
