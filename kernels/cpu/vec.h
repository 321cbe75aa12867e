// Float vectors as wide as the CPU's registers (GCC's vector extensions: 16 lanes in an AVX-512 register, 8 in
// an AVX2 one) and the few operations on them that the kernels share. Why not 16 lanes everywhere: on AVX2
// the compiler splits such vectors into pairs and spills them, and the kernels ran 10x slower.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace voicepipe {

#if defined(__AVX512F__)
constexpr int LANES = 16;
#else
constexpr int LANES = 8;
#endif
typedef float vf __attribute__((vector_size(LANES * 4)));
typedef int32_t vi __attribute__((vector_size(LANES * 4)));

inline vf load_f(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store_f(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));

// The sum of the lanes, halving the vector each time (a sum in lane order would chain 15 additions).
inline float sum_lanes(vf v) {
#if defined(__AVX512F__)
  const vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  const vf8 a = v;
#endif
  const vf4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// e^x to about 2 ulp (Cephes' single-precision polynomial after reducing x by multiples of ln 2); inputs
// below -87.3 give 0's neighbourhood, above 88.3 the largest float's.
inline vf exp_f(vf x) {
  x = x > 88.3762626647949f ? vf{} + 88.3762626647949f : x;
  x = x < -87.3365478515625f ? vf{} - 87.3365478515625f : x;
  const vf scaled = x * 1.44269504088896341f;
  const vi k = __builtin_convertvector(scaled + (scaled >= 0 ? vf{} + 0.5f : vf{} - 0.5f), vi);
  const vf kf = __builtin_convertvector(k, vf);
  const vf r = x - kf * 0.693359375f + kf * 2.12194440e-4f;
  vf p = vf{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const vi bits = (k + 127) << 23;
  vf two_k;
  std::memcpy(&two_k, &bits, sizeof two_k);
  return p * two_k;
}

}  // namespace voicepipe
