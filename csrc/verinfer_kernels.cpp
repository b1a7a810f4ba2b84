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
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace vi {

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
  // the same on packed Q8_0 panels (panel stride psb bytes)
  void (*gemv_q8p)(const float* xp, int64_t M, int64_t K, const uint8_t* wp, int64_t psb, int64_t cw, int64_t nv,
                   float* y, int64_t ldy);
  // np packed Q8_0 panels -> np fp32 panels [np][K][32] (exact: float(d) * float(q))
  void (*dequant_q8p)(const uint8_t* wp, int64_t psb, int64_t np, int64_t K, float* out);
  // the same two on packed Q4_1 panels: weight = fmaf(float(q), float(d), float(m)), which is
  // GGUF's d * q + m rounded once (d * q is exact: 11-bit mantissa times a 4-bit integer)
  void (*gemv_q41p)(const float* xp, int64_t M, int64_t K, const uint8_t* wp, int64_t psb, int64_t cw, int64_t nv,
                    float* y, int64_t ldy);
  void (*dequant_q41p)(const uint8_t* wp, int64_t psb, int64_t np, int64_t K, float* out);
};

// Packed panel geometry: kPNR output columns per panel; a Q8_0 panel block holds, for 32
// consecutive k, kPNR fp16 scales (64 bytes) then 32 x kPNR int8 ([k][n]).
constexpr int64_t kPNR = 32, kQBlk = 2 * kPNR + 32 * kPNR;  // 1088 bytes
// A Q4_1 panel block: for 32 consecutive k, kPNR fp16 scales d, kPNR fp16 minima m, then 16 x kPNR
// bytes [kp][n] whose low nibble is q at k = kp and high nibble q at k = kp + 16 (GGUF's own
// nibble order within a block, so packing is a byte transpose). 0.625 bytes per weight.
constexpr int64_t kQ41Blk = 4 * kPNR + 16 * kPNR;  // 640 bytes

// Large-M K-blocking: slices of kKBlock floats of x rows stay in L1 (only when K > kKBlockAbove).
constexpr int64_t kKBlock = 512, kKBlockAbove = 1536;  // measured: K=1024 is faster unblocked

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
  static V q41(const uint8_t* q, int shift, V d, V m) {  // fmaf(float(nibble), d, m), 16 weights
    __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    w = _mm512_and_si512(_mm512_srl_epi32(w, _mm_cvtsi32_si128(shift)), _mm512_set1_epi32(15));
    return {_mm512_fmadd_ps(_mm512_cvtepi32_ps(w), d.v, m.v)};
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
  static V q41(const uint8_t* q, int shift, V d, V m) {
    const __m128i sh = _mm_cvtsi32_si128(shift);
    const __m256i f = _mm256_set1_epi32(15);
    __m256i w0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
    __m256i w1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8)));
    w0 = _mm256_and_si256(_mm256_srl_epi32(w0, sh), f);
    w1 = _mm256_and_si256(_mm256_srl_epi32(w1, sh), f);
    return {_mm256_fmadd_ps(_mm256_cvtepi32_ps(w0), d.lo, m.lo),
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(w1), d.hi, m.hi)};
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
  static V q41(const uint8_t* q, int shift, const V& d, const V& m) {
    V r;
    for (int i = 0; i < 16; ++i) r.l[i] = std::fma(static_cast<float>((q[i] >> shift) & 15), d.l[i], m.l[i]);
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

// Elementwise; vi_expf is plain IEEE arithmetic, so one C path serves every ISA with the same bits.
at::Tensor gelu_tanh_mul(const at::Tensor& gate, const at::Tensor& up) {
  check_f32(gate, "gate", -1), check_f32(up, "up", -1);
  TORCH_CHECK(gate.sizes() == up.sizes(), "gate and up must have the same shape");
  at::Tensor y = at::empty_like(gate);
  const float* g = gate.data_ptr<float>();
  const float* u = up.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, gate.numel(), 1024, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      // 0.5 v (1 + tanh(a)) = v / (1 + exp(-2a)): one exp, no cancellation for a << 0.
      const float v = g[i];
      const float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
      yp[i] = (v / (1.0f + vi_expf(-2.0f * inner))) * u[i];
    }
  });
  return y;
}

// Llama's MLP: y = (g / (1.0f + exp(-g))) * u, plain float32 ops in this order (vi_expf).
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  check_f32(gate, "gate", -1), check_f32(up, "up", -1);
  TORCH_CHECK(gate.sizes() == up.sizes(), "gate and up must have the same shape");
  at::Tensor y = at::empty_like(gate);
  const float* g = gate.data_ptr<float>();
  const float* u = up.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, gate.numel(), 1024, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) yp[i] = (g[i] / (1.0f + vi_expf(-g[i]))) * u[i];
  });
  return y;
}

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
  at::parallel_for(0, T * H, 1, [&](int64_t b, int64_t e) {
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
  });
  return out;
}

// ---------------------------------------------------------------- packed family (torch ops)
// pack_f32: w [N, K] -> [P = ceil(N/32)][K][32] fp32, wp[p][k][i] = w[32p + i][k] (0 for
// 32p + i >= N). pack_q8_0: GGUF Q8_0 rows [N][K/32*34] -> uint8 [P][K/32][1088]: per panel and
// 32-k block, 32 fp16 scales d[i] (64 bytes), then q[kk][i] (32 x 32 int8, k-major); padding
// rows have d = 0, q = 0. linear_packed / linear_q8_0_packed: y[m, n] = fmaf chain over k.
static constexpr int64_t kGemvMaxRows = 4;

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

static void check_q8_rows(const at::Tensor& wq, int64_t K) {
  TORCH_CHECK(wq.device().is_cpu() && wq.scalar_type() == at::kByte && wq.is_contiguous() && wq.dim() == 2,
              "wq must be a contiguous 2-D uint8 CPU tensor");
  TORCH_CHECK(K > 0 && K % 32 == 0, "Q8_0 needs K % 32 == 0, got K=", K);
  TORCH_CHECK(wq.size(1) == K / 32 * 34, "wq rows must be K/32*34=", K / 32 * 34, " bytes, got ", wq.size(1));
}

at::Tensor pack_q8_0(const at::Tensor& wq, int64_t K) {
  check_q8_rows(wq, K);
  const int64_t N = wq.size(0), P = (N + kPNR - 1) / kPNR, nb = K / 32, ldw = nb * 34;
  TORCH_CHECK(N > 0, "wq must be non-empty");
  at::Tensor out = at::zeros({P, nb, kQBlk}, wq.options());
  const uint8_t* src = wq.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, P, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p)
      for (int64_t i = 0; i < kPNR && p * kPNR + i < N; ++i) {
        const uint8_t* row = src + (p * kPNR + i) * ldw;
        for (int64_t j = 0; j < nb; ++j) {
          uint8_t* blk = dst + (p * nb + j) * kQBlk;
          std::memcpy(blk + 2 * i, row + j * 34, 2);
          for (int64_t kk = 0; kk < 32; ++kk) blk[2 * kPNR + kk * kPNR + i] = row[j * 34 + 2 + kk];
        }
      }
  });
  return out;
}

// pack_q4_1: GGUF Q4_1 rows [N][K/32*20] (d fp16, m fp16, 16 bytes of nibbles: byte j holds q[j]
// low and q[j + 16] high) -> uint8 [P][K/32][640] (layout at kQ41Blk); padding rows are all 0.
at::Tensor pack_q4_1(const at::Tensor& wq, int64_t K) {
  TORCH_CHECK(wq.device().is_cpu() && wq.scalar_type() == at::kByte && wq.is_contiguous() && wq.dim() == 2,
              "wq must be a contiguous 2-D uint8 CPU tensor");
  TORCH_CHECK(K > 0 && K % 32 == 0, "Q4_1 needs K % 32 == 0, got K=", K);
  TORCH_CHECK(wq.size(1) == K / 32 * 20, "wq rows must be K/32*20=", K / 32 * 20, " bytes, got ", wq.size(1));
  const int64_t N = wq.size(0), P = (N + kPNR - 1) / kPNR, nb = K / 32, ldw = nb * 20;
  TORCH_CHECK(N > 0, "wq must be non-empty");
  at::Tensor out = at::zeros({P, nb, kQ41Blk}, wq.options());
  const uint8_t* src = wq.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, P, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p)
      for (int64_t i = 0; i < kPNR && p * kPNR + i < N; ++i) {
        const uint8_t* row = src + (p * kPNR + i) * ldw;
        for (int64_t j = 0; j < nb; ++j) {
          uint8_t* blk = dst + (p * nb + j) * kQ41Blk;
          std::memcpy(blk + 2 * i, row + j * 20, 2);             // d
          std::memcpy(blk + 2 * kPNR + 2 * i, row + j * 20 + 2, 2);  // m
          for (int64_t kp = 0; kp < 16; ++kp) blk[4 * kPNR + kp * kPNR + i] = row[j * 20 + 4 + kp];
        }
      }
  });
  return out;
}

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
    at::parallel_for(0, P, 1, [&](int64_t b, int64_t e) {
      kn.gemv_p(xp, M, K, w + b * ps, ps, (e - b) * kPNR, std::min(N, e * kPNR) - b * kPNR, yp + b * kPNR, N);
    });
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

at::Tensor linear_q8_0_packed(const at::Tensor& x, const at::Tensor& wqp, int64_t n, int64_t K) {
  check_f32(x, "x", 2);
  TORCH_CHECK(wqp.device().is_cpu() && wqp.scalar_type() == at::kByte && wqp.is_contiguous() && wqp.dim() == 3 &&
                  wqp.size(2) == kQBlk,
              "wqp must be a contiguous uint8 CPU tensor [P, K/32, ", kQBlk, "] (from pack_q8_0)");
  TORCH_CHECK(K > 0 && K % 32 == 0, "Q8_0 needs K % 32 == 0, got K=", K);
  TORCH_CHECK(x.size(1) == K && wqp.size(1) == K / 32, "x has K=", x.size(1), ", wqp has K=", wqp.size(1) * 32,
              ", K=", K);
  const int64_t M = x.size(0), P = wqp.size(0), N = check_packed_n(n, P);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const Kern& kn = kern();
  const uint8_t* w = wqp.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t psb = K / 32 * kQBlk, ps = K * kPNR;
  if (M <= kGemvMaxRows) {  // fused dequantize + FMA: streams int8 + fp16 scales
    at::Tensor xt = M == 1 ? x : pack_x(x, M);
    const float* xp = xt.data_ptr<float>();
    at::parallel_for(0, P, 1, [&](int64_t b, int64_t e) {
      kn.gemv_q8p(xp, M, K, w + b * psb, psb, (e - b) * kPNR, std::min(N, e * kPNR) - b * kPNR, yp + b * kPNR, N);
    });
    return y;
  }
  // Large M: dequantize a panel group into fp32 scratch (exact) and run the fp32 GEMM: same bits.
  at::Tensor xt = pack_x(x, kn.pmr);
  const float* xp = xt.data_ptr<float>();
  const Tasks t = gemm_tasks(M, P, kn.pmr);
  at::parallel_for(0, t.ng * t.nmb, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scratch(t.G * ps);
    int64_t have = -1;
    for (int64_t i = b; i < e; ++i) {
      const int64_t g = i / t.nmb, p0 = g * t.G, p1 = std::min(P, p0 + t.G);
      const int64_t m0 = (i % t.nmb) * t.MB, m1 = std::min(M, m0 + t.MB);
      if (g != have) kn.dequant_q8p(w + p0 * psb, psb, p1 - p0, K, scratch.data()), have = g;
      kn.gemm_p(xp, M, K, m0, m1, scratch.data(), ps, (p1 - p0) * kPNR, std::min(N, p1 * kPNR) - p0 * kPNR,
                yp + p0 * kPNR, N);
    }
  });
  return y;
}

at::Tensor linear_q4_1_packed(const at::Tensor& x, const at::Tensor& wqp, int64_t n, int64_t K) {
  check_f32(x, "x", 2);
  TORCH_CHECK(wqp.device().is_cpu() && wqp.scalar_type() == at::kByte && wqp.is_contiguous() && wqp.dim() == 3 &&
                  wqp.size(2) == kQ41Blk,
              "wqp must be a contiguous uint8 CPU tensor [P, K/32, ", kQ41Blk, "] (from pack_q4_1)");
  TORCH_CHECK(K > 0 && K % 32 == 0, "Q4_1 needs K % 32 == 0, got K=", K);
  TORCH_CHECK(x.size(1) == K && wqp.size(1) == K / 32, "x has K=", x.size(1), ", wqp has K=", wqp.size(1) * 32,
              ", K=", K);
  const int64_t M = x.size(0), P = wqp.size(0), N = check_packed_n(n, P);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const Kern& kn = kern();
  const uint8_t* w = wqp.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t psb = K / 32 * kQ41Blk, ps = K * kPNR;
  if (M <= kGemvMaxRows) {  // fused dequantize + FMA: streams nibbles + fp16 scales/minima
    at::Tensor xt = M == 1 ? x : pack_x(x, M);
    const float* xp = xt.data_ptr<float>();
    at::parallel_for(0, P, 1, [&](int64_t b, int64_t e) {
      kn.gemv_q41p(xp, M, K, w + b * psb, psb, (e - b) * kPNR, std::min(N, e * kPNR) - b * kPNR, yp + b * kPNR, N);
    });
    return y;
  }
  // Large M: dequantize a panel group into fp32 scratch (exact) and run the fp32 GEMM: same bits.
  at::Tensor xt = pack_x(x, kn.pmr);
  const float* xp = xt.data_ptr<float>();
  const Tasks t = gemm_tasks(M, P, kn.pmr);
  at::parallel_for(0, t.ng * t.nmb, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scratch(t.G * ps);
    int64_t have = -1;
    for (int64_t i = b; i < e; ++i) {
      const int64_t g = i / t.nmb, p0 = g * t.G, p1 = std::min(P, p0 + t.G);
      const int64_t m0 = (i % t.nmb) * t.MB, m1 = std::min(M, m0 + t.MB);
      if (g != have) kn.dequant_q41p(w + p0 * psb, psb, p1 - p0, K, scratch.data()), have = g;
      kn.gemm_p(xp, M, K, m0, m1, scratch.data(), ps, (p1 - p0) * kPNR, std::min(N, p1 * kPNR) - p0 * kPNR,
                yp + p0 * kPNR, N);
    }
  });
  return y;
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
  m.def("sample_rows", &vi::sample_rows, rel());
  m.def("exp64", &vi::exp64_tensor, rel());
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
// The same on packed Q8_0 panels (K % 32 == 0, full K): each weight is float(q) * d (exact),
// then FMA'd exactly as above. w: the panel's first block; off: column offset in the panel.
template <int MR, int NV>
static void qtile(const float* xp, const uint8_t* w, int64_t psb, int64_t off, int64_t K, float* y, int64_t ldy,
                  int64_t cols) {
  V acc[MR * NV];
  acc_in<MR, NV>(acc, y, ldy, cols, false);
  for (int64_t b = 0; b < K; b += 32, w += kQBlk) {
    V sc[NV];
    VI_UNROLL
    for (int j = 0; j < NV; ++j) sc[j] = V::h16(w + (j >> 1) * psb + 2 * (off + (j & 1) * 16));
    const uint8_t* q = w + 2 * kPNR + off;
    for (int kk = 0; kk < 32; ++kk, xp += MR, q += kPNR) {
      V wv[NV];
      VI_UNROLL
      for (int j = 0; j < NV; ++j)
        wv[j] = V::q8(reinterpret_cast<const int8_t*>(q + (j >> 1) * psb + (j & 1) * 16), sc[j]);
      VI_UNROLL
      for (int m = 0; m < MR; ++m) {
        const V xb = V::set1(xp[m]);
        VI_UNROLL
        for (int j = 0; j < NV; ++j) acc[m * NV + j] = V::fma(xb, wv[j], acc[m * NV + j]);
      }
    }
  }
  acc_out<MR, NV>(acc, y, ldy, cols);
}
// The same on packed Q4_1 panels: each weight is fmaf(float(q), d, m) (GGUF's value, see Kern),
// FMA'd in increasing k: k = b + kk reads the low nibbles of byte row kk for kk < 16, then the
// high nibbles of byte row kk - 16.
template <int MR, int NV>
static void q41tile(const float* xp, const uint8_t* w, int64_t psb, int64_t off, int64_t K, float* y, int64_t ldy,
                    int64_t cols) {
  V acc[MR * NV];
  acc_in<MR, NV>(acc, y, ldy, cols, false);
  for (int64_t b = 0; b < K; b += 32, w += kQ41Blk) {
    V sc[NV], mn[NV];
    VI_UNROLL
    for (int j = 0; j < NV; ++j) {
      sc[j] = V::h16(w + (j >> 1) * psb + 2 * (off + (j & 1) * 16));
      mn[j] = V::h16(w + (j >> 1) * psb + 2 * kPNR + 2 * (off + (j & 1) * 16));
    }
    for (int half = 0; half < 2; ++half) {
      const uint8_t* q = w + 4 * kPNR + off;
      for (int kk = 0; kk < 16; ++kk, xp += MR, q += kPNR) {
        V wv[NV];
        VI_UNROLL
        for (int j = 0; j < NV; ++j) wv[j] = V::q41(q + (j >> 1) * psb + (j & 1) * 16, 4 * half, sc[j], mn[j]);
        VI_UNROLL
        for (int m = 0; m < MR; ++m) {
          const V xb = V::set1(xp[m]);
          VI_UNROLL
          for (int j = 0; j < NV; ++j) acc[m * NV + j] = V::fma(xb, wv[j], acc[m * NV + j]);
        }
      }
    }
  }
  acc_out<MR, NV>(acc, y, ldy, cols);
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
// Q: 0 fp32 panels, 1 Q8_0 panels, 2 Q4_1 panels
template <int MR, int NV, int Q>
static void gemv_run(int64_t& c, const float* xp, int64_t K, const void* wp, int64_t ps, int64_t cw, int64_t nv,
                     float* y, int64_t ldy) {
  for (; c + 16 * NV <= cw; c += 16 * NV) {
    const int64_t cols = std::min<int64_t>(16 * NV, nv - c);
    if (cols <= 0) continue;
    if constexpr (Q == 2)
      q41tile<MR, NV>(xp, static_cast<const uint8_t*>(wp) + (c / kPNR) * ps, ps, c % kPNR, K, y + c, ldy, cols);
    else if constexpr (Q == 1)
      qtile<MR, NV>(xp, static_cast<const uint8_t*>(wp) + (c / kPNR) * ps, ps, c % kPNR, K, y + c, ldy, cols);
    else
      ptile<MR, NV>(xp, static_cast<const float*>(wp) + (c / kPNR) * ps + c % kPNR, ps, K, y + c, ldy, cols,
                    false);
  }
}
template <int MR, int Q>
static void gemv_rows(const float* xp, int64_t K, const void* wp, int64_t ps, int64_t cw, int64_t nv, float* y,
                      int64_t ldy) {
  constexpr int NV = Q != 0 ? kGNVq[MR] : kGNV[MR];
  int64_t c = 0;
  gemv_run<MR, NV, Q>(c, xp, K, wp, ps, cw, nv, y, ldy);
  if constexpr (NV > 4) gemv_run<MR, 4, Q>(c, xp, K, wp, ps, cw, nv, y, ldy);
  if constexpr (NV > 2) gemv_run<MR, 2, Q>(c, xp, K, wp, ps, cw, nv, y, ldy);
  if constexpr (NV > 1) gemv_run<MR, 1, Q>(c, xp, K, wp, ps, cw, nv, y, ldy);
}
template <int Q>
static void gemv_any(const float* xp, int64_t M, int64_t K, const void* wp, int64_t ps, int64_t cw, int64_t nv,
                     float* y, int64_t ldy) {
  if (M == 1) gemv_rows<1, Q>(xp, K, wp, ps, cw, nv, y, ldy);
  if (M == 2) gemv_rows<2, Q>(xp, K, wp, ps, cw, nv, y, ldy);
  if (M == 3) gemv_rows<3, Q>(xp, K, wp, ps, cw, nv, y, ldy);
  if (M == 4) gemv_rows<4, Q>(xp, K, wp, ps, cw, nv, y, ldy);
}
static void gemv_p(const float* xp, int64_t M, int64_t K, const float* wp, int64_t ps, int64_t cw, int64_t nv,
                   float* y, int64_t ldy) {
  gemv_any<0>(xp, M, K, wp, ps, cw, nv, y, ldy);
}
static void gemv_q8p(const float* xp, int64_t M, int64_t K, const uint8_t* wp, int64_t psb, int64_t cw, int64_t nv,
                     float* y, int64_t ldy) {
  gemv_any<1>(xp, M, K, wp, psb, cw, nv, y, ldy);
}
static void gemv_q41p(const float* xp, int64_t M, int64_t K, const uint8_t* wp, int64_t psb, int64_t cw, int64_t nv,
                      float* y, int64_t ldy) {
  gemv_any<2>(xp, M, K, wp, psb, cw, nv, y, ldy);
}
static void dequant_q41p(const uint8_t* wp, int64_t psb, int64_t np, int64_t K, float* out) {
  for (int64_t p = 0; p < np; ++p, wp += psb)
    for (int64_t b = 0; b < K / 32; ++b) {
      const uint8_t* blk = wp + b * kQ41Blk;
      const V d0 = V::h16(blk), d1 = V::h16(blk + 32), m0 = V::h16(blk + 64), m1 = V::h16(blk + 96);
      for (int kk = 0; kk < 32; ++kk, out += kPNR) {
        const uint8_t* q = blk + 4 * kPNR + (kk & 15) * kPNR;
        const int shift = kk < 16 ? 0 : 4;
        V::store(out, V::q41(q, shift, d0, m0));
        V::store(out + 16, V::q41(q + 16, shift, d1, m1));
      }
    }
}
static void dequant_q8p(const uint8_t* wp, int64_t psb, int64_t np, int64_t K, float* out) {
  for (int64_t p = 0; p < np; ++p, wp += psb)
    for (int64_t b = 0; b < K / 32; ++b) {
      const uint8_t* blk = wp + b * kQBlk;
      const V s0 = V::h16(blk), s1 = V::h16(blk + 32);
      for (int kk = 0; kk < 32; ++kk, out += kPNR) {
        const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2 * kPNR + kk * kPNR);
        V::store(out, V::q8(q, s0));
        V::store(out + 16, V::q8(q + 16, s1));
      }
    }
}

static const Kern kKern = {linear_f32, linear_q8, dequant_q8, dot, scale_mul, attn_pv,
                           kPMR, gemm_p, gemv_p, gemv_q8p, dequant_q8p, gemv_q41p, dequant_q41p};

#endif  // VI_BODY
