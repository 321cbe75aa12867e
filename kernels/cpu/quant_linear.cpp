// Quantized linear layers for the CPU: float32 activations times int8 weights, or int8 activations (in runs
// with their own scales) times int4 weights.
//
// Why: a decode step at small batches reads every weight once, so its speed is set by the weights' bytes.
// These kernels read int8 (a quarter of float32) or int4 (an eighth, with group scales) and use them in
// registers, inside the dot product. Weights are stored in panels of PANEL output columns that
// stream from memory in order; threads (torch's own pool) split the panels. int8 panels are k-major (for
// each input index k, the panel's PANEL weights side by side), so one load feeds a row of accumulators.

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
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
using voicepipe::store_f;
using voicepipe::vf;

constexpr int PANEL = 64;          // output columns per panel
constexpr int NV = PANEL / LANES;  // vectors across a panel
// Several rows are multiplied in tiles of TV vectors' columns by up to MAX_ROWS rows, their accumulators
// (TV * MAX_ROWS) and a row of weights within the registers: 16 of AVX2's, 32 of AVX-512's.
constexpr int TV = 4;
constexpr int TILE = TV * LANES;
constexpr int MAX_ROWS = LANES == 16 ? 6 : 3;
// Bytes ahead of the reads that one row's loops ask the cache for: with int4's decoding, the hardware's own
// prefetch fell behind (1 thread, the whole model's layers at batch 1: 17 -> 8.5 ms).
constexpr int AHEAD = 2048;

inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// LANES int8 values widened to floats (the compiler's generic vector conversions come out scalar, so intrinsics).
inline vf s8_to_f(const int8_t* p) {
#if defined(__AVX512F__)
  return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(p)));
#else
  return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(
      static_cast<const void*>(p)))));
#endif
}

// V vectors of sums per row into `out`'s first `cols` columns: times the columns' `scale` where there is
// one, plus their `bias` where there is one.
template <int V>
void finish(float* out, int64_t ldo, int rows, int cols, const vf acc[][V], const float* scale, const float* bias) {
  for (int m = 0; m < rows; ++m) {
    float tile[V * LANES];
    for (int j = 0; j < V; ++j) {
      vf v = acc[m][j];
      if (scale != nullptr) v *= load_f(scale + j * LANES);
      store_f(tile + j * LANES, v);
    }
    float* row = out + m * ldo;
    for (int c = 0; c < cols; ++c) row[c] = tile[c] + (bias != nullptr ? bias[c] : 0.f);
  }
}

// int8, one activation row across a whole panel: acc[j] += x[k] * w[k][j]. With fewer vectors than the
// multiply-add's latency times its rate (AVX-512's 4), a second set of sums keeps enough of them in flight.
void int8_row(const float* x, const int8_t* w, int64_t K, vf acc[NV]) {
  constexpr int CHAINS = NV >= 8 ? 1 : 2;
  vf part[CHAINS][NV] = {};
  int64_t k = 0;
  for (; k + CHAINS <= K; k += CHAINS)
    for (int c = 0; c < CHAINS; ++c) {
      const vf xb = vf{} + x[k + c];
      __builtin_prefetch(w + (k + c) * PANEL + AHEAD);
      for (int j = 0; j < NV; ++j) part[c][j] += xb * s8_to_f(w + (k + c) * PANEL + j * LANES);
    }
  for (; k < K; ++k)
    for (int j = 0; j < NV; ++j) part[0][j] += (vf{} + x[k]) * s8_to_f(w + k * PANEL + j * LANES);
  for (int j = 0; j < NV; ++j) {
    acc[j] = part[0][j];
    for (int c = 1; c < CHAINS; ++c) acc[j] += part[c][j];
  }
}

// int8, ROWS activation rows times a tile of a panel (`w` at its first column): acc[m][j] += x[m][k] * w[k][j].
template <int ROWS>
void int8_tile(const float* x, int64_t ldx, const int8_t* w, int64_t K, vf acc[][TV]) {
  for (int m = 0; m < ROWS; ++m)
    for (int j = 0; j < TV; ++j) acc[m][j] = vf{};
  for (int64_t k = 0; k < K; ++k) {
    vf wv[TV];
    for (int j = 0; j < TV; ++j) wv[j] = s8_to_f(w + k * PANEL + j * LANES);
    for (int m = 0; m < ROWS; ++m) {
      const vf xb = vf{} + x[m * ldx + k];
      for (int j = 0; j < TV; ++j) acc[m][j] += xb * wv[j];
    }
  }
}

// Rows [0, M) in tiles of MAX_ROWS, then one tile of the rest: `tile(first_row, rows)` with rows a constant.
template <int R = MAX_ROWS - 1, typename Tile>
void rest_of_rows(int64_t left, int64_t m, Tile tile) {
  if constexpr (R > 0) {
    if (left == R) tile(m, std::integral_constant<int, R>{});
    else rest_of_rows<R - 1>(left, m, tile);
  }
}

template <typename Tile>
void over_rows(int64_t M, Tile tile) {
  int64_t m = 0;
  for (; m + MAX_ROWS <= M; m += MAX_ROWS) tile(m, std::integral_constant<int, MAX_ROWS>{});
  rest_of_rows(M - m, m, tile);
}

// int8, M rows times a panel's `cols` columns, tile by tile: y = x * w * scale (plus `bias`, where given).
void int8_rows(const float* x, int64_t M, int64_t K, const int8_t* w, int cols, const float* scale, const float* bias,
               float* y, int64_t ldy) {
  for (int c0 = 0; c0 < cols; c0 += TILE) {
    over_rows(M, [&](int64_t m, auto rows) {
      constexpr int R = decltype(rows)::value;
      vf acc[R][TV];
      int8_tile<R>(x + m * K, K, w + c0, K, acc);
      finish<TV>(y + m * ldy + c0, ldy, R, std::min(TILE, cols - c0), acc, scale + c0,
                 bias != nullptr ? bias + c0 : nullptr);
    });
  }
}

// int4 in groups along k, each group with its own scale and minimum per column (w = q * scale + min). In a
// panel, the codes of each run of 8 k's (an octet) fill 256 bytes: 8 blocks of 8 columns, 4 bytes a column,
// byte i holding k + i in its low nibble and k + 4 + i in its high one. Four codes of a column then sit in
// one 32-bit lane, the shape of an integer dot product against 4 int8 activations.
constexpr int OCTET = 8;
constexpr int BLOCKS = PANEL / 8;  // 8-column blocks in a panel
// Activations are quantized in runs of RUN k's, each with its own scale; an int16 sum takes up to 4 octets
// (at most 4 * 2 * 2 * 15 * 127 = 30480) before it could overflow.
constexpr int RUN = 16;
static_assert(RUN % OCTET == 0 && RUN / OCTET <= 4);

inline __m256i low4(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(15)); }
inline __m256i high4(__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15)); }
inline __m256 half8(const uint16_t* p) { return _mm256_cvtph_ps(load16(p)); }

// One activation row, its values quantized to int8 in runs of RUN k's (`xq`, with `xscale` per run): integer
// dot products of codes and activations (maddubs: 32 byte products in an instruction, where widening codes
// to float32 took four), then per group sum * scale * xscale plus (the group's float sum of x, `xsum`) * min.
void int4_row(const int8_t* xq, const float* xscale, const float* xsum, const uint8_t* w, const uint16_t* scales,
              const uint16_t* mins, int64_t K, int64_t group, float* out) {
  // Only the int16 sums live in registers through the inner loop; the float sums are kept in memory (the L1
  // cache), touched once a run: with all three sets in registers AVX2's 16 spilled inside the loop.
  alignas(32) float acc[PANEL] = {}, sums[PANEL];
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < K / group; ++g) {
    std::fill(sums, sums + PANEL, 0.f);  // the group's dot products, in units of the activations' scale
    for (int64_t run = g * group; run < (g + 1) * group; run += RUN) {
      __m256i s16[BLOCKS];
      for (auto& s : s16) s = _mm256_setzero_si256();
      for (int64_t k = run; k < run + RUN; k += OCTET) {
        int32_t lo4, hi4;
        std::memcpy(&lo4, xq + k, 4);
        std::memcpy(&hi4, xq + k + 4, 4);
        const __m256i xlo = _mm256_set1_epi32(lo4), xhi = _mm256_set1_epi32(hi4);
        const uint8_t* octet = w + (k / 2) * PANEL;
        for (int line = 0; line < 4; ++line) __builtin_prefetch(octet + AHEAD + line * 64);
        for (int b = 0; b < BLOCKS; ++b) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(octet + b * 32));
          s16[b] = _mm256_add_epi16(s16[b], _mm256_add_epi16(_mm256_maddubs_epi16(low4(v), xlo),
                                                             _mm256_maddubs_epi16(high4(v), xhi)));
        }
      }
      const __m256 xs = _mm256_set1_ps(xscale[run / RUN]);
      for (int b = 0; b < BLOCKS; ++b)
        _mm256_store_ps(sums + b * 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s16[b], ones)), xs,
                                                      _mm256_load_ps(sums + b * 8)));
    }
    const __m256 xs = _mm256_set1_ps(xsum[g]);
    for (int b = 0; b < BLOCKS; ++b) {
      const int64_t at = g * PANEL + b * 8;
      _mm256_store_ps(acc + b * 8, _mm256_fmadd_ps(_mm256_load_ps(sums + b * 8), half8(scales + at),
                                                   _mm256_fmadd_ps(xs, half8(mins + at), _mm256_load_ps(acc + b * 8))));
    }
  }
  std::memcpy(out, acc, sizeof acc);
}

// x quantized to int8 in runs of RUN (round to nearest, scale = the run's largest magnitude / 127), and each
// group's float sum: what `int4_row` reads.
void quantize_row(const float* x, int64_t K, int64_t group, int8_t* xq, float* xscale, float* xsum) {
  for (int64_t run = 0; run < K; run += RUN) {
    float top = 0.f;
    for (int64_t k = run; k < run + RUN; ++k) top = std::max(top, std::abs(x[k]));
    const float scale = top / 127.f, inverse = top > 0.f ? 127.f / top : 0.f;
    xscale[run / RUN] = scale;
    for (int64_t k = run; k < run + RUN; ++k) xq[k] = static_cast<int8_t>(std::nearbyint(x[k] * inverse));
  }
  for (int64_t g = 0; g < K / group; ++g) {
    float s = 0.f;
    for (int64_t k = g * group; k < (g + 1) * group; ++k) s += x[k];
    xsum[g] = s;
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
      const int8_t* wpan = wp + p * K * PANEL;
      if (M == 1) {
        vf acc[1][NV];
        int8_row(xp, wpan, K, acc[0]);
        finish<NV>(yp + p * PANEL, N, 1, cols, acc, sp + p * PANEL, bias);
        continue;
      }
      int8_rows(xp, M, K, wpan, cols, sp + p * PANEL, bias, yp + p * PANEL, N);
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
  TORCH_CHECK(group % 32 == 0 && K % group == 0 && scales.size(1) == groups, "bad int4 groups");
  const at::Tensor x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  std::vector<int8_t> xq(M * K);
  std::vector<float> xscale(M * (K / RUN)), xsum(M * groups);
  at::Tensor y = at::empty({M, N}, x2.options());
  const float* xp = x2.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m)
      quantize_row(xp + m * K, K, group, xq.data() + m * K, xscale.data() + m * (K / RUN), xsum.data() + m * groups);
  });
  const uint8_t* wp = w.data_ptr<uint8_t>();
  TORCH_CHECK(scales.scalar_type() == at::kHalf && mins.scalar_type() == at::kHalf, "int4 scales are float16");
  const auto* sp = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  const auto* mp = reinterpret_cast<const uint16_t*>(mins.data_ptr<at::Half>());
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // Each panel is read from memory once and then stays in the cache for the rest of the rows.
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int cols = static_cast<int>(std::min<int64_t>(PANEL, N - p * PANEL));
      const float* bias = bp != nullptr ? bp + p * PANEL : nullptr;
      const uint8_t* wpan = wp + p * (K / 2) * PANEL;
      const uint16_t *span = sp + p * groups * PANEL, *mpan = mp + p * groups * PANEL;
      for (int64_t m = 0; m < M; ++m) {
        float row[PANEL];
        int4_row(xq.data() + m * K, xscale.data() + m * (K / RUN), xsum.data() + m * groups, wpan, span, mpan, K,
                 group, row);
        for (int c = 0; c < cols; ++c) yp[m * N + p * PANEL + c] = row[c] + (bias != nullptr ? bias[c] : 0.f);
      }
    }
  });
  return shaped(x, y, N);
}

}  // namespace voicepipe
