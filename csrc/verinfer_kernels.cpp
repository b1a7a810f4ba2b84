// verinfer._kernels: batch-invariant fp32 CPU kernels.
//
// Every reduction has ONE arithmetic order that depends only on its length K, never on the row
// count, the row index, the tiling, the thread count or the ISA:
//
//   dot16(a, b, K): 16 lane accumulators (0.0f); lane[k % 16] = fmaf(a[k], b[k], lane[k % 16])
//   for k < K16 = K - K % 16 in increasing k; fold the lanes with the fixed tree s = 8, 4, 2, 1
//   (lane[j] += lane[j + s] for j < s); then acc = fmaf(a[k], b[k], acc) for the K % 16 tail.
//
// A second family, the packed outer-product GEMM (linear_packed, linear_q8_0_packed; see
// "packed outer-product GEMM" below), has a different fixed order that is easier to make fast at
// large M: ONE sequential accumulator per output, acc = fmaf(x[m,k], W[n,k], acc) for k = 0..K-1
// from acc = 0.0f, with the vector lanes over n (never over k) and no split-K. Weights are
// repacked once into 32-column panels. The two families give different bits by design.
//
// FMA is exactly rounded, so AVX-512 (one __m512 per accumulator), AVX2 (two __m256) and the
// portable scalar path (16 floats + fmaf) produce the same bits; tests prove it. Tiles only
// decide which independent accumulators share registers, so they never change a result.
//
// The ISA-generic kernels (the VI_BODY section at the end of this file) are compiled three times,
// inside three `#pragma GCC target` regions, by including this very file again with VI_BODY
// defined: GCC cannot give one template different target attributes per instantiation, and the
// build must not use -mavx512f globally (the scalar path has to run on any x86-64).
#ifndef VI_BODY

#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include "verinfer_pool.h"

namespace vi {

// Packed quantized panels. Every format is repacked at load into panels of kPNR = 32 output rows
// and blocks of 32 consecutive k, k-major inside the block so that 16 rows' weights at one k are
// 16 consecutive lanes; each block decodes, one k at a time, to exactly the fp32 values
// gguf.quants.dequantize gives, which then feed the same sequential fmaf chain as fp32 panels.
// A panel is a run of units (a unit: one 32-k block, or for the K-quants one 256-k super-block
// holding a header and 8 blocks' data), so every layout reads the file's bytes and little more.
// One templated tile (qtile) and one dequantizer (dequant_panels) serve every format; a format is
// only its block decoder (Dec* in the VI_BODY section). Layouts, per unit of 32 rows:
//   kQ8   32 k: fp16 d per row (64 B), then int8 q[kk][row]: w = float(q) * d. 1088 B (Q8_0).
//   kQ41  32 k: fp16 d, fp16 m per row, then 512 B of nibble bytes: one byte per (kp, row), kp <
//         16, whose low nibble is q at k = kp and high nibble q at k = kp + 16 (GGUF's nibble
//         order), placed at nib_index(kp, row) (below); w = fmaf(q, d, m). 640 B.
//   kQ5   32 k: fp16 d per row (64 B); per k a 32-bit word whose bit `row` is set when the row's
//         5th bit is CLEAR, i.e. when gguf's q5 - 16 = nibble - 16 (128 B); then nibbles as kQ41
//         (512 B). w = float(nibble - 16 * bit) * d, gguf's float(q5 - 16) * d. 704 B = the
//         file's 22 B per 32 weights; the bit is inverted so that AVX-512 merges it with one
//         masked subtract and AVX2 with one blend on the sign bit.
//   Nibble bytes (kQ41, kQ5, kQ4K): each pair of kp is one 64-byte chunk read as 16 little-endian
//         32-bit lanes; lane l holds rows l and 16 + l at both kp, so (lane >> shift) & 15 with
//         shift = 8 * (2 * (kp % 2) + row / 16) + 4 * half gives 16 rows' weights at one k in lane
//         order: a shift and a mask per 8 or 16 weights, no byte-to-lane shuffle (the shuffle port
//         bounded the AVX2 decode on a Zen 3 core).
//   kQ4K  256 k: fp16 d, fp16 -dmin per row (128 B), then the 8 sub-blocks' 6-bit sc and m as
//         bytes [sub][row] (256 + 256 B), then 8 x 512 B of nibbles as kQ41. The kernel forms
//         float(sc) * d and float(m) * -dmin per block (both exact: fp16 x 6 bits < 24 bits, so
//         they are gguf's float32 products), then w = fmaf(q, d*sc, -(dmin*m)), which is gguf's
//         d*sc*q - dmin*m: the product is exact (fp16 x 6-bit x 4-bit), so both round once, at
//         the same place. 4736 B (0.58 B/weight; the file 0.5625).
//   kQ6K  256 k: fp16 d per row (64 B), int8 sc [16][row] (one per 16 k, 512 B), then 8 x 1024 B
//         of int8 q6 - 32 [kk][row]; the kernel forms float(sc) * d (exact: 11 x 8 bits), then
//         w = float(q) * (d * sc), gguf's order. 8768 B (1.07 B/weight; the file 0.82).
enum PanelFmt : int { kQ8 = 0, kQ41 = 1, kQ4K = 2, kQ6K = 3, kQ5 = 4 };
// Offset of row `row`'s nibble byte for kp (< 16) inside a block's 512 nibble bytes.
constexpr int64_t nib_index(int64_t kp, int64_t row) {
  return (kp / 2) * 64 + 4 * (row % 16) + 2 * (kp % 2) + row / 16;
}
constexpr int kNumFmts = 5;
constexpr int64_t kPNR = 32;
constexpr int64_t kQBlk = 2 * kPNR + 32 * kPNR;                 // 1088
constexpr int64_t kQ41Blk = 4 * kPNR + 16 * kPNR;               // 640
constexpr int64_t kQ5Blk = 2 * kPNR + 4 * 32 + 16 * kPNR;       // 704
constexpr int64_t kQ4KHdr = 4 * kPNR + 16 * kPNR;               // 640: d, dmin, sc[8], m[8]
constexpr int64_t kQ4KSb = kQ4KHdr + 8 * 16 * kPNR;             // 4736
constexpr int64_t kQ6KHdr = 2 * kPNR + 16 * kPNR;               // 576: d, sc[16]
constexpr int64_t kQ6KSb = kQ6KHdr + 8 * 32 * kPNR;             // 8768
constexpr int64_t kUnitK[kNumFmts] = {32, 32, 256, 256, 32};    // k per unit
constexpr int64_t kUnitBytes[kNumFmts] = {kQBlk, kQ41Blk, kQ4KSb, kQ6KSb, kQ5Blk};

// Function table of one ISA path. Block functions take pointers already offset to the block.
struct Kern {
  // y[m, n] = dot16(x[m], w[n], K) for m < M, n < N (row strides ldx, ldw, ldy in elements)
  void (*linear_f32)(const float* x, int64_t ldx, int64_t M, const float* w, int64_t ldw, int64_t N,
                     int64_t K, float* y, int64_t ldy);
  // the same with Q8_0 weight rows of ldw bytes (K % 32 == 0)
  void (*linear_q8)(const float* x, int64_t ldx, int64_t M, const uint8_t* w, int64_t ldw, int64_t N,
                    int64_t K, float* y, int64_t ldy);
  // out[n * K + k] = float(d) * float(q) for N Q8_0 rows of ldw bytes
  void (*dequant_q8)(const uint8_t* w, int64_t ldw, int64_t N, int64_t K, float* out);
  float (*dot)(const float* a, const float* b, int64_t K);                   // dot16
  void (*scale_mul)(const float* x, float r, const float* w, float* y, int64_t n);  // (x*r)*w
  // for R heads r: out[r*ldo + d] = sum over j < n, in increasing j, of p[r*ldp + j] * v[j*D + d]
  // as a = fmaf(p, v, a) from a = 0 (the heads share one read of v)
  void (*attn_pv)(const float* p, int64_t ldp, int64_t R, const float* v, int64_t n, int64_t D, float* out,
                  int64_t ldo);
  // ---- packed family (see "Packed outer-product GEMM" below) ----
  int pmr;  // rows per packed x group of the GEMM path (M > 4)
  // y[m, c] for rows [m0, m1) (m0 % pmr == 0) and the cw padded columns of the panels at wp
  // (panel stride ps floats), of which nv <= cw are real; xpk: x packed in pmr-row groups.
  void (*gemm_p)(const float* xpk, int64_t M, int64_t K, int64_t m0, int64_t m1, const float* wp, int64_t ps,
                 int64_t cw, int64_t nv, float* y, int64_t ldy);
  // M <= 4 rows, x packed as [K][M]: the same outputs with GEMV-shaped tiles (full K per tile)
  void (*gemv_p)(const float* xp, int64_t M, int64_t K, const float* wp, int64_t ps, int64_t cw, int64_t nv,
                 float* y, int64_t ldy);
  // the same on packed quantized panels of format f (PanelFmt; panel stride psb bytes)
  void (*gemv_q[kNumFmts])(const float* xp, int64_t M, int64_t K, const uint8_t* wp, int64_t psb, int64_t cw, int64_t nv,
                    float* y, int64_t ldy);
  // np packed panels of format f -> np fp32 panels [np][K][32], the exact GGUF values
  void (*dequant_q[kNumFmts])(const uint8_t* wp, int64_t psb, int64_t np, int64_t K, float* out);
};

struct F32Panels {};  // gemv_run's tag for plain fp32 panels

// Large-M K-blocking: slices of kKBlock floats of x rows stay in L1 (only when K > kKBlockAbove).
constexpr int64_t kKBlock = 512, kKBlockAbove = 1536;
// How far ahead the quantized GEMV tiles prefetch their panel stream (bytes). Measured on a Zen 3
// core, Q8_0 panels from DRAM: 4-128 KiB all within 10%, 16 KiB best; none 0.62x of it.
constexpr int64_t kQPrefetch = 16384;  // measured: K=1024 is faster unblocked

static inline uint16_t load_u16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

}  // namespace vi

// Tiles must be fully unrolled or their accumulators spill to the stack.
#define VI_UNROLL _Pragma("GCC unroll 32")
#define VI_BODY
// ------------------------------------------------------------------ AVX-512 (one __m512 / acc)
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
namespace vi::avx512 {
struct V {
  __m512 v;
  static V zero() { return {_mm512_setzero_ps()}; }
  static V set1(float f) { return {_mm512_set1_ps(f)}; }
  static V load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static void store(float* p, V a) { _mm512_storeu_ps(p, a.v); }
  static V fma(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
  static V mul(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
  static float h2f(uint16_t h) { return _cvtsh_ss(h); }
  static V q8(const int8_t* q, V d) {  // float(q) * d, 16 weights
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    return {_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), d.v)};
  }
  static V h16(const uint8_t* p) {  // 16 fp16 -> fp32 (exact)
    return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
  }
  // nibble lanes (see nib_index): lane l = (32-bit lane l of the 64 bytes at c >> shift) & 15
  static __m512i nib(const uint8_t* c, int shift) {
    const __m512i w = _mm512_loadu_si512(c), f = _mm512_set1_epi32(15);
    if (__builtin_constant_p(shift)) {  // the GEMV tiles: an immediate shift, none at 0, no mask at 28
      if (shift == 0) return _mm512_and_si512(w, f);
      if (shift == 28) return _mm512_srli_epi32(w, 28);
      return _mm512_and_si512(_mm512_srli_epi32(w, shift), f);
    }
    return _mm512_and_si512(_mm512_srl_epi32(w, _mm_cvtsi32_si128(shift)), f);
  }
  static V q41(const uint8_t* c, int shift, V d, V m) {  // fmaf(float(nibble), d, m), 16 weights
    return {_mm512_fmadd_ps(_mm512_cvtepi32_ps(nib(c, shift)), d.v, m.v)};
  }
  // float(nibble - 16 * bit) * d, 16 weights: nibbles as q41; bits: 16 bits, lane i = bit i
  static V q5(const uint8_t* c, int shift, const uint8_t* bits, V d) {
    __m512i w = nib(c, shift);
    w = _mm512_mask_sub_epi32(w, static_cast<__mmask16>(load_u16(bits)), w, _mm512_set1_epi32(16));
    return {_mm512_mul_ps(_mm512_cvtepi32_ps(w), d.v)};
  }
};
// Fold 16 accumulators at once with the dot16 tree, transposed across registers (the same
// additions as folding each one alone, ~3x fewer instructions). out[i] = fold(acc[i]), i < n.
static inline __attribute__((always_inline)) void reduce16(const V* acc, int n, float* out) {
  __m512 r[16], c[8], e[4], g[2];
  VI_UNROLL for (int i = 0; i < 16; ++i) r[i] = i < n ? acc[i].v : _mm512_setzero_ps();
  for (int i = 0; i < 8; ++i)  // s=8: chunks [A.lo8+A.hi8 | B.lo8+B.hi8]
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // s=4: 128-bit chunk c holds acc 4i+c
    e[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // s=2
    g[i] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // s=1: lane 4c+r holds acc 4r+c; permute back to acc order
  __m512 s = _mm512_add_ps(_mm512_shuffle_ps(g[0], g[1], _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_ps(g[0], g[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(idx, s));
}
static inline __attribute__((always_inline)) void reduce(const V* acc, int n, float* out) {
  for (int i = 0; i < n; i += 16) reduce16(acc + i, n - i < 16 ? n - i : 16, out + i);
}
// Tile shapes (32 zmm registers): kMR rows x kNR[rows] weight columns of accumulators, plus the
// rows' x vectors and one weight vector in registers. Q8_0 tiles keep 2 x vectors per row.
constexpr int kMR = 6;
constexpr int kNR[7] = {0, 16, 8, 8, 4, 4, 4};
constexpr int kNRq[5] = {0, 16, 8, 4, 4};
constexpr int kPV = 16;  // attention: 16 zmm of output (D = 256) stay in registers
// Packed GEMM: kPMR rows x kPNV vectors (14 x 32 = 28 zmm accumulators, no spills; 12 x 32 and
// 6 x 64 measured the same or slower); GEMV tiles for M rows
// use kGNV[M] vectors (enough independent chains to hide FMA latency), kGNVq[M] for Q8_0.
constexpr int kPMR = 14, kPNV = 2;
constexpr int64_t kPKC = 512;
constexpr int kGNV[5] = {0, 16, 8, 6, 4};
constexpr int kGNVq[5] = {0, 8, 6, 4, 4};
#include "verinfer_kernels.cpp"
}  // namespace vi::avx512
#pragma GCC pop_options

// ------------------------------------------------------------------ AVX2 (two __m256 / acc)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace vi::avx2 {
struct V {
  __m256 lo, hi;  // lanes 0..7, 8..15
  static V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V set1(float f) { return {_mm256_set1_ps(f), _mm256_set1_ps(f)}; }
  static V load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static void store(float* p, V a) { _mm256_storeu_ps(p, a.lo), _mm256_storeu_ps(p + 8, a.hi); }
  static V fma(V a, V b, V c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static V mul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static float h2f(uint16_t h) { return _cvtsh_ss(h); }
  static V q8(const int8_t* q, V d) {
    __m128i b0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
    __m128i b1 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8));
    return {_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b0)), d.lo),
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b1)), d.hi)};
  }
  static V h16(const uint8_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
  }
  // nibble lanes (see nib_index): lanes 0..7 from c, 8..15 from c + 32
  static __m256i nib(const uint8_t* c, int shift) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)), f = _mm256_set1_epi32(15);
    if (__builtin_constant_p(shift)) {  // the GEMV tiles: an immediate shift, none at 0, no mask at 28
      if (shift == 0) return _mm256_and_si256(w, f);
      if (shift == 28) return _mm256_srli_epi32(w, 28);
      return _mm256_and_si256(_mm256_srli_epi32(w, shift), f);
    }
    return _mm256_and_si256(_mm256_srl_epi32(w, _mm_cvtsi32_si128(shift)), f);
  }
  static V q41(const uint8_t* c, int shift, V d, V m) {
    const __m256i w0 = nib(c, shift), w1 = nib(c + 32, shift);
    return {_mm256_fmadd_ps(_mm256_cvtepi32_ps(w0), d.lo, m.lo),
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(w1), d.hi, m.hi)};
  }
  static V q5(const uint8_t* q, int shift, const uint8_t* bits, V d) {
    // each 32-bit lane holds the 16 bits twice; shifting lane i left by 31 - i puts bit i in the
    // sign, which blendv reads: nibble - 16 where set
    const __m256i b = _mm256_set1_epi16(static_cast<short>(load_u16(bits)));
    const __m256i s0 = _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24);
    const __m256i s1 = _mm256_setr_epi32(23, 22, 21, 20, 19, 18, 17, 16);
    const __m256i sixteen = _mm256_set1_epi32(16);
    __m256i w0 = nib(q, shift), w1 = nib(q + 32, shift);
    const __m256 m0 = _mm256_castsi256_ps(_mm256_sllv_epi32(b, s0));
    const __m256 m1 = _mm256_castsi256_ps(_mm256_sllv_epi32(b, s1));
    w0 = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(w0),
                                              _mm256_castsi256_ps(_mm256_sub_epi32(w0, sixteen)), m0));
    w1 = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(w1),
                                              _mm256_castsi256_ps(_mm256_sub_epi32(w1, sixteen)), m1));
    return {_mm256_mul_ps(_mm256_cvtepi32_ps(w0), d.lo), _mm256_mul_ps(_mm256_cvtepi32_ps(w1), d.hi)};
  }
};
static inline __attribute__((always_inline)) void reduce(const V* acc, int n, float* out) {
  for (int i = 0; i < n; ++i) {
    __m256 t = _mm256_add_ps(acc[i].lo, acc[i].hi);                                    // s=8
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));  // s=4
    u = _mm_add_ps(u, _mm_movehl_ps(u, u));                                          // s=2
    out[i] = _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));                       // s=1
  }
}
constexpr int kMR = 2;  // 16 ymm registers: at most 4 accumulators (8 ymm) per tile
constexpr int kNR[7] = {0, 4, 2, 1, 1, 1, 1};
constexpr int kNRq[5] = {0, 4, 2, 1, 1};
constexpr int kPV = 4;
constexpr int kPMR = 6, kPNV = 1;  // 12 ymm accumulators
constexpr int64_t kPKC = 256;
constexpr int kGNV[5] = {0, 4, 2, 2, 1};
constexpr int kGNVq[5] = {0, 2, 2, 1, 1};
#include "verinfer_kernels.cpp"
}  // namespace vi::avx2
#pragma GCC pop_options

// ------------------------------------------------------------------ portable scalar
namespace vi::scalar {
struct V {
  float l[16];
  static V zero() { return V{}; }
  static V set1(float f) {
    V r;
    for (float& x : r.l) x = f;
    return r;
  }
  static V load(const float* p) {
    V r;
    std::memcpy(r.l, p, sizeof r.l);
    return r;
  }
  static void store(float* p, const V& a) { std::memcpy(p, a.l, sizeof a.l); }
  static V fma(const V& a, const V& b, const V& c) {
    V r;
    for (int i = 0; i < 16; ++i) r.l[i] = std::fma(a.l[i], b.l[i], c.l[i]);
    return r;
  }
  static V mul(const V& a, const V& b) {
    V r;
    for (int i = 0; i < 16; ++i) r.l[i] = a.l[i] * b.l[i];
    return r;
  }
  static float h2f(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }
  static V q8(const int8_t* q, const V& d) {
    V r;
    for (int i = 0; i < 16; ++i) r.l[i] = static_cast<float>(q[i]) * d.l[i];
    return r;
  }
  static V h16(const uint8_t* p) {
    V r;
    for (int i = 0; i < 16; ++i) r.l[i] = h2f(load_u16(p + 2 * i));
    return r;
  }
  static int nib(const uint8_t* c, int i, int shift) {  // lane i (see nib_index)
    const uint32_t w = static_cast<uint32_t>(c[4 * i]) | static_cast<uint32_t>(c[4 * i + 1]) << 8 |
                       static_cast<uint32_t>(c[4 * i + 2]) << 16 | static_cast<uint32_t>(c[4 * i + 3]) << 24;
    return static_cast<int>((w >> shift) & 15);
  }
  static V q41(const uint8_t* c, int shift, const V& d, const V& m) {
    V r;
    for (int i = 0; i < 16; ++i) r.l[i] = std::fma(static_cast<float>(nib(c, i, shift)), d.l[i], m.l[i]);
    return r;
  }
  static V q5(const uint8_t* c, int shift, const uint8_t* bits, const V& d) {
    const uint16_t b = load_u16(bits);
    V r;
    for (int i = 0; i < 16; ++i)
      r.l[i] = static_cast<float>(nib(c, i, shift) - 16 * ((b >> i) & 1)) * d.l[i];
    return r;
  }
};
static inline void reduce(const V* acc, int n, float* out) {
  for (int i = 0; i < n; ++i) {
    float t[16];
    std::memcpy(t, acc[i].l, sizeof t);
    for (int s = 8; s >= 1; s >>= 1)
      for (int j = 0; j < s; ++j) t[j] = t[j] + t[j + s];
    out[i] = t[0];
  }
}
constexpr int kMR = 4;
constexpr int kNR[7] = {0, 1, 1, 1, 1, 1, 1};
constexpr int kNRq[5] = {0, 1, 1, 1, 1};
constexpr int kPV = 1;
constexpr int kPMR = 4, kPNV = 1;
constexpr int64_t kPKC = 256;
constexpr int kGNV[5] = {0, 1, 1, 1, 1};
constexpr int kGNVq[5] = {0, 1, 1, 1, 1};
#include "verinfer_kernels.cpp"
}  // namespace vi::scalar
#undef VI_BODY

// ------------------------------------------------------------------ dispatch + torch ops
namespace vi {

enum Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
static const char* const kIsaNames[3] = {"scalar", "avx2", "avx512"};
static const Kern kKerns[3] = {scalar::kKern, avx2::kKern, avx512::kKern};

static bool isa_supported(int isa) {
  __builtin_cpu_init();
  if (isa == kAvx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (isa == kAvx2)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  return true;
}
static int best_isa() { return isa_supported(kAvx512) ? kAvx512 : isa_supported(kAvx2) ? kAvx2 : kScalar; }
static std::atomic<int> g_isa{best_isa()};
static const Kern& kern() { return kKerns[g_isa.load(std::memory_order_relaxed)]; }

std::string isa() { return kIsaNames[g_isa.load()]; }
void set_isa(const std::string& name) {
  if (name == "auto") return g_isa.store(best_isa());
  for (int i = 0; i < 3; ++i)
    if (name == kIsaNames[i]) {
      TORCH_CHECK(isa_supported(i), "ISA path '", name, "' is not supported by this CPU");
      return g_isa.store(i);
    }
  TORCH_CHECK(false, "unknown ISA path '", name, "' (auto, scalar, avx2, avx512)");
}
std::vector<std::string> supported_isas() {
  std::vector<std::string> r;
  for (int i = 0; i < 3; ++i)
    if (isa_supported(i)) r.emplace_back(kIsaNames[i]);
  return r;
}

static void check_f32(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, name, " must be a float32 CPU tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(dim < 0 || t.dim() == dim, name, " must have ", dim, " dims");
}

// ---- decode-step parallelism (verinfer_pool.h). One pool per thread count, kept for the
// process's life: torch's thread count is per calling thread (the engine's worker and the main
// thread may differ), so one shared pool resized on demand would churn threads between them;
// idle workers sleep. A forked child inherits the pointers but not the threads: it drops them
// (leaked, never freed) and starts its own.
constexpr int kMaxPoolThreads = 256;
static std::mutex g_pool_mu;
static SpinPool* g_pools[kMaxPoolThreads + 1] = {};
static pid_t g_pool_pid = 0;
static std::atomic<bool> g_pool_enabled{true};
void set_spin_pool(bool on) { g_pool_enabled.store(on); }
static SpinPool* spin_pool() {
  const int threads = at::get_num_threads();
  if (threads <= 1 || threads > kMaxPoolThreads || !g_pool_enabled.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lk(g_pool_mu);
  const pid_t pid = getpid();
  if (g_pool_pid != pid) std::fill(std::begin(g_pools), std::end(g_pools), nullptr), g_pool_pid = pid;
  SpinPool*& pool = g_pools[threads];
  if (pool == nullptr) pool = new SpinPool(threads);
  return pool;
}
// fn(b, e) over `tasks` contiguous ranges covering [0, n), on the spin pool's threads (or
// at::parallel_for's when the pool is off or busy). Ranges decide only who computes what.
template <class F>
static void par_ranges(int64_t n, int64_t tasks, const F& fn) {
  tasks = std::min(tasks, n);
  if (tasks <= 1) return fn(int64_t{0}, n);
  const std::function<void(int64_t)> task = [&](int64_t i) { fn(n * i / tasks, n * (i + 1) / tasks); };
  SpinPool* pool = spin_pool();
  if (pool != nullptr && pool->run(tasks, task)) return;
  at::parallel_for(0, tasks, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) task(i);
  });
}

constexpr int64_t kColTile = 16;  // multiple of every kNR, so chunk edges never split a tile
constexpr int64_t kRowChunk = 48;  // a multiple of every ISA's row group (6, 4, 2)

// Large M: tasks are (weight panel, row chunk) pairs, panel-major; a panel of ~256 KiB of fp32
// weight rows stays in L2 while row groups of x stream past it.
static int64_t panel_rows(int64_t K) {
  // ~256 KiB of weights per panel; with K-blocking, 64 rows (a 128 KiB slice; measured best).
  const int64_t rows = K > kKBlockAbove ? 64 : 65536 / K;
  return std::max<int64_t>(kColTile, rows / kColTile * kColTile);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w) {
  check_f32(x, "x", 2), check_f32(w, "w", 2);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K, "w has K=", w.size(1), " but x has K=", K);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const Kern& kn = kern();
  if (M <= 4) {  // GEMV-like: every weight row is read once for all rows
    at::parallel_for(0, (N + kColTile - 1) / kColTile, 1, [&](int64_t b, int64_t e) {
      const int64_t n0 = b * kColTile, n1 = std::min(N, e * kColTile);
      kn.linear_f32(xp, K, M, wp + n0 * K, K, n1 - n0, K, yp + n0, N);
    });
    return y;
  }
  const int64_t NB = panel_rows(K), np = (N + NB - 1) / NB, nm = (M + kRowChunk - 1) / kRowChunk;
  at::parallel_for(0, np * nm, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t n0 = (t / nm) * NB, n1 = std::min(N, n0 + NB);
      const int64_t m0 = (t % nm) * kRowChunk, m1 = std::min(M, m0 + kRowChunk);
      kn.linear_f32(xp + m0 * K, K, m1 - m0, wp + n0 * K, K, n1 - n0, K, yp + m0 * N + n0, N);
    }
  });
  return y;
}

at::Tensor linear_q8_0(const at::Tensor& x, const at::Tensor& wq, int64_t K) {
  check_f32(x, "x", 2);
  TORCH_CHECK(wq.device().is_cpu() && wq.scalar_type() == at::kByte && wq.is_contiguous() && wq.dim() == 2,
              "wq must be a contiguous 2-D uint8 CPU tensor");
  TORCH_CHECK(K > 0 && K % 32 == 0, "Q8_0 needs K % 32 == 0, got K=", K);
  TORCH_CHECK(x.size(1) == K, "x has K=", x.size(1), " but K=", K);
  const int64_t M = x.size(0), N = wq.size(0), ldw = K / 32 * 34;
  TORCH_CHECK(wq.size(1) == ldw, "wq rows must be K/32*34=", ldw, " bytes, got ", wq.size(1));
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const float* xp = x.data_ptr<float>();
  const uint8_t* wp = wq.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const Kern& kn = kern();
  if (M <= 4) {  // fused dequantize + dot: reads 34/128 of the fp32 bytes
    at::parallel_for(0, (N + kColTile - 1) / kColTile, 1, [&](int64_t b, int64_t e) {
      const int64_t n0 = b * kColTile, n1 = std::min(N, e * kColTile);
      kn.linear_q8(xp, K, M, wp + n0 * ldw, ldw, n1 - n0, K, yp + n0, N);
    });
    return y;
  }
  // Large M: dequantize a panel into fp32 scratch (exact) and reuse the fp32 kernel: same bits.
  const int64_t NB = panel_rows(K), np = (N + NB - 1) / NB, nm = (M + kRowChunk - 1) / kRowChunk;
  at::parallel_for(0, np * nm, 1, [&](int64_t b, int64_t e) {
    std::vector<float> panel(NB * K);
    int64_t have = -1;
    for (int64_t t = b; t < e; ++t) {
      const int64_t p = t / nm, n0 = p * NB, n1 = std::min(N, n0 + NB);
      const int64_t m0 = (t % nm) * kRowChunk, m1 = std::min(M, m0 + kRowChunk);
      if (p != have) kn.dequant_q8(wp + n0 * ldw, ldw, n1 - n0, K, panel.data()), have = p;
      kn.linear_f32(xp + m0 * K, K, m1 - m0, panel.data(), K, n1 - n0, K, yp + m0 * N + n0, N);
    }
  });
  return y;
}

at::Tensor dequantize_q8_0(const at::Tensor& wq, int64_t K) {
  TORCH_CHECK(wq.device().is_cpu() && wq.scalar_type() == at::kByte && wq.is_contiguous() && wq.dim() == 2,
              "wq must be a contiguous 2-D uint8 CPU tensor");
  TORCH_CHECK(K > 0 && K % 32 == 0 && wq.size(1) == K / 32 * 34, "bad Q8_0 row size for K=", K);
  const int64_t N = wq.size(0), ldw = K / 32 * 34;
  at::Tensor out = at::empty({N, K}, wq.options().dtype(at::kFloat));
  const uint8_t* wp = wq.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  const Kern& kn = kern();
  at::parallel_for(0, N, 256, [&](int64_t b, int64_t e) { kn.dequant_q8(wp + b * ldw, ldw, e - b, K, op + b * K); });
  return out;
}

// exp(x) from correctly rounded IEEE operations only (add, sub, mul, div, exact int<->float
// and bit moves), so its bits depend on this code alone: not on the libm version of the
// machine (glibc's expf/tanhf are not guaranteed to agree across versions, and a verifier on
// another libc must reproduce every bit). Any auto-vectorization keeps the bits, because each
// lane performs the same correctly rounded operations; -ffp-contract=off forbids fusing.
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, Cephes degree-6 polynomial (~1 ulp).
static inline float vi_expf(float x) {
  x = x < -87.33654f ? -87.33654f : x;  // exp(-87.34) ~ FLT_MIN: no denormal results
  x = x > 88.72283f ? 88.72283f : x;
  const float big = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer (to nearest)
  const float t = x * 1.44269504088896341f + big;
  const float n = t - big;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // n*hi is exact
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * (r * r) + r) + 1.0f;
  const int32_t e = static_cast<int32_t>(n);
  // 2^n for n in [-126, 128]: split as 2^(n/2) * 2^(n - n/2) so n = 128 does not overflow.
  const int32_t e1 = e / 2, e2 = e - e1;
  int32_t b1 = (e1 + 127) << 23, b2 = (e2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4), std::memcpy(&s2, &b2, 4);
  return (p * s1) * s2;
}

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_f32(x, "x", 2), check_f32(w, "w", 1);
  const int64_t M = x.size(0), n = x.size(1);
  TORCH_CHECK(w.size(0) == n && n > 0, "w must have ", n, " elements");
  at::Tensor y = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  const Kern& kn = kern();
  at::parallel_for(0, M, 16, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const float* xr = xp + m * n;
      const float r = 1.0f / std::sqrt(kn.dot(xr, xr, n) / static_cast<float>(n) + feps);
      kn.scale_mul(xr, r, wp, yp + m * n, n);
    }
  });
  return y;
}

// Per-head RMSNorm then rotary in the NeoX/HF half layout (Gemma's q/k path) in one pass:
// x [T, H, D] -> y with n = rmsnorm(x[t, h]) exactly as rmsnorm() above, then for i < D/2
//   y[i] = n[i] * c[i] - n[i + D/2] * s[i],   y[i + D/2] = n[i + D/2] * c[i] + n[i] * s[i]
// with c, s = cos[t], sin[t]: every product and sum rounded on its own (-ffp-contract=off), as
// PyTorch's elementwise ops in models/common.py rope_half round them, so the bits are the same.
at::Tensor rmsnorm_rope_half(const at::Tensor& x, const at::Tensor& w, double eps, const at::Tensor& cos,
                             const at::Tensor& sin) {
  check_f32(x, "x", 3), check_f32(w, "w", 1), check_f32(cos, "cos", 2), check_f32(sin, "sin", 2);
  const int64_t T = x.size(0), H = x.size(1), D = x.size(2), h = D / 2;
  TORCH_CHECK(D > 0 && D % 2 == 0 && w.size(0) == D, "x must be [T, H, D] with even D and w [D]");
  TORCH_CHECK(cos.size(0) == T && cos.size(1) == h && sin.sizes() == cos.sizes(), "cos and sin must be [T, D/2]");
  at::Tensor y = at::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  const Kern& kn = kern();
  at::parallel_for(0, T * H, 64, [&](int64_t b, int64_t e) {
    std::vector<float> nrm(D);
    for (int64_t r = b; r < e; ++r) {
      const float* xr = xp + r * D;
      const float inv = 1.0f / std::sqrt(kn.dot(xr, xr, D) / static_cast<float>(D) + feps);
      kn.scale_mul(xr, inv, wp, nrm.data(), D);
      const float *c = cp + (r / H) * h, *s = sp + (r / H) * h;
      float* yr = yp + r * D;
      for (int64_t i = 0; i < h; ++i) {
        const float a = nrm[i], bb = nrm[i + h];
        yr[i] = a * c[i] - bb * s[i];
        yr[i + h] = bb * c[i] + a * s[i];
      }
    }
  });
  return y;
}

// Elementwise; vi_expf is plain IEEE arithmetic, so one C path serves every ISA with the same bits.
// Grain: a decode step's 2048..8192 elements take ~13-50 us on one thread, less than waking the
// second one costs inside a real decode on a shared machine (measured ~70 us per region).
constexpr int64_t kElementwiseGrain = 16384;
// Gemma's MLP: 0.5 v (1 + tanh(a)) = v / (1 + exp(-2a)): one exp, no cancellation for a << 0.
static inline float gelu_tanh_mul1(float v, float u) {
  const float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
  return (v / (1.0f + vi_expf(-2.0f * inner))) * u;
}
// Llama's MLP: y = (g / (1.0f + exp(-g))) * u, plain float32 ops in this order (vi_expf).
static inline float silu_mul1(float g, float u) { return (g / (1.0f + vi_expf(-g))) * u; }

// The same three functions 8 lanes at a time: every lane performs exactly the scalar code's
// correctly rounded operations in its order (max/min as the scalar clamps, NaN kept; a
// truncating convert; C's e / 2 toward zero), so the bits are the scalar path's; no FMA
// (-ffp-contract=off keeps each mul and add apart). test_kernels.py compares them on every ISA
// path, extremes included. ~5x the scalar loop on a Zen 3 core (Gemma's 18 GELUs per token).
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace elementwise_avx2 {
static inline __m256 expf8(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.33654f), x);  // c > x ? c : x: x < c ? c : x, NaN kept
  x = _mm256_min_ps(_mm256_set1_ps(88.72283f), x);   // c < x ? c : x: x > c ? c : x
  const __m256 big = _mm256_set1_ps(12582912.0f);
  const __m256 t = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), big);
  const __m256 n = _mm256_sub_ps(t, big);
  const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f))),
                                 _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_cvttps_epi32(n);
  const __m256i e1 = _mm256_srai_epi32(_mm256_add_epi32(e, _mm256_srli_epi32(e, 31)), 1);  // e / 2
  const __m256i e2 = _mm256_sub_epi32(e, e1);
  const __m256i k127 = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, k127), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, k127), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}
static void gelu_tanh_mul(const float* g, const float* u, float* y, int64_t n) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(g + i);
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), v), v), v);
    const __m256 inner = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f), _mm256_add_ps(v, cube));
    const __m256 ex = expf8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), inner));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(v, _mm256_add_ps(one, ex)), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) y[i] = gelu_tanh_mul1(g[i], u[i]);
}
static void silu_mul(const float* g, const float* u, float* y, int64_t n) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(g + i);
    const __m256 ex = expf8(_mm256_xor_ps(v, neg));  // -g: a sign flip, as the scalar negation
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(v, _mm256_add_ps(one, ex)), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) y[i] = silu_mul1(g[i], u[i]);
}
}  // namespace elementwise_avx2
#pragma GCC pop_options

template <class F1>
static at::Tensor glu_elementwise(const at::Tensor& gate, const at::Tensor& up, F1 one,
                                  void (*vec)(const float*, const float*, float*, int64_t)) {
  check_f32(gate, "gate", -1), check_f32(up, "up", -1);
  TORCH_CHECK(gate.sizes() == up.sizes(), "gate and up must have the same shape");
  at::Tensor y = at::empty_like(gate);
  const float* g = gate.data_ptr<float>();
  const float* u = up.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const bool simd = g_isa.load(std::memory_order_relaxed) != kScalar;  // every path: the same bits
  at::parallel_for(0, gate.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    if (simd) return vec(g + b, u + b, yp + b, e - b);
    for (int64_t i = b; i < e; ++i) yp[i] = one(g[i], u[i]);
  });
  return y;
}
at::Tensor gelu_tanh_mul(const at::Tensor& gate, const at::Tensor& up) {
  return glu_elementwise(gate, up, gelu_tanh_mul1, elementwise_avx2::gelu_tanh_mul);
}
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  return glu_elementwise(gate, up, silu_mul1, elementwise_avx2::silu_mul);
}

constexpr int64_t kSerialAttnWork = 1 << 19, kSpinAttnWork = 1 << 15;
at::Tensor attention(const at::Tensor& q, const std::vector<at::Tensor>& kc, const std::vector<at::Tensor>& vc,
                     const at::Tensor& seq, const at::Tensor& pos, int64_t window, double scale) {
  check_f32(q, "q", 3);
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  TORCH_CHECK(!kc.empty() && kc.size() == vc.size(), "k_caches and v_caches must be equal-length, non-empty");
  const int64_t KV = kc[0].dim() == 3 ? kc[0].size(0) : -1;
  TORCH_CHECK(KV > 0 && H % KV == 0, "caches must be [KV, cap, D] with H % KV == 0");
  std::vector<const float*> kp, vp;
  std::vector<int64_t> caps;  // capacities may differ per sequence
  for (size_t i = 0; i < kc.size(); ++i) {
    check_f32(kc[i], "k_cache", 3), check_f32(vc[i], "v_cache", 3);
    TORCH_CHECK(kc[i].size(0) == KV && kc[i].size(2) == D && vc[i].sizes() == kc[i].sizes(),
                "cache ", i, " must be [", KV, ", cap, ", D, "] for both k and v");
    kp.push_back(kc[i].data_ptr<float>()), vp.push_back(vc[i].data_ptr<float>());
    caps.push_back(kc[i].size(1));
  }
  for (const at::Tensor* t : {&seq, &pos})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous() && t->dim() == 1 && t->size(0) == T,
                "seq and pos must be contiguous int64 [T]");
  const int64_t* sp = seq.data_ptr<int64_t>();
  const int64_t* pp = pos.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(sp[t] >= 0 && sp[t] < static_cast<int64_t>(kc.size()) && pp[t] >= 0 && pp[t] < caps[sp[t]],
                "token ", t, ": seq/pos out of range");
  at::Tensor out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  const int64_t group = H / KV;
  const Kern& kn = kern();
  // Tasks are (t, h) pairs; consecutive heads of one token that share a KV head are done
  // together so K and V are read once for them (per-head arithmetic is unchanged by this).
  // Calls under kSerialAttnWork multiply-adds per pass (a decode step at short context) run on
  // the calling thread: waking the second one costs more there (see kSerialGemvBytes).
  int64_t work = 0;
  for (int64_t t = 0; t < T; ++t) work += window > 0 ? std::min<int64_t>(pp[t] + 1, window) : pp[t] + 1;
  const auto heads = [&](int64_t b, int64_t e) {
    std::vector<float> sc;
    for (int64_t i = b, i2; i < e; i = i2) {
      const int64_t t = i / H, g = (i % H) / group, p = pp[t];
      i2 = std::min(e, t * H + (g + 1) * group);  // heads i..i2-1 of token t use KV head g
      const int64_t r = i2 - i;
      const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0, n = p - lo + 1;
      const float* kb = kp[sp[t]] + (g * caps[sp[t]] + lo) * D;
      const float* vb = vp[sp[t]] + (g * caps[sp[t]] + lo) * D;
      sc.resize(r * n);
      kn.linear_f32(qp + i * D, D, r, kb, D, n, D, sc.data(), n);  // s[h][j] = dot16(q_h, K[j], D)
      for (int64_t h = 0; h < r; ++h) {  // softmax of one head, sequential in j
        float* s = sc.data() + h * n;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) s[j] = s[j] * fscale, mx = s[j] > mx ? s[j] : mx;
        float den = 0.0f;
        for (int64_t j = 0; j < n; ++j) s[j] = vi_expf(s[j] - mx), den = den + s[j];
        for (int64_t j = 0; j < n; ++j) s[j] = s[j] / den;
      }
      kn.attn_pv(sc.data(), n, r, vb, n, D, op + i * D, D);
    }
  };
  // A decode step (one token) splits its heads over the spinning pool, as the GEMVs around it
  // do (a region costs ~1-2 us there; a head group split in two reads its K and V twice, from
  // cache): Gemma 3 270M's 4 query heads share one KV head, so the OpenMP grain below kept
  // each layer's attention on one thread (~36 us at short context on a Zen 3 core).
  if (T == 1 && H > 1 && work * H * D >= kSpinAttnWork && g_pool_enabled.load(std::memory_order_relaxed)) {
    par_ranges(H, std::min<int64_t>(H, at::get_num_threads()), heads);
    return out;
  }
  const int64_t grain = work * H * D < kSerialAttnWork ? T * H : 1;
  at::parallel_for(0, T * H, grain, heads);
  return out;
}

// ---------------------------------------------------------------- packed family (torch ops)
// pack_f32: w [N, K] -> [P = ceil(N/32)][K][32] fp32, wp[p][k][i] = w[32p + i][k] (0 for
// 32p + i >= N). pack_quant: GGUF rows -> quantized panels (PanelFmt); e.g. Q8_0 -> [P][K/32][1088]: per panel and
// 32-k block, 32 fp16 scales d[i] (64 bytes), then q[kk][i] (32 x 32 int8, k-major); padding
// rows have d = 0, q = 0. linear_packed / linear_q8_0_packed: y[m, n] = fmaf chain over k.
static constexpr int64_t kGemvMaxRows = 4;
// Decode GEMVs on the spin pool: matrices under kSerialSpinBytes stay on the calling thread
// (a region costs ~1-2 us there); larger ones split into kGemvTasksPerThread ranges per thread,
// claimed dynamically, so a descheduled thread's share goes to the others.
constexpr int64_t kSerialSpinBytes = 1 << 16, kGemvTasksPerThread = 4;

at::Tensor pack_f32(const at::Tensor& w) {
  check_f32(w, "w", 2);
  const int64_t N = w.size(0), K = w.size(1), P = (N + kPNR - 1) / kPNR;
  TORCH_CHECK(N > 0 && K > 0, "w must be non-empty");
  at::Tensor out = at::empty({P, K, kPNR}, w.options());
  const float* src = w.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, P, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      float* o = dst + p * K * kPNR;
      for (int64_t i = 0; i < kPNR; ++i) {
        const int64_t n = p * kPNR + i;
        if (n >= N)
          for (int64_t k = 0; k < K; ++k) o[k * kPNR + i] = 0.0f;
        else
          for (int64_t k = 0; k < K; ++k) o[k * kPNR + i] = src[n * K + k];
      }
    }
  });
  return out;
}

// ---- GGUF block types -> packed panels (layouts at PanelFmt). pack(row, j, unit, i) writes row i
// of the panel's 32-k block j (k = 32 j .. 32 j + 31) into `unit`, the panel unit holding that
// block, reading the GGUF row `row` (all its blocks).
static inline float half_bits_to_float(const uint8_t* p) {
  return static_cast<float>(c10::Half(load_u16(p), c10::Half::from_bits()));
}

static void pack_q8_0_block(const uint8_t* row, int64_t j, uint8_t* blk, int64_t i) {
  const uint8_t* src = row + j * 34;  // fp16 d, 32 x int8 q
  std::memcpy(blk + 2 * i, src, 2);
  for (int64_t kk = 0; kk < 32; ++kk) blk[2 * kPNR + kk * kPNR + i] = src[2 + kk];
}
static void pack_q5_0_block(const uint8_t* row, int64_t j, uint8_t* blk, int64_t i) {
  const uint8_t* src = row + j * 22;  // fp16 d, uint32 qh (bit kk = 5th bit of q[kk]), 16 B nibbles
  uint32_t qh;
  std::memcpy(&qh, src + 2, 4);
  std::memcpy(blk + 2 * i, src, 2);
  uint8_t* bits = blk + 2 * kPNR;  // word kk, bit i: row i's 5th bit at k = kk is clear
  for (int64_t kk = 0; kk < 32; ++kk)
    if (!((qh >> kk) & 1)) bits[4 * kk + i / 8] |= static_cast<uint8_t>(1u << (i % 8));
  for (int64_t kp = 0; kp < 16; ++kp) blk[2 * kPNR + 4 * 32 + nib_index(kp, i)] = src[6 + kp];  // GGUF's order
}
// Q5_0 rows into kQ8 panels: int8 q5 - 16 and the file's d, so w = float(q5 - 16) * d as gguf
// computes it (1.06 B/weight instead of 0.69; see q5_0_panels for when that pays).
static void pack_q5_0_int8_block(const uint8_t* row, int64_t j, uint8_t* blk, int64_t i) {
  const uint8_t* src = row + j * 22;
  uint32_t qh;
  std::memcpy(&qh, src + 2, 4);
  std::memcpy(blk + 2 * i, src, 2);
  for (int64_t kk = 0; kk < 32; ++kk) {
    const int nib = kk < 16 ? src[6 + kk] & 15 : src[6 + kk - 16] >> 4;
    const int q5 = nib | static_cast<int>((qh >> kk) & 1) << 4;
    blk[2 * kPNR + kk * kPNR + i] = static_cast<uint8_t>(static_cast<int8_t>(q5 - 16));
  }
}
static void pack_q4_1_block(const uint8_t* row, int64_t j, uint8_t* blk, int64_t i) {
  const uint8_t* src = row + j * 20;  // fp16 d, fp16 m, 16 B: byte kp = q[kp] | q[kp + 16] << 4
  std::memcpy(blk + 2 * i, src, 2);
  std::memcpy(blk + 2 * kPNR + 2 * i, src + 2, 2);
  for (int64_t kp = 0; kp < 16; ++kp) blk[4 * kPNR + nib_index(kp, i)] = src[4 + kp];
}
static void pack_q4_k_block(const uint8_t* row, int64_t j, uint8_t* sbo, int64_t i) {
  // super-block of 256: fp16 d, fp16 dmin, 12 B of 6-bit (sc, m) for 8 sub-blocks, 128 B nibbles
  const uint8_t* sb = row + (j / 8) * 144;
  const int64_t sub = j % 8;
  const uint8_t* b = sb + 4;
  int sc, m;  // gguf.quants.Q4_K.get_scale_min
  if (sub < 4) {
    sc = b[sub] & 63, m = b[sub + 4] & 63;
  } else {
    sc = (b[sub + 4] & 15) | ((b[sub - 4] >> 2) & 0x30);
    m = (b[sub + 4] >> 4) | ((b[sub] >> 2) & 0x30);
  }
  std::memcpy(sbo + 2 * i, sb, 2);
  const uint16_t ndmin = static_cast<uint16_t>(load_u16(sb + 2) ^ 0x8000u);  // -dmin: exact (sign bit)
  std::memcpy(sbo + 2 * kPNR + 2 * i, &ndmin, 2);
  sbo[4 * kPNR + sub * kPNR + i] = static_cast<uint8_t>(sc);
  sbo[12 * kPNR + sub * kPNR + i] = static_cast<uint8_t>(m);
  const uint8_t* qs = sb + 16 + 32 * (sub / 2);  // sub-block 2c: low nibbles of qs[32c ..], 2c+1: high
  const int sh = 4 * static_cast<int>(sub & 1);
  uint8_t* blk = sbo + kQ4KHdr + sub * 16 * kPNR;
  for (int64_t kp = 0; kp < 16; ++kp)
    blk[nib_index(kp, i)] = static_cast<uint8_t>(((qs[kp] >> sh) & 15) | (((qs[kp + 16] >> sh) & 15) << 4));
}
static void pack_q6_k_block(const uint8_t* row, int64_t j, uint8_t* sbo, int64_t i) {
  // super-block of 256: 128 B low nibbles, 64 B 2-bit highs, 16 int8 scales (one per 16), fp16 d
  const uint8_t* sb = row + (j / 8) * 210;
  const uint8_t *ql = sb, *qh = sb + 128;
  const int64_t sub = j % 8, kb = sub * 32;
  std::memcpy(sbo + 2 * i, sb + 208, 2);
  sbo[2 * kPNR + (2 * sub) * kPNR + i] = sb[192 + 2 * sub];
  sbo[2 * kPNR + (2 * sub + 1) * kPNR + i] = sb[192 + 2 * sub + 1];
  uint8_t* blk = sbo + kQ6KHdr + sub * 32 * kPNR;
  for (int64_t kk = 0; kk < 32; ++kk) {  // gguf.quants.Q6_K.dequantize_blocks' index order
    const int64_t k = kb + kk, h = k / 128, r = k % 128;
    const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 15, hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
    blk[kk * kPNR + i] = static_cast<uint8_t>(static_cast<int8_t>((lo | (hi << 4)) - 32));
  }
}

struct GgufType {
  const char* name;
  int64_t blk_k, blk_bytes;  // weights and bytes of one GGUF block
  PanelFmt fmt;
  void (*pack)(const uint8_t* row, int64_t j, uint8_t* unit, int64_t i);
};
static const GgufType kGgufTypes[] = {
    {"Q8_0", 32, 34, kQ8, pack_q8_0_block},    {"Q5_0:5bit", 32, 22, kQ5, pack_q5_0_block},
    {"Q5_0:int8", 32, 22, kQ8, pack_q5_0_int8_block},
    {"Q4_1", 32, 20, kQ41, pack_q4_1_block},   {"Q4_K", 256, 144, kQ4K, pack_q4_k_block},
    {"Q6_K", 256, 210, kQ6K, pack_q6_k_block},
};
// Which panels plain "Q5_0" packs into, fixed for the process (packed tensors outlive any
// switch): 5-bit panels (the file's size) where AVX-512 merges the 5th bit with one masked
// subtract; int8 panels where that merge costs several AVX2 instructions per 8 weights. Measured
// on a 2-core AMD EPYC (Zen 3, AVX2), Gemma 3 270M decode at 2 threads: the 5-bit merge made
// Q5_0 the slowest format per weight (12 G weights/s vs 15.6 for int8 panels). Both decode to
// the same bits; VERINFER_Q5_PANELS=5bit|int8 overrides the choice.
static const char* q5_0_panels() {
  static const char* const choice = [] {
    const char* env = std::getenv("VERINFER_Q5_PANELS");
    const std::string e = env ? env : "";
    if (e == "5bit") return "Q5_0:5bit";
    if (e == "int8") return "Q5_0:int8";
    TORCH_CHECK(e.empty() || e == "auto", "VERINFER_Q5_PANELS must be 5bit, int8 or auto, got '", e, "'");
    return __builtin_cpu_supports("avx512f") ? "Q5_0:5bit" : "Q5_0:int8";
  }();
  return choice;
}
// A panel type: a GGUF block type, or for Q5_0 one of its two panel forms by name.
static const GgufType& gguf_type(const std::string& name) {
  const std::string n = name == "Q5_0" ? q5_0_panels() : name;
  for (const GgufType& t : kGgufTypes)
    if (n == t.name) return t;
  TORCH_CHECK(false, "unsupported GGUF block type '", name, "' (Q8_0, Q5_0, Q5_0:5bit, Q5_0:int8, Q4_1, Q4_K, Q6_K)");
}
std::string panel_format(const std::string& qtype) {
  static const char* const kNames[kNumFmts] = {"q8", "q4_1", "q4_k", "q6_k", "q5_0"};
  return kNames[gguf_type(qtype).fmt];
}

at::Tensor pack_quant(const at::Tensor& wq, const std::string& qtype, int64_t K) {
  const GgufType& t = gguf_type(qtype);
  TORCH_CHECK(wq.device().is_cpu() && wq.scalar_type() == at::kByte && wq.is_contiguous() && wq.dim() == 2,
              "wq must be a contiguous 2-D uint8 CPU tensor");
  TORCH_CHECK(K > 0 && K % t.blk_k == 0, qtype, " needs K % ", t.blk_k, " == 0, got K=", K);
  const int64_t ldw = K / t.blk_k * t.blk_bytes;
  TORCH_CHECK(wq.size(1) == ldw, "wq rows must be ", ldw, " bytes for ", qtype, " with K=", K, ", got ", wq.size(1));
  const int64_t N = wq.size(0), P = (N + kPNR - 1) / kPNR, nb = K / 32;
  const int64_t uk = kUnitK[t.fmt] / 32, ub = kUnitBytes[t.fmt], nu = nb / uk;
  TORCH_CHECK(N > 0, "wq must be non-empty");
  at::Tensor out = at::zeros({P, nu, ub}, wq.options());  // padding rows: all zero, so w = 0
  const uint8_t* src = wq.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, P, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p)
      for (int64_t i = 0; i < kPNR && p * kPNR + i < N; ++i)
        for (int64_t j = 0; j < nb; ++j) t.pack(src + (p * kPNR + i) * ldw, j, dst + (p * nu + j / uk) * ub, i);
  });
  return out;
}
at::Tensor pack_q8_0(const at::Tensor& wq, int64_t K) { return pack_quant(wq, "Q8_0", K); }
at::Tensor pack_q4_1(const at::Tensor& wq, int64_t K) { return pack_quant(wq, "Q4_1", K); }

// x [M, K] -> groups of g rows (the last one r = M % g rows), each packed [k][rows].
static at::Tensor pack_x(const at::Tensor& x, int64_t g) {
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor out = at::empty({M * K}, x.options());
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, (M + g - 1) / g, 1, [&](int64_t b, int64_t e) {
    for (int64_t grp = b; grp < e; ++grp) {
      const int64_t m0 = grp * g, r = std::min(g, M - m0);
      float* o = dst + m0 * K;
      for (int64_t k = 0; k < K; ++k)
        for (int64_t i = 0; i < r; ++i) o[k * r + i] = src[(m0 + i) * K + k];
    }
  });
  return out;
}

static int64_t check_packed_n(int64_t n, int64_t P) {
  TORCH_CHECK(n > 0 && (n + kPNR - 1) / kPNR == P, "n=", n, " does not match ", P, " packed panels of ", kPNR);
  return n;
}

// Large M: tasks are (group of G panels, block of MB rows), panel-major; G shrinks until there
// are enough tasks for the threads. Tiling decides only where outputs are computed, never how.
struct Tasks {
  int64_t G, ng, MB, nmb;
};
static Tasks gemm_tasks(int64_t M, int64_t P, int pmr) {
  Tasks t;
  t.MB = pmr * 16;
  t.nmb = (M + t.MB - 1) / t.MB;
  t.G = 4;
  const int64_t want = 4 * at::get_num_threads();
  while (t.G > 1 && (P + t.G - 1) / t.G * t.nmb < want) t.G /= 2;
  t.ng = (P + t.G - 1) / t.G;
  return t;
}

at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& wp, int64_t n) {
  check_f32(x, "x", 2), check_f32(wp, "wp", 3);
  TORCH_CHECK(wp.size(2) == kPNR, "wp must be [P, K, ", kPNR, "] (from pack_f32)");
  const int64_t M = x.size(0), K = x.size(1), P = wp.size(0), N = check_packed_n(n, P);
  TORCH_CHECK(wp.size(1) == K && K > 0, "wp has K=", wp.size(1), " but x has K=", K);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const Kern& kn = kern();
  const float* w = wp.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t ps = K * kPNR;
  if (M <= kGemvMaxRows) {
    at::Tensor xt = M == 1 ? x : pack_x(x, M);
    const float* xp = xt.data_ptr<float>();
    const auto run = [&](int64_t b, int64_t e) {
      kn.gemv_p(xp, M, K, w + b * ps, ps, (e - b) * kPNR, std::min(N, e * kPNR) - b * kPNR, yp + b * kPNR, N);
    };
    if (g_pool_enabled.load(std::memory_order_relaxed))
      par_ranges(P, P * ps * 4 < kSerialSpinBytes ? 1 : kGemvTasksPerThread * at::get_num_threads(), run);
    else
      at::parallel_for(0, P, 1, run);
    return y;
  }
  at::Tensor xt = pack_x(x, kn.pmr);
  const float* xp = xt.data_ptr<float>();
  const Tasks t = gemm_tasks(M, P, kn.pmr);
  at::parallel_for(0, t.ng * t.nmb, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t p0 = (i / t.nmb) * t.G, p1 = std::min(P, p0 + t.G);
      const int64_t m0 = (i % t.nmb) * t.MB, m1 = std::min(M, m0 + t.MB);
      kn.gemm_p(xp, M, K, m0, m1, w + p0 * ps, ps, (p1 - p0) * kPNR, std::min(N, p1 * kPNR) - p0 * kPNR,
                yp + p0 * kPNR, N);
    }
  });
  return y;
}

constexpr int64_t kSerialGemvBytes = 1 << 20;
// y = x W^T on panels from pack_quant(W's GGUF rows, qtype, K): bit-equal to linear_packed on
// pack_f32(gguf's dequantization of W).
at::Tensor linear_quant_packed(const at::Tensor& x, const at::Tensor& wqp, const std::string& qtype, int64_t n,
                               int64_t K) {
  const GgufType& gt = gguf_type(qtype);
  const int64_t uk = kUnitK[gt.fmt], ub = kUnitBytes[gt.fmt];
  check_f32(x, "x", 2);
  TORCH_CHECK(wqp.device().is_cpu() && wqp.scalar_type() == at::kByte && wqp.is_contiguous() && wqp.dim() == 3 &&
                  wqp.size(2) == ub,
              "wqp must be a contiguous uint8 CPU tensor [P, K/", uk, ", ", ub, "] (from pack_quant(..., '", qtype,
              "'))");
  TORCH_CHECK(K > 0 && K % gt.blk_k == 0, qtype, " needs K % ", gt.blk_k, " == 0, got K=", K);
  TORCH_CHECK(x.size(1) == K && wqp.size(1) == K / uk, "x has K=", x.size(1), ", wqp has K=", wqp.size(1) * uk,
              ", K=", K);
  const int64_t M = x.size(0), P = wqp.size(0), N = check_packed_n(n, P);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const Kern& kn = kern();
  const uint8_t* w = wqp.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t psb = K / uk * ub, ps = K * kPNR;
  if (M <= kGemvMaxRows) {  // memory-bound decode: decode each block on the fly, fused with the FMAs
    at::Tensor xt = M == 1 ? x : pack_x(x, M);
    const float* xp = xt.data_ptr<float>();
    const auto gemv = kn.gemv_q[gt.fmt];
    const auto run = [&](int64_t b, int64_t e) {
      gemv(xp, M, K, w + b * psb, psb, (e - b) * kPNR, std::min(N, e * kPNR) - b * kPNR, yp + b * kPNR, N);
    };
    if (g_pool_enabled.load(std::memory_order_relaxed)) {
      par_ranges(P, P * psb < kSerialSpinBytes ? 1 : kGemvTasksPerThread * at::get_num_threads(), run);
      return y;
    }
    // Without the spin pool: matrices under kSerialGemvBytes run on the calling thread: threads only split panels, so
    // this changes no bit, and measured inside Gemma 3 270M decode steps the second thread's
    // wake-up cost more than it saved below ~1 MiB (e.g. 256x640 Q5_0: 26 us alone, 79 us on
    // two threads; 2048x640: 154 us alone, 137 us on two).
    const int64_t grain = P * psb < kSerialGemvBytes ? P : 1;
    at::parallel_for(0, P, grain, run);
    return y;
  }
  // Large M (prefill, replay: compute-bound): each task dequantizes its panel group into fp32
  // scratch (exact) and runs the fp32 GEMM, so no fp32 copy of the weights is ever held.
  at::Tensor xt = pack_x(x, kn.pmr);
  const float* xp = xt.data_ptr<float>();
  const Tasks t = gemm_tasks(M, P, kn.pmr);
  const auto dequant = kn.dequant_q[gt.fmt];
  at::parallel_for(0, t.ng * t.nmb, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scratch(t.G * ps);
    int64_t have = -1;
    for (int64_t i = b; i < e; ++i) {
      const int64_t g = i / t.nmb, p0 = g * t.G, p1 = std::min(P, p0 + t.G);
      const int64_t m0 = (i % t.nmb) * t.MB, m1 = std::min(M, m0 + t.MB);
      if (g != have) dequant(w + p0 * psb, psb, p1 - p0, K, scratch.data()), have = g;
      kn.gemm_p(xp, M, K, m0, m1, scratch.data(), ps, (p1 - p0) * kPNR, std::min(N, p1 * kPNR) - p0 * kPNR,
                yp + p0 * kPNR, N);
    }
  });
  return y;
}
// Decode (M <= 4) over several packed quantized matrices of one K, of any formats, in ONE call
// and one parallel region: y [M, sum n], part i's outputs in its own columns. Each part runs
// linear_quant_packed's GEMV on its own panels, so every output is the separate call's bits;
// only who computes which panels changes (Gemma 3: q, k Q5_0 and v Q8_0 are two layouts).
at::Tensor linear_quant_packed_multi(const at::Tensor& x, const std::vector<at::Tensor>& wqps,
                                     const std::vector<std::string>& qtypes, const std::vector<int64_t>& ns,
                                     int64_t K) {
  check_f32(x, "x", 2);
  TORCH_CHECK(!wqps.empty() && wqps.size() == qtypes.size() && wqps.size() == ns.size(),
              "wqps, qtypes and ns must be non-empty lists of one length, got ", wqps.size(), ", ", qtypes.size(),
              ", ", ns.size());
  const int64_t M = x.size(0);
  TORCH_CHECK(M <= kGemvMaxRows, "linear_quant_packed_multi is the decode path (M <= ", kGemvMaxRows, "), got M=", M);
  struct Seg {
    const uint8_t* w;
    int64_t psb, P, N, p0, col;
    std::remove_reference_t<decltype(Kern::gemv_q[0])> gemv;
  };
  std::vector<Seg> segs;
  int64_t T = 0, Ntot = 0, bytes = 0;
  const Kern& kn = kern();
  for (size_t i = 0; i < wqps.size(); ++i) {
    const GgufType& gt = gguf_type(qtypes[i]);
    const at::Tensor& wqp = wqps[i];
    const int64_t uk = kUnitK[gt.fmt], ub = kUnitBytes[gt.fmt];
    TORCH_CHECK(wqp.device().is_cpu() && wqp.scalar_type() == at::kByte && wqp.is_contiguous() && wqp.dim() == 3 &&
                    wqp.size(2) == ub,
                "wqps[", i, "] must be a contiguous uint8 CPU tensor [P, K/", uk, ", ", ub, "] (from pack_quant(..., '",
                qtypes[i], "'))");
    TORCH_CHECK(K > 0 && K % gt.blk_k == 0, qtypes[i], " needs K % ", gt.blk_k, " == 0, got K=", K);
    TORCH_CHECK(x.size(1) == K && wqp.size(1) == K / uk, "x has K=", x.size(1), ", wqps[", i,
                "] has K=", wqp.size(1) * uk, ", K=", K);
    const int64_t P = wqp.size(0), N = check_packed_n(ns[i], P), psb = K / uk * ub;
    segs.push_back({wqp.data_ptr<uint8_t>(), psb, P, N, T, Ntot, kn.gemv_q[gt.fmt]});
    T += P, Ntot += N, bytes += P * psb;
  }
  at::Tensor y = at::empty({M, Ntot}, x.options());
  if (M == 0) return y;
  at::Tensor xt = M == 1 ? x : pack_x(x, M);
  const float* xp = xt.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const auto run = [&](int64_t b, int64_t e) {  // panels [b, e) of the parts' panels in order
    for (const Seg& g : segs) {
      const int64_t lb = std::max(b, g.p0) - g.p0, le = std::min(e, g.p0 + g.P) - g.p0;
      if (lb >= le) continue;
      g.gemv(xp, M, K, g.w + lb * g.psb, g.psb, (le - lb) * kPNR, std::min(g.N, le * kPNR) - lb * kPNR,
             yp + g.col + lb * kPNR, Ntot);
    }
  };
  if (g_pool_enabled.load(std::memory_order_relaxed))
    par_ranges(T, bytes < kSerialSpinBytes ? 1 : kGemvTasksPerThread * at::get_num_threads(), run);
  else
    at::parallel_for(0, T, bytes < kSerialGemvBytes ? T : 1, run);
  return y;
}
at::Tensor linear_q8_0_packed(const at::Tensor& x, const at::Tensor& wqp, int64_t n, int64_t K) {
  return linear_quant_packed(x, wqp, "Q8_0", n, K);
}
at::Tensor linear_q4_1_packed(const at::Tensor& x, const at::Tensor& wqp, int64_t n, int64_t K) {
  return linear_quant_packed(x, wqp, "Q4_1", n, K);
}

at::Tensor argmax(const at::Tensor& x) {
  check_f32(x, "x", 2);
  const int64_t M = x.size(0), N = x.size(1);
  TORCH_CHECK(N > 0, "argmax over an empty row");
  at::Tensor r = at::empty({M}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* rp = r.data_ptr<int64_t>();
  at::parallel_for(0, M, 1, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const float* row = xp + m * N;
      int64_t best = 0;
      for (int64_t n = 1; n < N; ++n) best = row[n] > row[best] ? n : best;
      rp[m] = best;
    }
  });
  return r;
}

// csrc/verinfer_sampling.cpp
at::Tensor sample_rows(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                       const at::Tensor& us);
at::Tensor exp64_tensor(const at::Tensor& x);
void register_fused(pybind11::module& m);  // verinfer_fused.cpp

}  // namespace vi

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using rel = py::call_guard<py::gil_scoped_release>;  // the engine calls us from a worker thread
  m.def("isa", &vi::isa, rel());
  m.def("set_isa", &vi::set_isa, rel());
  m.def("supported_isas", &vi::supported_isas, rel());
  m.def("linear", &vi::linear, rel());
  m.def("linear_q8_0", &vi::linear_q8_0, rel());
  m.def("dequantize_q8_0", &vi::dequantize_q8_0, rel());
  m.def("rmsnorm", &vi::rmsnorm, rel());
  m.def("rmsnorm_rope_half", &vi::rmsnorm_rope_half, rel());
  m.def("gelu_tanh_mul", &vi::gelu_tanh_mul, rel());
  m.def("silu_mul", &vi::silu_mul, rel());
  m.def("attention", &vi::attention, rel());
  m.def("argmax", &vi::argmax, rel());
  m.def("pack_f32", &vi::pack_f32, rel());
  m.def("pack_q8_0", &vi::pack_q8_0, rel());
  m.def("linear_packed", &vi::linear_packed, rel());
  m.def("linear_q8_0_packed", &vi::linear_q8_0_packed, rel());
  m.def("pack_q4_1", &vi::pack_q4_1, rel());
  m.def("linear_q4_1_packed", &vi::linear_q4_1_packed, rel());
  m.def("pack_quant", &vi::pack_quant, rel());
  m.def("panel_format", &vi::panel_format, rel());
  m.def("linear_quant_packed", &vi::linear_quant_packed, rel());
  m.def("linear_quant_packed_multi", &vi::linear_quant_packed_multi, rel());
  m.def("set_spin_pool", &vi::set_spin_pool, rel());
  m.def("sample_rows", &vi::sample_rows, rel());
  m.def("exp64", &vi::exp64_tensor, rel());
  vi::register_fused(m);
}

#else  // VI_BODY ------------------------------------------------- ISA-generic kernels
// Compiled once per ISA namespace above; V, reduce() and kNR come from that namespace.

// MR x NR outputs, one 16-lane accumulator each: y[m, n] = dot16(x[m], w[n], K), w row stride ldw.
// K-blocking (large M only) runs k in [k0, k1): a block that does not finish K parks its lane
// accumulators in `carry` and the next block resumes them, so every lane still sees the same
// fmaf sequence as one pass. PF: prefetch the next tile's rows (GEMV paths stream weights once).
template <int MR, int NR, bool PF = false>
static inline void tile(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K, float* y, int64_t ldy,
                        int64_t k0 = 0, int64_t k1 = INT64_MAX, float* carry = nullptr, bool pf = false,
                        int64_t xoff = 0) {  // x holds columns xoff.. (a packed slice)
  V acc[MR * NR];
  VI_UNROLL
  for (int i = 0; i < MR * NR; ++i) acc[i] = k0 == 0 ? V::zero() : V::load(carry + 16 * i);
  const int64_t K16 = K & ~int64_t{15}, kend = std::min(k1, K16);
  for (int64_t k = k0; k < kend; k += 16) {
    V xv[MR];
    VI_UNROLL
    for (int m = 0; m < MR; ++m) xv[m] = V::load(x + m * ldx + (k - xoff));
    VI_UNROLL
    for (int n = 0; n < NR; ++n) {
      if (PF && pf) __builtin_prefetch(w + (n + NR) * ldw + k + 64, 0, 2);
      const V wv = V::load(w + n * ldw + k);
      VI_UNROLL
      for (int m = 0; m < MR; ++m) acc[m * NR + n] = V::fma(xv[m], wv, acc[m * NR + n]);
    }
  }
  if (k1 < K) {
    VI_UNROLL
    for (int i = 0; i < MR * NR; ++i) V::store(carry + 16 * i, acc[i]);
    return;
  }
  float r[MR * NR > 16 ? MR * NR : 16];
  reduce(acc, MR * NR, r);
  VI_UNROLL
  for (int m = 0; m < MR; ++m)
    VI_UNROLL
    for (int n = 0; n < NR; ++n) {
      float a = r[m * NR + n];
      for (int64_t k = K16; k < K; ++k) a = std::fma(x[m * ldx + (k - xoff)], w[n * ldw + k], a);
      y[m * ldy + n] = a;
    }
}

// The same for Q8_0 weight rows (K % 32 == 0, so no tail): per 32-weight block an fp16 scale d
// then 32 int8 q; each weight is float(q) * d (exact), then FMA'd exactly like the fp32 tile.
template <int MR, int NR>
static inline void tile_q8(const float* x, int64_t ldx, const uint8_t* w, int64_t ldw, int64_t K, float* y,
                           int64_t ldy, bool pf) {
  V acc[MR * NR];
  VI_UNROLL
  for (int i = 0; i < MR * NR; ++i) acc[i] = V::zero();
  for (int64_t k = 0; k < K; k += 32, w += 34) {
    V x0[MR], x1[MR];
    VI_UNROLL
    for (int m = 0; m < MR; ++m) x0[m] = V::load(x + m * ldx + k), x1[m] = V::load(x + m * ldx + k + 16);
    VI_UNROLL
    for (int n = 0; n < NR; ++n) {
      const uint8_t* b = w + n * ldw;
      if (pf) __builtin_prefetch(b + NR * ldw + 256, 0, 2);
      const V d = V::set1(V::h2f(load_u16(b)));
      const V w0 = V::q8(reinterpret_cast<const int8_t*>(b + 2), d);
      const V w1 = V::q8(reinterpret_cast<const int8_t*>(b + 18), d);
      VI_UNROLL
      for (int m = 0; m < MR; ++m) acc[m * NR + n] = V::fma(x0[m], w0, acc[m * NR + n]);
      VI_UNROLL
      for (int m = 0; m < MR; ++m) acc[m * NR + n] = V::fma(x1[m], w1, acc[m * NR + n]);
    }
  }
  float r[MR * NR > 16 ? MR * NR : 16];
  reduce(acc, MR * NR, r);
  VI_UNROLL
  for (int m = 0; m < MR; ++m)
    VI_UNROLL
    for (int n = 0; n < NR; ++n) y[m * ldy + n] = r[m * NR + n];
}

// MR rows against N weight rows (the GEMV paths, M <= 4): NR-column tiles, then single columns.
template <int MR>
static void row_group(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t N, int64_t K, float* y,
                      int64_t ldy) {
  constexpr int NR = kNR[MR];
  int64_t n = 0;
  for (; n + NR <= N; n += NR) tile<MR, NR, true>(x, ldx, w + n * ldw, ldw, K, y + n, ldy, 0, INT64_MAX, nullptr, n + 2 * NR <= N);
  for (; n < N; ++n) tile<MR, 1>(x, ldx, w + n * ldw, ldw, K, y + n, ldy);
}
template <int MR>
static void row_group_q8(const float* x, int64_t ldx, const uint8_t* w, int64_t ldw, int64_t N, int64_t K, float* y,
                         int64_t ldy) {
  constexpr int NR = kNRq[MR];
  int64_t n = 0;
  for (; n + NR <= N; n += NR) tile_q8<MR, NR>(x, ldx, w + n * ldw, ldw, K, y + n, ldy, n + 2 * NR <= N);
  for (; n < N; ++n) tile_q8<MR, 1>(x, ldx, w + n * ldw, ldw, K, y + n, ldy, false);
}
// Runtime row count r (1..R) -> row_group<r>.
template <int R, class W>
static void rows_rem(int r, const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t N, int64_t K, float* y,
                     int64_t ldy) {
  if (r == R) {
    if constexpr (std::is_same_v<W, float>) row_group<R>(x, ldx, w, ldw, N, K, y, ldy);
    else row_group_q8<R>(x, ldx, w, ldw, N, K, y, ldy);
  } else if constexpr (R > 1) {
    rows_rem<R - 1>(r, x, ldx, w, ldw, N, K, y, ldy);
  }
}

// Compute-bound path (M > 4): kMR x kNR[kMR] tiles. Per group of kMR rows, k is blocked by KB so
// that group's x slice stays in L1 while the weight panel's KB-wide slice streams from L2;
// carry holds the group's parked accumulators (one V per output).
template <int MR>
static void gemm_rows(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t N, int64_t K, float* y,
                      int64_t ldy, int64_t k0, int64_t k1, float* carry, int64_t xoff) {
  constexpr int NR = kNR[MR];
  int64_t n = 0;
  for (; n + NR <= N; n += NR, carry += 16 * MR * NR)
    tile<MR, NR>(x, ldx, w + n * ldw, ldw, K, y + n, ldy, k0, k1, carry, false, xoff);
  for (; n < N; ++n, carry += 16 * MR) tile<MR, 1>(x, ldx, w + n * ldw, ldw, K, y + n, ldy, k0, k1, carry, false, xoff);
}
template <int R>
static void gemm_rem(int r, const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t N, int64_t K, float* y,
                     int64_t ldy, int64_t k0, int64_t k1, float* carry, int64_t xoff) {
  if (r == R) gemm_rows<R>(x, ldx, w, ldw, N, K, y, ldy, k0, k1, carry, xoff);
  else if constexpr (R > 1) gemm_rem<R - 1>(r, x, ldx, w, ldw, N, K, y, ldy, k0, k1, carry, xoff);
}

static void linear_f32(const float* x, int64_t ldx, int64_t M, const float* w, int64_t ldw, int64_t N, int64_t K,
                       float* y, int64_t ldy) {
  if (M <= 4) return rows_rem<4>(static_cast<int>(M), x, ldx, w, ldw, N, K, y, ldy);
  const int64_t KB = K > kKBlockAbove ? kKBlock : K;  // multiple of 16
  if (KB == K) {
    int64_t m = 0;
    for (; m + kMR <= M; m += kMR) gemm_rows<kMR>(x + m * ldx, ldx, w, ldw, N, K, y + m * ldy, ldy, 0, INT64_MAX, nullptr, 0);
    if (M > m) gemm_rem<kMR>(static_cast<int>(M - m), x + m * ldx, ldx, w, ldw, N, K, y + m * ldy, ldy, 0, INT64_MAX, nullptr, 0);
    return;
  }
  // k-slices outermost, so the panel's KB-wide weight slice stays in L2 for every row group;
  // carry parks all M x N accumulators between slices. Each group's x slice is copied to a
  // buffer with a padded row stride, as long power-of-two rows (K = 2048) would otherwise put
  // all rows' lines into one L1 set. Copies never touch the arithmetic.
  constexpr int64_t ldp = kKBlock + 16;
  static thread_local std::vector<float> carry_buf, xbuf;  // 16 lanes per output (unaligned)
  if (carry_buf.size() < static_cast<size_t>(16 * M * N)) carry_buf.resize(16 * M * N);
  xbuf.resize(kMR * ldp);
  for (int64_t k0 = 0; k0 < K; k0 += KB) {
    const int64_t k1 = k0 + KB >= K ? INT64_MAX : k0 + KB, len = std::min(KB, K - k0);
    for (int64_t m = 0; m < M; m += kMR) {
      const int r = static_cast<int>(std::min<int64_t>(kMR, M - m));
      for (int i = 0; i < r; ++i) std::memcpy(&xbuf[i * ldp], x + (m + i) * ldx + k0, len * sizeof(float));
      gemm_rem<kMR>(r, xbuf.data(), ldp, w, ldw, N, K, y + m * ldy, ldy, k0, k1, &carry_buf[16 * m * N], k0);
    }
  }
}
static void linear_q8(const float* x, int64_t ldx, int64_t M, const uint8_t* w, int64_t ldw, int64_t N, int64_t K,
                      float* y, int64_t ldy) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) row_group_q8<4>(x + m * ldx, ldx, w, ldw, N, K, y + m * ldy, ldy);
  if (M > m) rows_rem<4>(static_cast<int>(M - m), x + m * ldx, ldx, w, ldw, N, K, y + m * ldy, ldy);
}
static void dequant_q8(const uint8_t* w, int64_t ldw, int64_t N, int64_t K, float* out) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; k += 32) {
      const uint8_t* b = w + n * ldw + k / 32 * 34;
      const V d = V::set1(V::h2f(load_u16(b)));
      V::store(out + n * K + k, V::q8(reinterpret_cast<const int8_t*>(b + 2), d));
      V::store(out + n * K + k + 16, V::q8(reinterpret_cast<const int8_t*>(b + 18), d));
    }
}
static float dot(const float* a, const float* b, int64_t K) {
  float r;
  tile<1, 1>(a, 0, b, 0, K, &r, 0);
  return r;
}
static void scale_mul(const float* x, float r, const float* w, float* y, int64_t n) {
  const V rv = V::set1(r);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) V::store(y + i, V::mul(V::mul(V::load(x + i), rv), V::load(w + i)));
  for (; i < n; ++i) y[i] = (x[i] * r) * w[i];
}
// R heads x NV vectors of the output stay in registers across all n keys; each V row slice is
// loaded once for the R heads (GQA heads share their KV head). One fmaf per element per key.
template <int R, int NV>
static inline void pv_block(const float* p, int64_t ldp, const float* v, int64_t n, int64_t D, float* out,
                            int64_t ldo) {
  V acc[R * NV];
  VI_UNROLL
  for (int i = 0; i < R * NV; ++i) acc[i] = V::zero();
  for (int64_t j = 0; j < n; ++j) {
    V pj[R];
    VI_UNROLL
    for (int r = 0; r < R; ++r) pj[r] = V::set1(p[r * ldp + j]);
    VI_UNROLL
    for (int i = 0; i < NV; ++i) {
      const V vv = V::load(v + j * D + 16 * i);
      VI_UNROLL
      for (int r = 0; r < R; ++r) acc[r * NV + i] = V::fma(pj[r], vv, acc[r * NV + i]);
    }
  }
  VI_UNROLL
  for (int r = 0; r < R; ++r)
    VI_UNROLL
    for (int i = 0; i < NV; ++i) V::store(out + r * ldo + 16 * i, acc[r * NV + i]);
}
template <int R>
static void pv_heads(const float* p, int64_t ldp, const float* v, int64_t n, int64_t D, float* out, int64_t ldo) {
  constexpr int NV = kPV / R > 0 ? kPV / R : 1;
  int64_t d = 0;
  for (; d + 16 * NV <= D; d += 16 * NV) pv_block<R, NV>(p, ldp, v + d, n, D, out + d, ldo);
  for (; d + 16 <= D; d += 16) pv_block<R, 1>(p, ldp, v + d, n, D, out + d, ldo);
  for (; d < D; ++d)
    for (int r = 0; r < R; ++r) {
      float a = 0.0f;
      for (int64_t j = 0; j < n; ++j) a = std::fma(p[r * ldp + j], v[j * D + d], a);
      out[r * ldo + d] = a;
    }
}
static void attn_pv(const float* p, int64_t ldp, int64_t R, const float* v, int64_t n, int64_t D, float* out,
                    int64_t ldo) {
  for (; R >= 4; R -= 4, p += 4 * ldp, out += 4 * ldo) pv_heads<4>(p, ldp, v, n, D, out, ldo);
  if (R == 3) pv_heads<3>(p, ldp, v, n, D, out, ldo);
  if (R == 2) pv_heads<2>(p, ldp, v, n, D, out, ldo);
  if (R == 1) pv_heads<1>(p, ldp, v, n, D, out, ldo);
}

// ---------------------------------------------------------------- packed outer-product GEMM
// One accumulator per output, y[m, n] = fmaf chain over k = 0..K-1 in increasing k from 0.0f;
// the 16 vector lanes run over n, never over k. A tile holds MR rows x NV vectors of outputs.
// xp: x packed as [k][MR] (already at the tile's first k); w: the tile's first weights at that k;
// vector j lives at w + (j >> 1) * ps + (j & 1) * 16 (+ 32 per k): NV is 1 (half a panel) or
// even (whole panels). K-blocking parks each accumulator in y between blocks; a float stored and
// reloaded is exact, so blocking never changes a bit. cols < 16 * NV: only the first cols
// columns of y exist (the panel's zero padding is computed but never stored).
template <int MR, int NV>
static inline __attribute__((always_inline)) void acc_in(V* acc, const float* y, int64_t ldy, int64_t cols,
                                                         bool load) {
  VI_UNROLL
  for (int i = 0; i < MR * NV; ++i) acc[i] = V::zero();
  if (!load) return;
  if (cols == 16 * NV) {
    VI_UNROLL
    for (int m = 0; m < MR; ++m)
      VI_UNROLL
      for (int j = 0; j < NV; ++j) acc[m * NV + j] = V::load(y + m * ldy + 16 * j);
    return;
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NV; ++j) {
      float t[16] = {};
      for (int64_t i = 0; i < 16 && 16 * j + i < cols; ++i) t[i] = y[m * ldy + 16 * j + i];
      acc[m * NV + j] = V::load(t);
    }
}
template <int MR, int NV>
static inline __attribute__((always_inline)) void acc_out(const V* acc, float* y, int64_t ldy, int64_t cols) {
  if (cols == 16 * NV) {
    VI_UNROLL
    for (int m = 0; m < MR; ++m)
      VI_UNROLL
      for (int j = 0; j < NV; ++j) V::store(y + m * ldy + 16 * j, acc[m * NV + j]);
    return;
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NV; ++j) {
      float t[16];
      V::store(t, acc[m * NV + j]);
      for (int64_t i = 0; i < 16 && 16 * j + i < cols; ++i) y[m * ldy + 16 * j + i] = t[i];
    }
}
template <int MR, int NV>
static void ptile(const float* xp, const float* w, int64_t ps, int64_t kc, float* y, int64_t ldy, int64_t cols,
                  bool load) {
  V acc[MR * NV];
  acc_in<MR, NV>(acc, y, ldy, cols, load);
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k, xp += MR, w += kPNR) {
    V wv[NV];
    VI_UNROLL
    for (int j = 0; j < NV; ++j) wv[j] = V::load(w + (j >> 1) * ps + (j & 1) * 16);
    VI_UNROLL
    for (int m = 0; m < MR; ++m) {
      const V xb = V::set1(xp[m]);
      VI_UNROLL
      for (int j = 0; j < NV; ++j) acc[m * NV + j] = V::fma(xb, wv[j], acc[m * NV + j]);
    }
  }
  acc_out<MR, NV>(acc, y, ldy, cols);
}
// ---- block decoders (layouts at PanelFmt). blk(panel, b): the weight data of 32-k block b of a
// panel (linear in the panel pointer); scales(panel, b, col): the per-row constants of block b's
// columns col .. col + 15; weight<H>(blk, col, i, s): their 16 weights at k = 16 H + i of the
// block, bit-equal to gguf.quants.dequantize. H is a template argument so that every shift and
// offset is a constant.
#define VI_INLINE static inline __attribute__((always_inline))
// The shift that picks the nibbles of rows col .. col + 15 (col 0 or 16) at k = 16 H + i of a
// block from its chunk i / 2 of nibble bytes (see nib_index).
template <int H>
VI_INLINE int nib_shift(int64_t col, int i) {
  return 8 * (2 * (i & 1) + static_cast<int>(col >> 4)) + 4 * H;
}
struct DecQ8 {
  static constexpr int64_t kBytes32 = kQBlk;
  struct S {
    V d;
  };
  VI_INLINE const uint8_t* blk(const uint8_t* p, int64_t b) { return p + b * kQBlk + 2 * kPNR; }
  VI_INLINE S scales(const uint8_t* p, int64_t b, int64_t col) { return {V::h16(p + b * kQBlk + 2 * col)}; }
  template <int H>
  VI_INLINE V weight(const uint8_t* blk, int64_t col, int i, const S& s) {
    return V::q8(reinterpret_cast<const int8_t*>(blk + (16 * H + i) * kPNR + col), s.d);
  }
};
struct DecQ41 {
  static constexpr int64_t kBytes32 = kQ41Blk;
  struct S {
    V d, m;
  };
  VI_INLINE const uint8_t* blk(const uint8_t* p, int64_t b) { return p + b * kQ41Blk + 4 * kPNR; }
  VI_INLINE S scales(const uint8_t* p, int64_t b, int64_t col) {
    p += b * kQ41Blk;
    return {V::h16(p + 2 * col), V::h16(p + 2 * kPNR + 2 * col)};
  }
  template <int H>
  VI_INLINE V weight(const uint8_t* blk, int64_t col, int i, const S& s) {
    return V::q41(blk + (i / 2) * 64, nib_shift<H>(col, i), s.d, s.m);
  }
};
struct DecQ5 {
  static constexpr int64_t kBytes32 = kQ5Blk;
  struct S {
    V d;
  };
  VI_INLINE const uint8_t* blk(const uint8_t* p, int64_t b) { return p + b * kQ5Blk + 2 * kPNR; }
  VI_INLINE S scales(const uint8_t* p, int64_t b, int64_t col) { return {V::h16(p + b * kQ5Blk + 2 * col)}; }
  template <int H>
  VI_INLINE V weight(const uint8_t* blk, int64_t col, int i, const S& s) {  // blk: the 32 bit words
    return V::q5(blk + 4 * 32 + (i / 2) * 64, nib_shift<H>(col, i), blk + 4 * (16 * H + i) + col / 8, s.d);
  }
};
struct DecQ4K {
  static constexpr int64_t kBytes32 = kQ4KSb / 8;
  struct S {
    V d, m;  // d * sc, -(dmin * m)
  };
  VI_INLINE const uint8_t* blk(const uint8_t* p, int64_t b) {
    return p + (b >> 3) * kQ4KSb + kQ4KHdr + (b & 7) * 16 * kPNR;
  }
  VI_INLINE S scales(const uint8_t* p, int64_t b, int64_t col) {
    p += (b >> 3) * kQ4KSb;
    const int64_t sub = b & 7;
    const V d = V::h16(p + 2 * col), ndmin = V::h16(p + 2 * kPNR + 2 * col);  // stored negated
    // sc, m < 64: their bytes read as int8 are the same numbers
    return {V::q8(reinterpret_cast<const int8_t*>(p + 4 * kPNR + sub * kPNR + col), d),
            V::q8(reinterpret_cast<const int8_t*>(p + 12 * kPNR + sub * kPNR + col), ndmin)};
  }
  template <int H>
  VI_INLINE V weight(const uint8_t* blk, int64_t col, int i, const S& s) {
    return V::q41(blk + (i / 2) * 64, nib_shift<H>(col, i), s.d, s.m);
  }
};
struct DecQ6K {
  static constexpr int64_t kBytes32 = kQ6KSb / 8;
  struct S {
    V d0, d1;  // d * sc for k = 0..15, 16..31 of the block
  };
  VI_INLINE const uint8_t* blk(const uint8_t* p, int64_t b) {
    return p + (b >> 3) * kQ6KSb + kQ6KHdr + (b & 7) * 32 * kPNR;
  }
  VI_INLINE S scales(const uint8_t* p, int64_t b, int64_t col) {
    p += (b >> 3) * kQ6KSb;
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 2 * kPNR + 2 * (b & 7) * kPNR + col);
    const V d = V::h16(p + 2 * col);
    return {V::q8(sc, d), V::q8(sc + kPNR, d)};
  }
  template <int H>
  VI_INLINE V weight(const uint8_t* blk, int64_t col, int i, const S& s) {
    return V::q8(reinterpret_cast<const int8_t*>(blk + (16 * H + i) * kPNR + col), H ? s.d1 : s.d0);
  }
};
#undef VI_INLINE

// Half a block (16 k) of a quantized tile: decode NV weight vectors per k, FMA them into the MR x NV
// accumulators in increasing k, exactly as ptile does with fp32 weights.
template <class F, int H, int OFF, int MR, int NV>
static inline __attribute__((always_inline)) void qhalf(const float*& xp, const uint8_t* w, int64_t psb,
                                                        const typename F::S* s, V* acc) {
VI_UNROLL  // i constant: every nibble shift is an immediate
  for (int i = 0; i < 16; ++i, xp += MR) {
    V wv[NV];
    VI_UNROLL
    for (int j = 0; j < NV; ++j)
      wv[j] = F::template weight<H>(w + (j >> 1) * psb, OFF + (j & 1) * 16, i, s[j]);
    VI_UNROLL
    for (int m = 0; m < MR; ++m) {
      const V xb = V::set1(xp[m]);
      VI_UNROLL
      for (int j = 0; j < NV; ++j) acc[m * NV + j] = V::fma(xb, wv[j], acc[m * NV + j]);
    }
  }
}
// A tile over full K on packed quantized panels of decoder F (K % 32 == 0): the same outputs, in
// the same order, as ptile on the dequantized fp32 panels. w: the panel's first block; OFF: the
// column offset in the panel (0 or 16, a template argument so that every nibble shift is known).
template <class F, int OFF, int MR, int NV>
static void qtile(const float* xp, const uint8_t* w, int64_t psb, int64_t K, float* y, int64_t ldy,
                  int64_t cols) {
  V acc[MR * NV];
  acc_in<MR, NV>(acc, y, ldy, cols, false);
  for (int64_t b = 0; b < K / 32; ++b) {
    // A panel is one contiguous run of bytes and the next tile reads the next panel, so this is
    // one forward stream per thread: fetch it kQPrefetch bytes ahead (the hardware prefetcher
    // alone leaves an AMD Zen 3 core at ~60% of the bandwidth it reaches this way).
    VI_UNROLL
    for (int64_t l = 0; l < F::kBytes32; l += 64) __builtin_prefetch(w + b * F::kBytes32 + kQPrefetch + l, 0, 3);
    typename F::S s[NV];
    VI_UNROLL
    for (int j = 0; j < NV; ++j) s[j] = F::scales(w + (j >> 1) * psb, b, OFF + (j & 1) * 16);
    const uint8_t* wb = F::blk(w, b);  // panel j >> 1's block: wb + (j >> 1) * psb
    qhalf<F, 0, OFF, MR, NV>(xp, wb, psb, s, acc);
    qhalf<F, 1, OFF, MR, NV>(xp, wb, psb, s, acc);
  }
  acc_out<MR, NV>(acc, y, ldy, cols);
}
template <class F, int H>
static inline __attribute__((always_inline)) void dq_half(const uint8_t* blk, const typename F::S& s0,
                                                          const typename F::S& s1, float*& out) {
  for (int i = 0; i < 16; ++i, out += kPNR) {
    V::store(out, F::template weight<H>(blk, 0, i, s0));
    V::store(out + 16, F::template weight<H>(blk, 16, i, s1));
  }
}
// np packed panels of decoder F -> np fp32 panels [np][K][32] (the large-M path's scratch).
template <class F>
static void dequant_panels(const uint8_t* wp, int64_t psb, int64_t np, int64_t K, float* out) {
  for (int64_t p = 0; p < np; ++p, wp += psb)
    for (int64_t b = 0; b < K / 32; ++b) {
      const uint8_t* blk = F::blk(wp, b);
      const typename F::S s0 = F::scales(wp, b, 0), s1 = F::scales(wp, b, 16);
      dq_half<F, 0>(blk, s0, s1, out);
      dq_half<F, 1>(blk, s0, s1, out);
    }
}
// Runtime row count r (1..R) of the last packed x group -> ptile<r, NV>.
template <int R, int NV>
static void ptile_rows(int r, const float* xp, const float* w, int64_t ps, int64_t kc, float* y, int64_t ldy,
                       int64_t cols, bool load) {
  if (r == R) ptile<R, NV>(xp, w, ps, kc, y, ldy, cols, load);
  else if constexpr (R > 1) ptile_rows<R - 1, NV>(r, xp, w, ps, kc, y, ldy, cols, load);
}
// GEMM (M > 4): k blocks of kPKC outermost, then the rows' x groups (a group's kPKC-wide x slice
// is reused from L1 across the task's column tiles), then column tiles (the task's weight slices
// stay in L2 across all row groups). Row group g starts at xpk + g*kPMR*K, packed [k][r] with r
// = its row count. Measured (1 and 2 threads): kPKC = 512 and this order were best or tied.
static void gemm_p(const float* xpk, int64_t M, int64_t K, int64_t m0, int64_t m1, const float* wp, int64_t ps,
                   int64_t cw, int64_t nv, float* y, int64_t ldy) {
  constexpr int64_t CW = 16 * kPNV;
  for (int64_t k0 = 0; k0 < K; k0 += kPKC) {
    const int64_t kc = std::min(kPKC, K - k0);
    for (int64_t m = m0; m < m1; m += kPMR) {
      const int r = static_cast<int>(std::min<int64_t>(kPMR, M - m));
      const float* x = xpk + m * K + k0 * r;
      for (int64_t c = 0; c < cw && c < nv; c += CW) {
        const float* w = wp + (c / kPNR) * ps + c % kPNR + k0 * kPNR;
        ptile_rows<kPMR, kPNV>(r, x, w, ps, kc, y + m * ldy + c, ldy, std::min(CW, nv - c), k0 > 0);
      }
    }
  }
}
// GEMV (M <= 4): full-K tiles of kGNV[M] vectors, then narrower tiles for the range's end.
// F: F32Panels (fp32 panels, ps in floats) or a block decoder (ps in bytes).
template <class F, int MR, int NV>
static void gemv_run(int64_t& c, const float* xp, int64_t K, const void* wp, int64_t ps, int64_t cw, int64_t nv,
                     float* y, int64_t ldy) {
  for (; c + 16 * NV <= cw; c += 16 * NV) {
    const int64_t cols = std::min<int64_t>(16 * NV, nv - c);
    if (cols <= 0) continue;
    if constexpr (std::is_same_v<F, F32Panels>)
      ptile<MR, NV>(xp, static_cast<const float*>(wp) + (c / kPNR) * ps + c % kPNR, ps, K, y + c, ldy, cols,
                    false);
    else
    {
      const uint8_t* w = static_cast<const uint8_t*>(wp) + (c / kPNR) * ps;
      // a tile of NV >= 2 vectors covers whole panels (it addresses vector j as panel j / 2's
      // half j % 2), so only a single-vector tile starts mid-panel
      if (NV > 1 || c % kPNR == 0) qtile<F, 0, MR, NV>(xp, w, ps, K, y + c, ldy, cols);
      else qtile<F, 16, MR, NV>(xp, w, ps, K, y + c, ldy, cols);
    }
  }
}
template <class F, int MR>
static void gemv_rows(const float* xp, int64_t K, const void* wp, int64_t ps, int64_t cw, int64_t nv, float* y,
                      int64_t ldy) {
  constexpr int NV = std::is_same_v<F, F32Panels> ? kGNV[MR] : kGNVq[MR];
  int64_t c = 0;
  gemv_run<F, MR, NV>(c, xp, K, wp, ps, cw, nv, y, ldy);
  if constexpr (NV > 4) gemv_run<F, MR, 4>(c, xp, K, wp, ps, cw, nv, y, ldy);
  if constexpr (NV > 2) gemv_run<F, MR, 2>(c, xp, K, wp, ps, cw, nv, y, ldy);
  if constexpr (NV > 1) gemv_run<F, MR, 1>(c, xp, K, wp, ps, cw, nv, y, ldy);
}
template <class F>
static void gemv_any(const float* xp, int64_t M, int64_t K, const void* wp, int64_t ps, int64_t cw, int64_t nv,
                     float* y, int64_t ldy) {
  if (M == 1) gemv_rows<F, 1>(xp, K, wp, ps, cw, nv, y, ldy);
  if (M == 2) gemv_rows<F, 2>(xp, K, wp, ps, cw, nv, y, ldy);
  if (M == 3) gemv_rows<F, 3>(xp, K, wp, ps, cw, nv, y, ldy);
  if (M == 4) gemv_rows<F, 4>(xp, K, wp, ps, cw, nv, y, ldy);
}
static void gemv_p(const float* xp, int64_t M, int64_t K, const float* wp, int64_t ps, int64_t cw, int64_t nv,
                   float* y, int64_t ldy) {
  gemv_any<F32Panels>(xp, M, K, wp, ps, cw, nv, y, ldy);
}
template <class F>
static void gemv_qp(const float* xp, int64_t M, int64_t K, const uint8_t* wp, int64_t psb, int64_t cw, int64_t nv,
                    float* y, int64_t ldy) {
  gemv_any<F>(xp, M, K, wp, psb, cw, nv, y, ldy);
}

// Indexed by PanelFmt.
static const Kern kKern = {linear_f32, linear_q8, dequant_q8, dot, scale_mul, attn_pv, kPMR, gemm_p, gemv_p,
                           {gemv_qp<DecQ8>, gemv_qp<DecQ41>, gemv_qp<DecQ4K>, gemv_qp<DecQ6K>, gemv_qp<DecQ5>},
                           {dequant_panels<DecQ8>, dequant_panels<DecQ41>, dequant_panels<DecQ4K>,
                            dequant_panels<DecQ6K>, dequant_panels<DecQ5>}};

#endif  // VI_BODY
