// verinfer._kernels, part 3: fused decode-step glue (issue 19).
//
// A decode step of a small model is ~200 short kernel calls plus the PyTorch ops between them
// (residual adds, .contiguous() copies, views, per-sequence KV-cache slicing, list building);
// at one token per step that glue costs about a tenth of the step. The functions here run
// those sequences in one crossing into C++ each.
//
// They add NO arithmetic of their own beyond what the unfused sequence does, in the same order:
// every norm, rotary table lookup and attention is the very kernel of verinfer_kernels.cpp
// (declared below, defined there: one home for each formula), and what is computed here is only
// IEEE additions and products that PyTorch's elementwise ops round the same way (residual add,
// rotary products and sums, each rounded on its own: the build passes -ffp-contract=off), plus
// copies. So the bits equal the unfused sequence on every ISA path; tests/unit/test_kernels_fused.py
// compares them. Inputs are validated before any memory is written (TORCH_CHECK -> KernelError).
#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace vi {

// ---- defined in verinfer_kernels.cpp
at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& w, double eps);
at::Tensor rmsnorm_rope_half(const at::Tensor& x, const at::Tensor& w, double eps, const at::Tensor& cos,
                             const at::Tensor& sin);
at::Tensor gelu_tanh_mul(const at::Tensor& gate, const at::Tensor& up);
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up);
at::Tensor attention(const at::Tensor& q, const std::vector<at::Tensor>& kc, const std::vector<at::Tensor>& vc,
                     const at::Tensor& seq, const at::Tensor& pos, int64_t window, double scale);

namespace {

void check_f32c(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat, name,
              " must be a float32 CPU tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dims");
}

// Rotary on rows of D floats (n: the normed or raw head, y: the output), the arithmetic of
// models/common.py rope_half (half = true: pairs (i, i + D/2)) or rope_interleaved (pairs
// (2i, 2i + 1)): y0 = a*c - b*s, y1 = b*c + a*s, every product and sum rounded on its own.
inline void rope_row(const float* n, const float* c, const float* s, int64_t D, bool half, float* y) {
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; ++i) {
    const int64_t i0 = half ? i : 2 * i, i1 = half ? i + h : 2 * i + 1;
    const float a = n[i0], b = n[i1];
    y[i0] = a * c[i] - b * s[i];
    y[i1] = b * c[i] + a * s[i];
  }
}

// rope(norm?(x)) for x [T, n, D]: Gemma's one-pass kernel when it applies, else the norm kernel
// (one row per (token, head), as qwen3.py did) and rope_row.
at::Tensor norm_rope(const at::Tensor& x, const c10::optional<at::Tensor>& w, double eps, const at::Tensor& cos,
                     const at::Tensor& sin, bool half) {
  const at::Tensor xc = x.contiguous();
  if (w.has_value() && half) return rmsnorm_rope_half(xc, *w, eps, cos, sin);
  const int64_t T = xc.size(0), n = xc.size(1), D = xc.size(2);
  const at::Tensor src = w.has_value() ? rmsnorm(xc.view({T * n, D}), *w, eps) : xc;
  at::Tensor y = at::empty({T, n, D}, xc.options());
  const float *sp = src.data_ptr<float>(), *cp = cos.data_ptr<float>(), *snp = sin.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t r = 0; r < T * n; ++r)
    rope_row(sp + r * D, cp + (r / n) * (D / 2), snp + (r / n) * (D / 2), D, half, yp + r * D);
  return y;
}

}  // namespace

// x += post.has_value() ? rmsnorm(o, post) : o, in place (x, o: [T, n]); returns
// rmsnorm(x, next): the residual step of a layer and the norm after it in one call. The add is
// one IEEE rounding per element, as PyTorch's `x + y` (alpha 1) gives.
at::Tensor add_rmsnorm_(at::Tensor x, const at::Tensor& o, const c10::optional<at::Tensor>& post,
                        const at::Tensor& next, double eps) {
  check_f32c(x, "x", 2), check_f32c(o, "o", 2);
  TORCH_CHECK(o.sizes() == x.sizes(), "o must have x's shape [", x.size(0), ", ", x.size(1), "]");
  check_f32c(next, "norm weight", 1);
  TORCH_CHECK(next.size(0) == x.size(1), "norm weights must have ", x.size(1), " elements");
  if (post.has_value()) {
    check_f32c(*post, "norm weight", 1);
    TORCH_CHECK(post->size(0) == x.size(1), "norm weights must have ", x.size(1), " elements");
  }
  const at::Tensor add = post.has_value() ? rmsnorm(o, *post, eps) : o;
  float* xp = x.data_ptr<float>();
  const float* ap = add.data_ptr<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) xp[i] = xp[i] + ap[i];
  return rmsnorm(x, next, eps);
}

// The attention block after the q/k/v projections, for T tokens of any mix of sequences:
//   q' = rope(norm_q?(q)), k' = rope(norm_k?(k)) (half or interleaved layout);
//   k_caches[seq[t]][layer, :, pos[t]] = k'[t], v_caches[seq[t]][layer, :, pos[t]] = v[t];
//   returns attention(q', caches' layer, seq, pos, window, scale) as [T, H*D].
// qkv: the projections as column blocks of [T, cols] float32 (rows may be strided): either one
// block q|k|v [T, (H + 2 KV) D] (a grouped matmul's output, split here instead of by three
// PyTorch views) or three blocks q [T, H D], k and v [T, KV D]. Caches: the whole KVCache
// tensors [n_layers, KV, cap, D] (the layer's views are taken here, not built per layer).
at::Tensor qk_rope_attention(const std::vector<at::Tensor>& qkv, int64_t H, int64_t KV, int64_t D,
                             const c10::optional<at::Tensor>& q_norm, const c10::optional<at::Tensor>& k_norm,
                             double eps, const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                             const std::vector<at::Tensor>& k_caches, const std::vector<at::Tensor>& v_caches,
                             int64_t layer, const at::Tensor& seq, const at::Tensor& pos, int64_t window,
                             double scale) {
  TORCH_CHECK(qkv.size() == 1 || qkv.size() == 3, "qkv must be one q|k|v block or three blocks, got ",
              qkv.size());
  TORCH_CHECK(D > 0 && D % 2 == 0, "head size must be even, got ", D);
  TORCH_CHECK(H > 0 && KV > 0 && H % KV == 0, "need H % KV == 0 with H, KV > 0, got ", H, ", ", KV);
  const int64_t want[3] = {H * D, KV * D, KV * D};
  for (size_t i = 0; i < qkv.size(); ++i) {
    const at::Tensor& b = qkv[i];
    TORCH_CHECK(b.device().is_cpu() && b.scalar_type() == at::kFloat && b.dim() == 2,
                "qkv blocks must be float32 CPU [T, cols]");
    TORCH_CHECK(b.size(0) == qkv[0].size(0), "qkv blocks must have the same rows");
    const int64_t cols = qkv.size() == 1 ? want[0] + want[1] + want[2] : want[i];
    TORCH_CHECK(b.size(1) == cols, "qkv block ", i, " must have ", cols, " columns, got ", b.size(1));
  }
  const int64_t T = qkv[0].size(0);
  at::Tensor q, k, v;
  if (qkv.size() == 1)
    q = qkv[0].narrow(1, 0, want[0]), k = qkv[0].narrow(1, want[0], want[1]),
    v = qkv[0].narrow(1, want[0] + want[1], want[2]);
  else
    q = qkv[0], k = qkv[1], v = qkv[2];
  q = q.reshape({T, H, D}), k = k.reshape({T, KV, D}), v = v.reshape({T, KV, D});
  for (const c10::optional<at::Tensor>* w : {&q_norm, &k_norm})
    if (w->has_value()) {
      check_f32c(**w, "q/k norm weight", 1);
      TORCH_CHECK((*w)->size(0) == D, "q/k norm weights must have ", D, " elements");
    }
  check_f32c(cos, "cos", 2), check_f32c(sin, "sin", 2);
  TORCH_CHECK(cos.size(0) == T && cos.size(1) == D / 2 && sin.sizes() == cos.sizes(), "cos and sin must be [T, D/2]");
  TORCH_CHECK(!k_caches.empty() && k_caches.size() == v_caches.size(),
              "k_caches and v_caches must be equal-length, non-empty");
  const int64_t S = static_cast<int64_t>(k_caches.size());
  std::vector<int64_t> caps(S);
  for (int64_t i = 0; i < S; ++i) {
    check_f32c(k_caches[i], "k_cache", 4), check_f32c(v_caches[i], "v_cache", 4);
    const at::Tensor& kc = k_caches[i];
    TORCH_CHECK(kc.size(1) == KV && kc.size(3) == D && v_caches[i].sizes() == kc.sizes(), "cache ", i,
                " must be [layers, ", KV, ", cap, ", D, "] for both k and v");
    TORCH_CHECK(layer >= 0 && layer < kc.size(0), "layer ", layer, " is outside cache ", i, "'s ", kc.size(0),
                " layers");
    caps[i] = kc.size(2);
  }
  for (const at::Tensor* t : {&seq, &pos})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous() && t->dim() == 1 && t->size(0) == T,
                "seq and pos must be contiguous int64 [T]");
  const int64_t *sp = seq.data_ptr<int64_t>(), *pp = pos.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(sp[t] >= 0 && sp[t] < S && pp[t] >= 0 && pp[t] < caps[sp[t]], "token ", t, ": seq ", sp[t],
                " / pos ", pp[t], " out of range");

  const bool half = !interleaved;
  const at::Tensor qr = norm_rope(q, q_norm, eps, cos, sin, half);
  const at::Tensor kr = norm_rope(k, k_norm, eps, cos, sin, half);
  const at::Tensor vc = v.contiguous();
  const float *kp = kr.data_ptr<float>(), *vp = vc.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {  // the cache rows this step adds (attention reads them back)
    float* kd = k_caches[sp[t]].data_ptr<float>();
    float* vd = v_caches[sp[t]].data_ptr<float>();
    for (int64_t g = 0; g < KV; ++g) {
      const int64_t dst = ((layer * KV + g) * caps[sp[t]] + pp[t]) * D, src = (t * KV + g) * D;
      std::memcpy(kd + dst, kp + src, D * sizeof(float));
      std::memcpy(vd + dst, vp + src, D * sizeof(float));
    }
  }
  std::vector<at::Tensor> kl, vl;
  kl.reserve(S), vl.reserve(S);
  for (int64_t i = 0; i < S; ++i) kl.push_back(k_caches[i].select(0, layer)), vl.push_back(v_caches[i].select(0, layer));
  return attention(qr, kl, vl, seq, pos, window, scale).view({T, H * D});
}

// act(y[:, :F]) * y[:, F:] for y [T, 2F], the gate|up output of one grouped matmul: the
// elementwise kernels of verinfer_kernels.cpp on the two column halves (copied only if T > 1).
at::Tensor glu(const at::Tensor& y, const std::string& act) {
  check_f32c(y, "y", 2);
  TORCH_CHECK(y.size(1) % 2 == 0, "y must be [T, 2F], got ", y.size(1), " columns");
  TORCH_CHECK(act == "gelu_tanh" || act == "silu", "act must be gelu_tanh or silu, got '", act, "'");
  const int64_t F = y.size(1) / 2;
  const at::Tensor gate = y.narrow(1, 0, F).contiguous(), up = y.narrow(1, F, F).contiguous();
  return act == "silu" ? silu_mul(gate, up) : gelu_tanh_mul(gate, up);
}

void register_fused(pybind11::module& m) {
  using rel = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.def("add_rmsnorm_", &add_rmsnorm_, rel());
  m.def("qk_rope_attention", &qk_rope_attention, rel());
  m.def("glu", &glu, rel());
}

}  // namespace vi
