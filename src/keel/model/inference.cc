// Legend: C channels, NH query heads, KV key/value heads, hs head size, L layers, V vocabulary,
// F a Llama's SwiGLU width.
#include "keel/model/inference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "keel/core/error.h"
#include "keel/core/rng.h"
#include "keel/kernels/backend.h"

namespace keel::model {

// Decoding runs on the CPU backend over host vectors: one token at a time against a KV cache,
// where a GPU would idle between launches.
namespace {
const kernels::Backend& Cpu() { return kernels::Cpu(); }
}  // namespace

Generator::Generator(const ModelConfig& cfg, std::vector<float> weights)
    : cfg_(cfg), layout_(ParamLayout::Whole(cfg)), w_(std::move(weights)) {
  KEEL_CHECK(w_.size() == layout_.total(), "Generator: weights do not match the config");
  const size_t C = cfg.n_embd, kv = size_t(cfg.kv_heads()) * cfg.head_size();
  k_cache_.resize(size_t(cfg.n_layer) * cfg.block_size * kv);
  v_cache_.resize(k_cache_.size());
  x_.resize(C), ln_.resize(C), qkv_.resize(size_t(cfg.qkv_dim())), y_.resize(C);
  fc_.resize(size_t(cfg.fc_dim())), fc_gelu_.resize(size_t(cfg.ffn()));
  logits_.resize(cfg.vocab_size);
  scores_.resize(cfg.block_size), mean_.resize(1), rstd_.resize(1);
}

void Generator::Attend(int l, int t) {
  const int C = cfg_.n_embd, NH = cfg_.n_head, hs = cfg_.head_size(), KV = cfg_.kv_heads();
  const size_t kvw = size_t(KV) * hs;
  float* kc = k_cache_.data() + size_t(l) * cfg_.block_size * kvw;
  float* vc = v_cache_.data() + size_t(l) * cfg_.block_size * kvw;
  // host: the KV cache is host memory (Cpu() above).
  std::memcpy(kc + size_t(t) * kvw, qkv_.data() + C, sizeof(float) * kvw);
  std::memcpy(vc + size_t(t) * kvw, qkv_.data() + C + kvw, sizeof(float) * kvw);
  const float scale = 1.0f / std::sqrt(float(hs));
  for (int hd = 0; hd < NH; ++hd) {
    const float* q = qkv_.data() + hd * hs;
    const size_t kv_at = size_t(hd / (NH / KV)) * hs;  // grouped-query: the group's head
    float mx = -INFINITY;
    for (int j = 0; j <= t; ++j) {
      const float* kj = kc + size_t(j) * kvw + kv_at;
      float s = 0;
      for (int i = 0; i < hs; ++i) s += q[i] * kj[i];
      scores_[j] = s * scale;
      mx = std::max(mx, scores_[j]);
    }
    float sum = 0;
    for (int j = 0; j <= t; ++j) sum += (scores_[j] = std::exp(scores_[j] - mx));
    float* y = y_.data() + hd * hs;
    std::fill(y, y + hs, 0.0f);
    for (int j = 0; j <= t; ++j) {
      const float p = scores_[j] / sum;
      const float* vj = vc + size_t(j) * kvw + kv_at;
      for (int i = 0; i < hs; ++i) y[i] += p * vj[i];
    }
  }
}

void Generator::Gpt2Block(int l, int t) {
  const int C = cfg_.n_embd;
  const std::string h = "h." + std::to_string(l) + ".";
  Cpu().LayerNormForward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), P(h + "ln_1.weight"),
                         P(h + "ln_1.bias"), 1, C);
  Cpu().MatmulForward(qkv_.data(), ln_.data(), P(h + "attn.c_attn.weight"),
                      P(h + "attn.c_attn.bias"), 1, C, 3 * C);
  Attend(l, t);
  Cpu().MatmulForward(x_.data(), y_.data(), P(h + "attn.c_proj.weight"), P(h + "attn.c_proj.bias"),
                      1, C, C, /*accumulate=*/true);
  Cpu().LayerNormForward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), P(h + "ln_2.weight"),
                         P(h + "ln_2.bias"), 1, C);
  Cpu().MatmulForward(fc_.data(), ln_.data(), P(h + "mlp.c_fc.weight"), P(h + "mlp.c_fc.bias"), 1,
                      C, 4 * C);
  Cpu().GeluForward(fc_gelu_.data(), fc_.data(), size_t(4) * C);
  Cpu().MatmulForward(x_.data(), fc_gelu_.data(), P(h + "mlp.c_proj.weight"),
                      P(h + "mlp.c_proj.bias"), 1, 4 * C, C, /*accumulate=*/true);
}

void Generator::LlamaBlock(int l, int t) {
  const int C = cfg_.n_embd, F = cfg_.ffn();
  const float eps = cfg_.norm_eps;
  const std::string h = "h." + std::to_string(l) + ".";
  Cpu().RmsNormForward(ln_.data(), rstd_.data(), x_.data(), P(h + "ln_1.weight"), 1, C, eps);
  // q_proj, k_proj and v_proj are adjacent: one product.
  Cpu().MatmulForward(qkv_.data(), ln_.data(), P(h + "attn.q_proj.weight"), nullptr, 1, C,
                      cfg_.qkv_dim());
  Cpu().RopeForward(qkv_.data(), 1, 1, cfg_.n_head, cfg_.kv_heads(), cfg_.head_size(),
                    cfg_.rope_theta, /*pos0=*/t);
  Attend(l, t);
  Cpu().MatmulForward(x_.data(), y_.data(), P(h + "attn.o_proj.weight"), nullptr, 1, C, C,
                      /*accumulate=*/true);
  Cpu().RmsNormForward(ln_.data(), rstd_.data(), x_.data(), P(h + "ln_2.weight"), 1, C, eps);
  Cpu().MatmulForward(fc_.data(), ln_.data(), P(h + "mlp.gate_proj.weight"), nullptr, 1, C, 2 * F);
  Cpu().SwigluForward(fc_gelu_.data(), fc_.data(), 1, F);
  Cpu().MatmulForward(x_.data(), fc_gelu_.data(), P(h + "mlp.down_proj.weight"), nullptr, 1, F, C,
                      /*accumulate=*/true);
}

const std::vector<float>& Generator::Step(int32_t token) {
  KEEL_CHECK(pos_ < cfg_.block_size, "Generator: context is full");
  KEEL_CHECK(token >= 0 && token < cfg_.vocab_size, "Generator: token out of range");
  const int C = cfg_.n_embd, t = pos_;
  const float* wte = P("wte.weight");
  for (int c = 0; c < C; ++c) x_[c] = wte[size_t(token) * C + c];
  if (!cfg_.llama()) {
    const float* wpe = P("wpe.weight");
    for (int c = 0; c < C; ++c) x_[c] += wpe[size_t(t) * C + c];
  }
  for (int l = 0; l < cfg_.n_layer; ++l) cfg_.llama() ? LlamaBlock(l, t) : Gpt2Block(l, t);
  if (cfg_.llama()) {
    Cpu().RmsNormForward(ln_.data(), rstd_.data(), x_.data(), P("ln_f.weight"), 1, C,
                         cfg_.norm_eps);
    Cpu().ClassifierLogits(logits_.data(), ln_.data(), P("lm_head.weight"), 1, C, cfg_.vocab_size);
  } else {
    Cpu().LayerNormForward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), P("ln_f.weight"),
                           P("ln_f.bias"), 1, C);
    Cpu().ClassifierLogits(logits_.data(), ln_.data(), wte, 1, C, cfg_.vocab_size);
  }
  ++pos_;
  return logits_;
}

int SampleIndex(const double* probs, int n, double u) {
  // u may end a rounding error above 0 after every subtraction (a draw of exactly 1): the last
  // candidate with any probability takes it, never one of probability 0.
  int last = 0;
  for (int i = 0; i < n; ++i) {
    if (probs[i] > 0) last = i;
    u -= probs[i];
    if (u <= 0 && probs[i] > 0) return i;
  }
  return last;
}

std::vector<int32_t> Generator::Generate(const std::vector<int32_t>& prompt,
                                         const SampleOptions& opt) {
  if (prompt.empty()) ThrowBadInput("generate: the prompt is empty (expected at least one token)");
  if (int(prompt.size()) >= cfg_.block_size)
    ThrowBadInput("generate: the prompt has " + std::to_string(prompt.size()) +
                  " tokens; the model's context is " + std::to_string(cfg_.block_size));
  Reset();
  const std::vector<float>* logits = nullptr;
  for (int32_t tok : prompt) logits = &Step(tok);
  std::vector<int32_t> out;
  const Philox rng(opt.seed, /*stream=*/0);
  std::vector<int> order(cfg_.vocab_size);
  std::vector<double> probs(cfg_.vocab_size);
  while (int(out.size()) < opt.max_tokens && pos_ < cfg_.block_size) {
    const std::vector<float>& lg = *logits;
    // A NaN logit would make greedy decoding repeat token 0 and sampling its last candidate.
    for (float v : lg)
      if (!std::isfinite(v))
        ThrowRuntime("generate: the model's logits at position " + std::to_string(pos_) +
                     " are not finite (" + std::to_string(v) + "): its weights hold a NaN or an " +
                     "infinity (keel eval names which)");
    int next;
    if (opt.temperature <= 0) {
      next = int(std::max_element(lg.begin(), lg.end()) - lg.begin());
    } else {
      std::iota(order.begin(), order.end(), 0);
      int keep = opt.top_k > 0 ? std::min(opt.top_k, cfg_.vocab_size) : cfg_.vocab_size;
      std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                        [&](int a, int b) { return lg[a] > lg[b]; });
      const double mx = lg[order[0]];
      double sum = 0;
      for (int i = 0; i < keep; ++i)
        sum += (probs[i] = std::exp((lg[order[i]] - mx) / opt.temperature));
      next = order[SampleIndex(probs.data(), keep, rng.Uniform(out.size()) * sum)];
    }
    out.push_back(next);
    if (next == opt.stop_token || pos_ >= cfg_.block_size) break;
    logits = &Step(next);
  }
  return out;
}

}  // namespace keel::model
