// verinfer._kernels, part 2: the token sampler (sampling rule vi-sample-v2).
//
// A seeded draw must pick the same token on every machine, so every number it depends on is
// computed here from IEEE double +, -, *, / only — no libm, no FMA (the build passes
// -ffp-contract=off), no order chosen by a library. The rule, for one row of float32 logits
// and u = uniform(seed, position) in [0, 1) (sampling.py, which holds an executable numpy
// reference of this exact rule that the tests compare against):
//
//   z[i]   = double(logit[i]) / temperature
//   top-k  keep the k largest z (ties: lower id first); k = 0 or k >= V keeps all
//   p[i]   = exp64(z[i] - max z)           over the survivors (exp64 below)
//   mass   = sequential sum of p in increasing id                      ("sum" below)
//   top-p  (top_p < 1) keep the shortest prefix of the survivors ordered by (p desc, id asc)
//          whose sequential running sum reaches top_p * mass; at least one; all if rounding
//          never reaches it
//   draw   c = 0; walk the kept tokens in increasing id, c += p; return the first with
//          c > u * sum(kept p); the last kept token if none
//
// exp64(x), x <= 0: 0 for x < -700 (results stay normal, no subnormal or FTZ question);
// else n = round(x / ln2) by the 1.5 * 2^52 shifter, r = (x - n*LN2_HI) - n*LN2_LO, Taylor
// polynomial of degree 13 in Horner form, times 2^n built from the shifter's bits. ~1 ulp.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

namespace vi {
namespace {

constexpr double kShifter = 0x1.8p52, kLog2e = 0x1.71547652b82fep+0;
constexpr double kLn2Hi = 0x1.62e42fee00000p-1, kLn2Lo = 0x1.a39ef35793c76p-33;  // n*kLn2Hi exact
constexpr double kExpFloor = -700.0;
// 1/k! for k = 13 .. 0 (correctly rounded)
constexpr double kInvFact[14] = {0x1.6124613a86d09p-33, 0x1.1eed8eff8d898p-29, 0x1.ae64567f544e4p-26,
                                 0x1.27e4fb7789f5cp-22, 0x1.71de3a556c734p-19, 0x1.a01a01a01a01ap-16,
                                 0x1.a01a01a01a01ap-13, 0x1.6c16c16c16c17p-10, 0x1.1111111111111p-7,
                                 0x1.5555555555555p-5,  0x1.5555555555555p-3,  0x1p-1,
                                 0x1p+0,                0x1p+0};

static inline __attribute__((always_inline)) double exp64(double x) {
  const double xc = x < kExpFloor ? kExpFloor : x;
  const double t = xc * kLog2e + kShifter;
  const double n = t - kShifter;
  const double r = (xc - n * kLn2Hi) - n * kLn2Lo;
  double p = kInvFact[0];
  for (int i = 1; i < 14; ++i) p = p * r + kInvFact[i];
  int64_t bits;
  std::memcpy(&bits, &t, 8);  // low bits hold n (t = 1.5 * 2^52 + n exactly)
  const uint64_t sb = static_cast<uint64_t>(bits + 1023) << 52;
  double s;
  std::memcpy(&s, &sb, 8);
  const double e = p * s;
  return x < kExpFloor ? 0.0 : e;
}

// The two O(V) elementwise loops: a portable version and an AVX2 version made of the same IEEE
// operations lane by lane (mul, add, sub, div, max, integer add/shift), so both give the same
// bits; chosen at run time. GCC does not vectorize the portable loops (the selects), hence
// the intrinsics. scale: z[i] = double(x[i]) / temperature, *zmax = max z (exact in any order);
// false on a non-finite z (as the reference checks): a finite logit over a tiny temperature
// overflows, and a NaN from inf - inf later would go through the two exps differently
// (max_pd maps NaN to the floor, the portable exp keeps it).
static bool scale_row_portable(const float* x, int64_t n, double temperature, double* z, double* zmax) {
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    z[i] = static_cast<double>(x[i]) / temperature;
    finite = finite && std::isfinite(z[i]);
    *zmax = z[i] > *zmax ? z[i] : *zmax;
  }
  return finite;
}
static void exp_shifted_portable(double* z, int64_t n, double m) {
  for (int64_t i = 0; i < n; ++i) z[i] = exp64(z[i] - m);
}

__attribute__((target("avx2"))) static bool scale_row_avx2(const float* x, int64_t n, double temperature,
                                                           double* z, double* zmax) {
  const __m256d t = _mm256_set1_pd(temperature);
  __m256d bad = _mm256_setzero_pd(), mx = _mm256_set1_pd(*zmax);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + i));  // float -> double is exact
    const __m256d zv = _mm256_div_pd(v, t);
    bad = _mm256_or_pd(bad, _mm256_cmp_pd(_mm256_sub_pd(zv, zv), _mm256_setzero_pd(), _CMP_NEQ_UQ));
    mx = _mm256_max_pd(mx, zv);
    _mm256_storeu_pd(z + i, zv);
  }
  double lanes[4];
  _mm256_storeu_pd(lanes, mx);
  for (double l : lanes) *zmax = l > *zmax ? l : *zmax;
  const bool finite = _mm256_movemask_pd(bad) == 0;
  return scale_row_portable(x + i, n - i, temperature, z + i, zmax) && finite;
}
__attribute__((target("avx2"))) static inline __m256d exp64_avx2(__m256d x) {
  const __m256d floor = _mm256_set1_pd(kExpFloor), shifter = _mm256_set1_pd(kShifter);
  const __m256d xc = _mm256_max_pd(x, floor);  // finite inputs: the same as x < floor ? floor : x
  const __m256d t = _mm256_add_pd(_mm256_mul_pd(xc, _mm256_set1_pd(kLog2e)), shifter);
  const __m256d n = _mm256_sub_pd(t, shifter);
  const __m256d r = _mm256_sub_pd(_mm256_sub_pd(xc, _mm256_mul_pd(n, _mm256_set1_pd(kLn2Hi))),
                                  _mm256_mul_pd(n, _mm256_set1_pd(kLn2Lo)));
  __m256d p = _mm256_set1_pd(kInvFact[0]);
  for (int i = 1; i < 14; ++i) p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(kInvFact[i]));
  const __m256i sb = _mm256_slli_epi64(_mm256_add_epi64(_mm256_castpd_si256(t), _mm256_set1_epi64x(1023)), 52);
  const __m256d e = _mm256_mul_pd(p, _mm256_castsi256_pd(sb));
  return _mm256_andnot_pd(_mm256_cmp_pd(x, floor, _CMP_LT_OQ), e);  // x < floor -> 0
}
__attribute__((target("avx2"))) static void exp_shifted_avx2(double* z, int64_t n, double m) {
  const __m256d mv = _mm256_set1_pd(m);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {  // four independent Horner chains hide the add/mul latency
    __m256d v[4];
    for (int j = 0; j < 4; ++j) v[j] = exp64_avx2(_mm256_sub_pd(_mm256_loadu_pd(z + i + 4 * j), mv));
    for (int j = 0; j < 4; ++j) _mm256_storeu_pd(z + i + 4 * j, v[j]);
  }
  exp_shifted_portable(z + i, n - i, m);
}

static bool have_avx2() {
  static const bool yes = (__builtin_cpu_init(), __builtin_cpu_supports("avx2"));
  return yes;
}
static bool scale_row(const float* x, int64_t n, double temperature, double* z, double* zmax) {
  *zmax = -HUGE_VAL;
  return have_avx2() ? scale_row_avx2(x, n, temperature, z, zmax)
                     : scale_row_portable(x, n, temperature, z, zmax);
}
static void exp_shifted(double* z, int64_t n, double m) {
  have_avx2() ? exp_shifted_avx2(z, n, m) : exp_shifted_portable(z, n, m);
}

struct Scratch {
  std::vector<double> z, kept_p;
  std::vector<int64_t> ids, order, kept;
};

// The whole rule for one row; returns the token id.
int64_t sample_row(const float* logits, int64_t V, double temperature, int64_t top_k, double top_p, double u,
                   Scratch& w) {
  w.z.resize(V);
  double m;  // max z: also the survivors' max (top-k keeps the largest)
  TORCH_CHECK(scale_row(logits, V, temperature, w.z.data(), &m), "logits / temperature contain a NaN or an infinity");
  // survivors: ids (ascending) and their z, packed at the front of w.z
  int64_t S = V;
  const bool all = top_k <= 0 || top_k >= V;
  if (!all) {
    w.ids.resize(V);
    std::iota(w.ids.begin(), w.ids.end(), int64_t{0});
    const double* z = w.z.data();
    std::nth_element(w.ids.begin(), w.ids.begin() + (top_k - 1), w.ids.end(),
                     [z](int64_t a, int64_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
    S = top_k;
    std::sort(w.ids.begin(), w.ids.begin() + S);
    for (int64_t i = 0; i < S; ++i) w.z[i] = w.z[w.ids[i]];  // ids ascending: reads stay ahead
  }
  auto id_of = [&](int64_t i) { return all ? i : w.ids[i]; };
  double* p = w.z.data();
  exp_shifted(p, S, m);

  // kept tokens as survivor indices (ascending); kept == nullptr means all survivors
  const int64_t* kept = nullptr;
  int64_t nk = S;
  if (top_p < 1.0) {
    double mass = 0.0;
    for (int64_t i = 0; i < S; ++i) mass = mass + p[i];
    const double target = top_p * mass;
    auto desc = [p](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };
    w.order.resize(S);
    int64_t cand = std::min<int64_t>(256, S), n_keep = -1;
    for (;;) {  // the nucleus is a prefix of the total order: sort only as much as needed
      std::iota(w.order.begin(), w.order.end(), int64_t{0});
      std::nth_element(w.order.begin(), w.order.begin() + (cand - 1), w.order.end(), desc);  // O(S)
      std::sort(w.order.begin(), w.order.begin() + cand, desc);
      double c = 0.0;
      for (int64_t i = 0; i < cand; ++i) {
        c = c + p[w.order[i]];
        if (c >= target) {
          n_keep = i + 1;
          break;
        }
      }
      if (n_keep > 0) break;
      if (cand == S) {
        n_keep = S;
        break;
      }
      cand = std::min(cand * 8, S);
    }
    w.kept.assign(w.order.begin(), w.order.begin() + n_keep);
    std::sort(w.kept.begin(), w.kept.end());
    kept = w.kept.data();
    nk = n_keep;
  }
  // draw: prefix sums of the kept p in increasing id, then the first prefix > u * total
  w.kept_p.resize(nk);
  double c = 0.0;
  for (int64_t i = 0; i < nk; ++i) w.kept_p[i] = c = c + p[kept ? kept[i] : i];
  const double thr = u * c;
  const int64_t j = std::upper_bound(w.kept_p.begin(), w.kept_p.end(), thr) - w.kept_p.begin();
  const int64_t pick = std::min(j, nk - 1);
  return id_of(kept ? kept[pick] : pick);
}

}  // namespace

// logits [R, V] float32; us [R] float64 in [0, 1): one token id per row (int64 [R]).
at::Tensor sample_rows(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                       const at::Tensor& us) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == at::kFloat && logits.is_contiguous() &&
                  logits.dim() == 2,
              "logits must be a contiguous float32 [R, V] CPU tensor");
  TORCH_CHECK(us.device().is_cpu() && us.scalar_type() == at::kDouble && us.is_contiguous() && us.dim() == 1 &&
                  us.size(0) == logits.size(0),
              "us must be a contiguous float64 [R] CPU tensor (one u per row)");
  TORCH_CHECK(logits.size(1) > 0, "logits rows are empty");
  TORCH_CHECK(std::isfinite(temperature) && temperature > 0.0, "temperature must be > 0, got ", temperature);
  TORCH_CHECK(top_p > 0.0 && top_p <= 1.0, "top_p must be in (0, 1], got ", top_p);
  TORCH_CHECK(top_k >= 0, "top_k must be >= 0, got ", top_k);
  const int64_t R = logits.size(0), V = logits.size(1);
  const double* up = us.data_ptr<double>();
  for (int64_t r = 0; r < R; ++r) TORCH_CHECK(up[r] >= 0.0 && up[r] < 1.0, "u must be in [0, 1), got ", up[r]);
  at::Tensor out = at::empty({R}, logits.options().dtype(at::kLong));
  const float* lp = logits.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, R, 1, [&](int64_t b, int64_t e) {
    Scratch w;
    for (int64_t r = b; r < e; ++r) op[r] = sample_row(lp + r * V, V, temperature, top_k, top_p, up[r], w);
  });
  return out;
}

// exp64 over a float64 array (for tests against the numpy reference).
at::Tensor exp64_tensor(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kDouble && x.is_contiguous(),
              "x must be a contiguous float64 CPU tensor");
  at::Tensor out = x.clone();
  exp_shifted(out.data_ptr<double>(), out.numel(), 0.0);
  return out;
}

}  // namespace vi
