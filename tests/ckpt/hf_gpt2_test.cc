// Hugging Face GPT-2 interop (ckpt/hf_gpt2.h, ckpt/model_source.h, `keel ckpt export/import`,
// `[model] init_from`): the round trip is exact, the file holds HF's names and Conv1D [in, out]
// matrices with the unpadded vocabulary, HF's own variants (no "transformer." prefix, mask
// buffers, a tied lm_head, bf16) load, and each kind of bad input is one line naming the file and
// the tensor. The logits of an export under HF's layout are checked against PyTorch in
// tests/reference (reference_hf_export).
#include "keel/ckpt/hf_gpt2.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "keel/ckpt/model_file.h"
#include "keel/ckpt/model_source.h"
#include "keel/ckpt/peft.h"
#include "keel/ckpt/safetensors.h"
#include "keel/core/error.h"
#include "keel/core/rng.h"
#include "keel/model/params.h"
#include "train/run_util.h"

namespace keel::ckpt {
namespace {

using test::TempDir;

// 300 is not a multiple of 128: wte is padded to 384 rows in keel, 300 in the file.
constexpr model::ModelConfig kCfg{/*n_layer=*/2, /*n_head=*/4, /*n_embd=*/64,
                                  /*vocab_size=*/300, /*block_size=*/16};

// Every element distinct and non-zero (LayerNorm gains and biases too), except the padded wte
// rows, which keel keeps at zero: a swapped or transposed tensor cannot go unnoticed.
std::vector<float> DistinctWeights(const model::ParamLayout& layout, const model::ModelConfig& c) {
  std::vector<float> w(layout.total());
  const Philox rng(7, 0);
  for (size_t i = 0; i < w.size(); ++i) w[i] = rng.Normal(i);
  const auto& wte = layout.Find("wte.weight");
  std::fill(w.begin() + wte.offset + size_t(c.vocab_size) * c.n_embd,
            w.begin() + wte.offset + wte.numel, 0.0f);
  return w;
}

std::string ExportTiny(const TempDir& dir, std::vector<float>* weights = nullptr) {
  const auto layout = model::ParamLayout::Whole(kCfg);
  std::vector<float> w = DistinctWeights(layout, kCfg);
  const std::string path = dir / "hf.safetensors";
  WriteHfGpt2(path, kCfg, layout, w.data());
  if (weights) *weights = std::move(w);
  return path;
}

// Rewrites an HF file through `edit`, which may rename, drop, add or reshape tensors and change
// the metadata; tensors are written back as F32.
void Rewrite(const std::string& from, const std::string& to,
             const std::function<void(std::map<std::string, Fp32Tensor>&,
                                      std::map<std::string, std::string>&)>& edit) {
  const SafetensorsFile f = SafetensorsFile::Read(from);
  std::map<std::string, Fp32Tensor> tensors = f.tensors();
  std::map<std::string, std::string> meta = f.metadata();
  edit(tensors, meta);
  SafetensorsWriter w;
  for (const auto& [name, t] : tensors) w.Add(name, t.shape, t.data.data());
  for (const auto& [k, v] : meta) w.SetMetadata(k, v);
  w.Write(to);
}

// Writes a safetensors file by hand, for dtypes SafetensorsWriter does not write.
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
void WriteRaw(const std::string& path, const std::vector<RawTensor>& tensors) {
  nlohmann::ordered_json h;
  size_t off = 0;
  for (const auto& t : tensors) {
    h[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  const std::string header = h.dump();
  const uint64_t n = header.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  for (const auto& t : tensors) out << t.bytes;
}

std::string Bf16Bytes(const std::vector<float>& v) {
  std::string b(v.size() * 2, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    const uint16_t hi = uint16_t(bits >> 16);  // truncation: the test compares the same values
    std::memcpy(&b[2 * i], &hi, 2);
  }
  return b;
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(HfGpt2, RoundTripIsExact) {
  TempDir dir;
  std::vector<float> w;
  const std::string path = ExportTiny(dir, &w);
  const LoadedModel m = ReadHfGpt2(path);  // n_head from the metadata the export wrote
  EXPECT_EQ(m.config.n_layer, kCfg.n_layer);
  EXPECT_EQ(m.config.n_head, kCfg.n_head);
  EXPECT_EQ(m.config.n_embd, kCfg.n_embd);
  EXPECT_EQ(m.config.vocab_size, kCfg.vocab_size);
  EXPECT_EQ(m.config.block_size, kCfg.block_size);
  EXPECT_EQ(m.weights, w);
}

TEST(HfGpt2, FileHoldsHfNamesShapesAndConv1DLayout) {
  TempDir dir;
  std::vector<float> w;
  const SafetensorsFile f = SafetensorsFile::Read(ExportTiny(dir, &w));
  const auto layout = model::ParamLayout::Whole(kCfg);
  const int C = kCfg.n_embd, V = kCfg.vocab_size;
  EXPECT_EQ(f.metadata().at("format"), "pt");

  // Exactly HF GPT2LMHeadModel's state dict, less the tied lm_head and the mask buffers.
  std::map<std::string, std::vector<int64_t>> want = {{"transformer.wte.weight", {V, C}},
                                                      {"transformer.wpe.weight", {16, C}},
                                                      {"transformer.ln_f.weight", {C}},
                                                      {"transformer.ln_f.bias", {C}}};
  for (int l = 0; l < kCfg.n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    want[h + "ln_1.weight"] = {C}, want[h + "ln_1.bias"] = {C};
    want[h + "attn.c_attn.weight"] = {C, 3 * C}, want[h + "attn.c_attn.bias"] = {3 * C};
    want[h + "attn.c_proj.weight"] = {C, C}, want[h + "attn.c_proj.bias"] = {C};
    want[h + "ln_2.weight"] = {C}, want[h + "ln_2.bias"] = {C};
    want[h + "mlp.c_fc.weight"] = {C, 4 * C}, want[h + "mlp.c_fc.bias"] = {4 * C};
    want[h + "mlp.c_proj.weight"] = {4 * C, C}, want[h + "mlp.c_proj.bias"] = {C};
  }
  std::map<std::string, std::vector<int64_t>> got;
  for (const auto& [name, t] : f.tensors()) got[name] = t.shape;
  EXPECT_EQ(got, want);

  // Conv1D: HF [in, out] element (i, o) is keel [out, in] element (o, i). Output o of c_attn is
  // q for o < C, k for C ≤ o < 2C, v after: the same order in both.
  for (const char* name :
       {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}) {
    const auto& p = layout.Find(std::string("h.1.") + name);
    const Fp32Tensor& t = f.Get(std::string("transformer.h.1.") + name);
    const int out = p.shape[0], in = p.shape[1];
    size_t bad = 0;
    for (int o = 0; o < out; ++o)
      for (int i = 0; i < in; ++i)
        bad += t.data[size_t(i) * out + o] != w[p.offset + size_t(o) * in + i];
    EXPECT_EQ(bad, 0u) << name;
  }
  // Vectors and embeddings are copied as they are; wte loses only its padded rows.
  for (const char* name : {"h.0.attn.c_attn.bias", "h.1.ln_2.weight", "wpe.weight", "ln_f.bias"}) {
    const auto& p = layout.Find(name);
    EXPECT_TRUE(std::equal(w.begin() + p.offset, w.begin() + p.offset + p.numel,
                           f.Get(HfGpt2Name(name)).data.begin()))
        << name;
  }
  const auto& wte = layout.Find("wte.weight");
  EXPECT_TRUE(std::equal(w.begin() + wte.offset, w.begin() + wte.offset + size_t(V) * C,
                         f.Get("transformer.wte.weight").data.begin()));
}

// What transformers itself writes: GPT2Model has no "transformer." prefix and older checkpoints
// carry the causal mask as "h.N.attn.bias" / "h.N.attn.masked_bias"; GPT2LMHeadModel may carry
// lm_head.weight, tied (equal to wte).
TEST(HfGpt2, ReadsHfVariants) {
  TempDir dir;
  std::vector<float> w;
  const std::string path = ExportTiny(dir, &w), variant = dir / "variant.safetensors";
  Rewrite(path, variant, [](auto& t, auto& meta) {
    std::map<std::string, Fp32Tensor> bare;
    for (auto& [name, v] : t) bare[name.substr(std::strlen("transformer."))] = std::move(v);
    bare["lm_head.weight"] = bare["wte.weight"];
    for (int l = 0; l < kCfg.n_layer; ++l) {
      const std::string h = "h." + std::to_string(l) + ".attn.";
      bare[h + "bias"] = {{1, 1, 16, 16}, std::vector<float>(256, 1.0f)};
      bare[h + "masked_bias"] = {{}, {-1e4f}};
    }
    t = std::move(bare);
    meta.clear();  // no n_head: the caller gives it
  });
  const LoadedModel m = ReadHfGpt2(variant, 4);
  EXPECT_EQ(m.config.n_head, 4);
  EXPECT_EQ(m.weights, w);
}

TEST(HfGpt2, ReadsBf16Files) {
  TempDir dir;
  const SafetensorsFile f = SafetensorsFile::Read(ExportTiny(dir));
  std::vector<RawTensor> raw;
  for (const auto& [name, t] : f.tensors())
    raw.push_back({name, "BF16", t.shape, Bf16Bytes(t.data)});
  const std::string bf16 = dir / "bf16.safetensors";
  WriteRaw(bf16, raw);
  const LoadedModel m = ReadHfGpt2(bf16, 4);
  const auto layout = model::ParamLayout::Whole(kCfg);
  const auto& p = layout.Find("h.0.mlp.c_fc.weight");  // keel [4C, C] from HF [C, 4C]
  const Fp32Tensor& t = f.Get("transformer.h.0.mlp.c_fc.weight");
  uint32_t bits;
  std::memcpy(&bits, &t.data[1 * 256 + 2], 4);  // HF (i=1, o=2)
  bits &= 0xFFFF0000u;
  float want;
  std::memcpy(&want, &bits, 4);
  EXPECT_EQ(m.weights[p.offset + 2 * 64 + 1], want);
}

TEST(HfGpt2, HeadsComeFromMetadataGpt2WidthsOrTheCaller) {
  TempDir dir;
  const std::string path = ExportTiny(dir), bare = dir / "bare.safetensors";
  Rewrite(path, bare, [](auto&, auto& meta) { meta = {{"format", "pt"}}; });
  EXPECT_NE(ErrorOf([&] { ReadHfGpt2(bare); }).find("--n-head"), std::string::npos);
  EXPECT_EQ(ReadHfGpt2(bare, 8).config.n_head, 8);
  const std::string e = ErrorOf([&] { ReadHfGpt2(path, 8); });  // the metadata says 4
  EXPECT_NE(e.find("n_head 4"), std::string::npos) << e;
  EXPECT_NE(ErrorOf([&] { ReadHfGpt2(bare, 5); }).find("not a multiple of n_head 5"),
            std::string::npos);

  // GPT-2 124M's width: 12 heads without being told.
  const model::ModelConfig small{1, 12, 768, 10, 4};
  const auto layout = model::ParamLayout::Whole(small);
  const std::vector<float> w(layout.total(), 0.5f);
  const std::string gpt2 = dir / "gpt2.safetensors", gpt2_bare = dir / "gpt2_bare.safetensors";
  WriteHfGpt2(gpt2, small, layout, w.data());
  Rewrite(gpt2, gpt2_bare, [](auto&, auto& meta) { meta.clear(); });
  EXPECT_EQ(ReadHfGpt2(gpt2_bare).config.n_head, 12);

  // A Hugging Face folder: model.safetensors says nothing, its config.json says n_head 8 (the
  // width table said 12); settings keel's GPT-2 does not compute are refused.
  const model::ModelConfig eight{1, 8, 768, 10, 4};
  std::filesystem::create_directories(dir / "hf");
  const std::string folder = dir / "hf/model.safetensors";
  WriteHfGpt2(folder, eight, model::ParamLayout::Whole(eight), w.data());
  Rewrite(folder, folder, [](auto&, auto& meta) { meta = {{"format", "pt"}}; });
  EXPECT_EQ(ReadHfGpt2(folder).config.n_head, 8);
  EXPECT_NE(ErrorOf([&] { ReadHfGpt2(folder, 12); }).find("config.json says n_head 8"),
            std::string::npos);
  nlohmann::json c = nlohmann::json::parse(test::ReadFile(dir / "hf/config.json"));
  c["activation_function"] = "gelu";
  std::ofstream(dir / "hf/config.json") << c.dump();
  EXPECT_NE(ErrorOf([&] { ReadHfGpt2(folder); }).find("activation_function: \"gelu\""),
            std::string::npos);
}

TEST(HfGpt2, BadInputIsOneLineNamingFileAndTensor) {
  TempDir dir;
  const std::string path = ExportTiny(dir), bad = dir / "bad.safetensors";
  auto expect_line = [&](const std::string& e, const std::vector<std::string>& parts) {
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    EXPECT_NE(e.find(bad), std::string::npos) << e;
    for (const auto& s : parts)
      EXPECT_NE(e.find(s), std::string::npos) << "want " << s << ": " << e;
  };

  Rewrite(path, bad, [](auto& t, auto&) { t.erase("transformer.h.1.mlp.c_proj.bias"); });
  expect_line(ErrorOf([&] { ReadHfGpt2(bad); }), {"\"transformer.h.1.mlp.c_proj.bias\""});

  // keel's [out, in] orientation where HF's Conv1D [in, out] belongs.
  Rewrite(path, bad, [](auto& t, auto&) {
    t["transformer.h.0.mlp.c_fc.weight"].shape = {256, 64};
  });
  expect_line(ErrorOf([&] { ReadHfGpt2(bad); }),
              {"\"transformer.h.0.mlp.c_fc.weight\"", "expected shape [64, 256], got [256, 64]"});

  // An lm_head that cannot be wte's tied copy.
  Rewrite(path, bad, [](auto& t, auto&) {
    t["lm_head.weight"] = t["transformer.wte.weight"];
    t["lm_head.weight"].shape = {150, 128};
  });
  expect_line(ErrorOf([&] { ReadHfGpt2(bad); }),
              {"\"lm_head.weight\"", "expected shape [300, 64] (tied to wte), got [150, 128]"});

  Rewrite(path, bad, [](auto& t, auto&) {
    t["lm_head.weight"] = t["transformer.wte.weight"];
    t["lm_head.weight"].data[5] += 1.0f;
  });
  expect_line(ErrorOf([&] { ReadHfGpt2(bad); }), {"\"lm_head.weight\"", "untied"});

  Rewrite(path, bad, [](auto& t, auto&) {
    t["transformer.h.2.ln_2.weight"] = {{64}, std::vector<float>(64, 1.0f)};
  });
  expect_line(ErrorOf([&] { ReadHfGpt2(bad); }), {"\"transformer.h.2.ln_2.weight\"", "not part"});

  Rewrite(path, bad, [](auto& t, auto&) { t.erase("transformer.wpe.weight"); });
  expect_line(ErrorOf([&] { ReadHfGpt2(bad); }), {"\"transformer.wpe.weight\""});

  // A dtype keel does not read (integer).
  const SafetensorsFile f = SafetensorsFile::Read(path);
  std::vector<RawTensor> raw;
  for (const auto& [name, t] : f.tensors()) {
    std::string bytes(reinterpret_cast<const char*>(t.data.data()), t.data.size() * 4);
    if (name == "transformer.ln_f.bias")
      raw.push_back({name, "I64", t.shape, std::string(t.data.size() * 8, '\0')});
    else
      raw.push_back({name, "F32", t.shape, bytes});
  }
  WriteRaw(bad, raw);
  expect_line(ErrorOf([&] { ReadHfGpt2(bad); }), {"\"transformer.ln_f.bias\"", "dtype I64"});

  // Non-finite weights are refused by name.
  Rewrite(path, bad, [](auto& t, auto&) {
    t["transformer.h.0.ln_1.weight"].data[3] = std::numeric_limits<float>::quiet_NaN();
  });
  expect_line(ErrorOf([&] { ReadHfGpt2(bad); }),
              {"\"transformer.h.0.ln_1.weight\"", "element 3 is NaN"});
}

// The format's tiling rule: tensors' bytes may neither overlap nor leave holes.
TEST(Safetensors, OverlapsAndHolesAreRefused) {
  TempDir dir;
  const std::string bad = dir / "bad.safetensors";
  auto file = [&](const std::string& header, size_t data_bytes) {
    std::ofstream out(bad, std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(data_bytes, '\0');
  };
  auto t = [](const char* name, int a, int b) {
    return "\"" + std::string(name) + "\":{\"dtype\":\"F32\",\"shape\":[" +
           std::to_string((b - a) / 4) + "],\"data_offsets\":[" + std::to_string(a) + "," +
           std::to_string(b) + "]}";
  };
  file("{" + t("a", 0, 8) + "," + t("b", 8, 16) + "}", 16);
  EXPECT_NO_THROW(SafetensorsFile::Read(bad));
  file("{" + t("a", 0, 8) + "," + t("b", 4, 12) + "}", 12);
  std::string e = ErrorOf([&] { SafetensorsFile::Read(bad); });
  EXPECT_NE(e.find("tensor \"b\" overlaps tensor \"a\""), std::string::npos) << e;
  file("{" + t("a", 0, 8) + "," + t("b", 12, 20) + "}", 20);
  e = ErrorOf([&] { SafetensorsFile::Read(bad); });
  EXPECT_NE(e.find("data bytes [8, 12) belong to no tensor"), std::string::npos) << e;
  file("{" + t("a", 0, 8) + "}", 12);
  e = ErrorOf([&] { SafetensorsFile::Read(bad); });
  EXPECT_NE(e.find("data bytes [8, 12) after the last tensor"), std::string::npos) << e;
}

TEST(ModelSource, InitWeightsFromKeelOrHfFileCheckTheConfig) {
  TempDir dir;
  std::vector<float> w;
  const std::string hf = ExportTiny(dir, &w), keel_file = dir / "keel.safetensors";
  const auto layout = model::ParamLayout::Whole(kCfg);
  WriteModel(keel_file, kCfg, layout, w.data());
  EXPECT_FALSE(IsHfGpt2File(keel_file));
  EXPECT_TRUE(IsHfGpt2File(hf));
  // A shape the metadata cannot have is named with the file it is in.
  const std::string bad = dir / "bad.safetensors";
  Rewrite(keel_file, bad, [](auto&, auto& meta) { meta["keel.n_head"] = "0"; });
  const std::string e = ErrorOf([&] { ReadModel(bad); });
  EXPECT_NE(e.find(bad + ": metadata keel.*: [model] n_head"), std::string::npos) << e;
  // A tensor its metadata has no place for (an untied lm_head) was dropped in silence.
  const std::string extra = dir / "extra.safetensors";
  Rewrite(keel_file, extra, [](auto& t, auto&) { t["lm_head.weight"] = t.at("wte.weight"); });
  const std::string e2 = ErrorOf([&] { ReadModel(extra); });
  EXPECT_NE(e2.find("tensor \"lm_head.weight\" is not one of its config's"), std::string::npos)
      << e2;

  for (const std::string& path : {hf, keel_file}) {
    std::vector<float> master(layout.total(), -1.0f);
    LoadInitWeights(path, kCfg, master.data());
    EXPECT_EQ(master, w) << path;
  }
  model::ModelConfig deeper = kCfg;
  deeper.n_layer = 3;
  std::vector<float> master(model::ParamLayout::Whole(deeper).total());
  for (const std::string& path : {hf, keel_file}) {
    const std::string e = ErrorOf([&] { LoadInitWeights(path, deeper, master.data()); });
    EXPECT_EQ(e, "[model] init_from " + path + ": n_layer is 2 in the file, 3 in the config");
  }
  model::ModelConfig longer = kCfg;
  longer.block_size = 32;
  EXPECT_NE(ErrorOf([&] { LoadInitWeights(hf, longer, master.data()); }).find("block_size is 16"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf([&] { LoadInitWeights(dir / "none", kCfg, master.data()); }).find("no such file"),
      std::string::npos);
}

// PEFT's per-module alphas and ranks: keel's merge has one scale, so an adapter with an
// alpha_pattern (whose shapes still fit) merged those modules at the wrong strength; refused now.
// Without one, the adapter merges as before.
TEST(Peft, PerModuleAlphasAreRefusedNotMergedAtTheWrongScale) {
  TempDir dir;
  model::ModelConfig lora = model::NamedConfig("gpt2-tiny");
  lora.lora_rank = 2;
  lora.lora_alpha = 4;
  lora.lora_targets = model::kLoraQkv;
  const model::ParamLayout with = model::ParamLayout::Whole(lora);
  std::vector<float> adapters(with.grad_total(), 0.5f);
  WritePeftAdapter(dir / "a", lora, adapters.data());
  const model::ModelConfig base = model::BaseModel(lora);
  std::vector<float> w(model::ParamLayout::Whole(base).total(), 0.0f);
  MergePeftAdapter(dir / "a", base, &w);
  EXPECT_NE(std::count(w.begin(), w.end(), 0.0f), std::ptrdiff_t(w.size()));  // merged
  nlohmann::json c = nlohmann::json::parse(test::ReadFile(dir / "a/adapter_config.json"));
  c["alpha_pattern"] = nlohmann::json::object();  // PEFT's default
  c["rank_pattern"] = {{"c_attn", 2}};            // the global r again
  std::ofstream(dir / "a/adapter_config.json") << c.dump();
  std::vector<float> again(w.size(), 0.0f);
  MergePeftAdapter(dir / "a", base, &again);
  EXPECT_NE(std::count(again.begin(), again.end(), 0.0f), std::ptrdiff_t(again.size()));
  c["alpha_pattern"] = {{"c_attn", 16}};
  std::ofstream(dir / "a/adapter_config.json") << c.dump();
  const std::string e = ErrorOf([&] { MergePeftAdapter(dir / "a", base, &w); });
  EXPECT_NE(e.find("alpha_pattern: {\"c_attn\":16}: per-module ranks and alphas are not "
                   "supported"),
            std::string::npos)
      << e;
}

TEST(ModelSource, ExportSourceIsARunDirectoryOrAModelFile) {
  TempDir dir;
  const auto layout = model::ParamLayout::Whole(kCfg);
  const std::vector<float> w = DistinctWeights(layout, kCfg);
  std::filesystem::create_directories(dir / "run");
  EXPECT_NE(ErrorOf([&] { LoadWeightsForExport(dir / "run"); }).find("no model.safetensors"),
            std::string::npos);
  WriteModel(dir / "run/model.safetensors", kCfg, layout, w.data());
  EXPECT_EQ(LoadWeightsForExport(dir / "run").weights, w);
  EXPECT_EQ(LoadWeightsForExport(dir / "run/model.safetensors").weights, w);
  EXPECT_NE(ErrorOf([&] { LoadWeightsForExport(dir / "nothing"); }).find("no such file"),
            std::string::npos);
}

}  // namespace
}  // namespace keel::ckpt
