#include "keel/train/samples.h"

#include <cstdio>
#include <cstdlib>

#include "keel/core/error.h"
#include "keel/core/log.h"
#include "keel/data/assets.h"
#include "keel/data/tokenizer.h"
#include "keel/model/inference.h"

namespace keel::train {

void PrintSamples(const RunConfig& cfg, const model::ModelConfig& mcfg,
                  const model::ParamLayout& layout, const float* weights,
                  const data::DatasetMeta* meta) {
  const TrainSection& t = cfg.train;
  if (t.sample_count <= 0 || t.sample_prompt.empty()) return;
  const std::string spec = data::TokenizerSpec(meta);
  try {
    const data::Tokenizer tok = data::Tokenizer::Load(spec, data::AssetsDir());
    model::Generator gen(mcfg, std::vector<float>(weights, weights + layout.total()));
    auto prompt = tok.Encode(t.sample_prompt);
    std::printf("\nsamples (temperature 0.8, top-k 40):\n");
    for (int i = 0; i < t.sample_count; ++i) {
      model::SampleOptions opt;
      opt.max_tokens = t.sample_tokens;
      opt.temperature = 0.8f;
      opt.top_k = 40;
      opt.seed = t.seed + i;
      opt.stop_token = tok.eos_id();
      auto out = gen.Generate(prompt, opt);
      if (!out.empty() && out.back() == tok.eos_id()) out.pop_back();
      std::printf("--- %d: %s%s\n", i + 1, t.sample_prompt.c_str(), tok.Decode(out).c_str());
    }
  } catch (const Error& e) {
    Log("keel: samples skipped (tokenizer %s): %s", spec.c_str(), e.what());
  }
  std::fflush(stdout);
}

}  // namespace keel::train
