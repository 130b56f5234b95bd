// Reading, overriding and writing the run configuration (train/config.h). The schema lives in one
// table (BindSections); values are range-checked in config_validate.cc.
//
// Strictness is the point: an unknown section or key, or a value of the wrong TOML type, is an
// error naming the file (or --set flag) and the key, never silently ignored or converted. The one
// conversion allowed is an integer where a float is expected ("lr = 1" means 1.0).
#include "keel/train/config.h"

#include <toml++/toml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "keel/core/error.h"
#include "keel/core/number_text.h"
#include "keel/train/config_schema.h"

namespace keel::train {
namespace internal {

std::vector<Section> BindSections(RunConfig& c) {
  auto& m = c.model;
  auto& d = c.data;
  auto& t = c.train;
  auto& o = c.optim;
  return {
      {"model",
       {{"name", &m.name},
        {"n_layer", &m.n_layer},
        {"n_head", &m.n_head},
        {"n_embd", &m.n_embd},
        {"vocab_size", &m.vocab_size},
        {"block_size", &m.block_size},
        {"n_kv_head", &m.n_kv_head},
        {"ffn_hidden", &m.ffn_hidden},
        {"rope_theta", &m.rope_theta},
        {"recompute", &m.recompute},
        {"init_std", &m.init_std},
        {"init_from", &m.init_from},
        {"init_adapter", &m.init_adapter}}},
      {"data",
       {{"train", &d.train}, {"val", &d.val}, {"seq_len", &d.seq_len}, {"prefetch", &d.prefetch}}},
      {"train",
       {{"name", &t.name},
        {"out_dir", &t.out_dir},
        {"steps", &t.steps},
        {"batch_size", &t.batch_size},
        {"micro_batch_size", &t.micro_batch_size},
        {"precision", &t.precision},
        {"fp8_recipe", &t.fp8_recipe},
        {"fp8_amax_history", &t.fp8_amax_history},
        {"fp8_spike", &t.fp8_spike},
        {"device", &t.device},
        {"seed", &t.seed},
        {"val_every", &t.val_every},
        {"val_batches", &t.val_batches},
        {"log_every", &t.log_every},
        {"sample_prompt", &t.sample_prompt},
        {"sample_tokens", &t.sample_tokens},
        {"sample_count", &t.sample_count},
        {"stop_at", &t.stop_at}}},
      {"optim",
       {{"lr", &o.lr},
        {"min_lr", &o.min_lr},
        {"warmup_steps", &o.warmup_steps},
        {"schedule", &o.schedule},
        {"beta1", &o.beta1},
        {"beta2", &o.beta2},
        {"eps", &o.eps},
        {"weight_decay", &o.weight_decay},
        {"grad_clip", &o.grad_clip},
        {"freeze", &o.freeze},
        {"state_dtype", &o.state_dtype},
        {"master_weights", &o.master_weights},
        {"grad_dtype", &o.grad_dtype}}},
      {"loss_scale",
       {{"kind", &c.loss_scale.kind},
        {"initial", &c.loss_scale.initial},
        {"min", &c.loss_scale.min},
        {"growth_interval", &c.loss_scale.growth_interval},
        {"hysteresis", &c.loss_scale.hysteresis},
        {"growth", &c.loss_scale.growth},
        {"backoff", &c.loss_scale.backoff},
        {"switch_after", &c.loss_scale.switch_after}}},
      {"offload",
       {{"dir", &c.offload.dir},
        {"chunk_mib", &c.offload.chunk_mib},
        {"host", &c.offload.host},
        {"params", &c.offload.params}}},
      {"lora",
       {{"rank", &c.lora.rank},
        {"alpha", &c.lora.alpha},
        {"targets", &c.lora.targets},
        {"base", &c.lora.base},
        {"dropout", &c.lora.dropout},
        {"dora", &c.lora.dora}}},
      {"parallel",
       {{"dp", &c.parallel.dp},
        {"tp", &c.parallel.tp},
        {"pp", &c.parallel.pp},
        {"sp", &c.parallel.sp},
        {"virtual_stages", &c.parallel.virtual_stages},
        {"pp_layers", &c.parallel.pp_layers},
        {"zero", &c.parallel.zero},
        {"bucket_mb", &c.parallel.bucket_mb},
        {"comm_timeout_s", &c.parallel.comm_timeout_s},
        {"grad_comm", &c.parallel.grad_comm},
        {"dp_sync", &c.parallel.dp_sync},
        {"cp", &c.parallel.cp},
        {"cp_comm", &c.parallel.cp_comm}}},
      {"diloco",
       {{"inner_steps", &c.diloco.inner_steps},
        {"outer_lr", &c.diloco.outer_lr},
        {"outer_momentum", &c.diloco.outer_momentum},
        {"fragments", &c.diloco.fragments},
        {"overlap_steps", &c.diloco.overlap_steps}}},
      {"checkpoint",
       {{"save_final", &c.checkpoint.save_final},
        {"dir", &c.checkpoint.dir},
        {"every_steps", &c.checkpoint.every_steps},
        {"every_minutes", &c.checkpoint.every_minutes},
        {"at_end", &c.checkpoint.at_end},
        {"on_signal", &c.checkpoint.on_signal},
        {"keep_last", &c.checkpoint.keep_last},
        {"keep_every", &c.checkpoint.keep_every},
        {"if_busy", &c.checkpoint.if_busy},
        {"resume", &c.checkpoint.resume},
        {"writer_nice", &c.checkpoint.writer_nice},
        {"direct_io", &c.checkpoint.direct_io},
        {"peer_every", &c.checkpoint.peer_every},
        {"peer_rate_mbit", &c.checkpoint.peer_rate_mbit}}},
      {"resilience",
       {{"stop_on_nonfinite", &c.resilience.stop_on_nonfinite},
        {"max_skips", &c.resilience.max_skips},
        {"spike_window", &c.resilience.spike_window},
        {"spike_min_steps", &c.resilience.spike_min_steps},
        {"spike_z", &c.resilience.spike_z},
        {"spike_ratio", &c.resilience.spike_ratio},
        {"norm_spike_ratio", &c.resilience.norm_spike_ratio},
        {"rollback", &c.resilience.rollback},
        {"max_rollbacks", &c.resilience.max_rollbacks},
        {"rollback_window", &c.resilience.rollback_window},
        {"skip_batches", &c.resilience.skip_batches},
        {"sdc_every", &c.resilience.sdc_every},
        {"straggler_every", &c.resilience.straggler_every},
        {"straggler_ratio", &c.resilience.straggler_ratio},
        {"straggler_checks", &c.resilience.straggler_checks},
        {"straggler_fails", &c.resilience.straggler_fails},
        {"hang_timeout_s", &c.resilience.hang_timeout_s}}},
      {"monitor",
       {{"peak_gflops", &c.monitor.peak_gflops},
        {"metrics_jsonl", &c.monitor.metrics_jsonl},
        {"metrics_port", &c.monitor.metrics_port},
        {"metrics_addr", &c.monitor.metrics_addr},
        {"metrics_token", &c.monitor.metrics_token}}},
      {"monitor.alerts",
       {{"nonfinite", &c.monitor.alerts.nonfinite},
        {"loss_ceiling", &c.monitor.alerts.loss_ceiling},
        {"throughput_drop", &c.monitor.alerts.throughput_drop},
        {"no_step_s", &c.monitor.alerts.no_step_s},
        {"checkpoint_age_min", &c.monitor.alerts.checkpoint_age_min},
        {"min_free_disk_gb", &c.monitor.alerts.min_free_disk_gb},
        {"straggler", &c.monitor.alerts.straggler},
        {"webhook", &c.monitor.alerts.webhook}}},
      {"launch",
       {{"launcher", &c.launch.launcher},
        {"hostfile", &c.launch.hostfile},
        {"ranks_per_host", &c.launch.ranks_per_host},
        {"spares", &c.launch.spares},
        {"launcher_args", &c.launch.launcher_args},
        {"max_restarts", &c.launch.max_restarts},
        {"backoff_s", &c.launch.backoff_s},
        {"backoff_max_s", &c.launch.backoff_max_s},
        {"window_failures", &c.launch.window_failures},
        {"window_minutes", &c.launch.window_minutes},
        {"host_failures", &c.launch.host_failures},
        {"heartbeat_s", &c.launch.heartbeat_s},
        {"heartbeat_timeout_s", &c.launch.heartbeat_timeout_s},
        {"health_timeout_s", &c.launch.health_timeout_s},
        {"health_min_free_gb", &c.launch.health_min_free_gb},
        {"health_min_gflops", &c.launch.health_min_gflops},
        {"stop_grace_s", &c.launch.stop_grace_s},
        {"regrow_minutes", &c.launch.regrow_minutes},
        {"holder_port", &c.launch.holder_port},
        {"holder_memory_gb", &c.launch.holder_memory_gb},
        {"holder_spill_dir", &c.launch.holder_spill_dir}}},
  };
}

void Provenance::MarkOverridden(std::string_view section, std::string_view key) {
  overridden_.insert(std::string(section) + "." + std::string(key));
}

std::string Provenance::File() const {
  return path_.empty() ? "config (defaults)" : "config " + path_;
}

std::string Provenance::Where(std::string_view section, std::string_view key) const {
  std::string dotted = std::string(section) + "." + std::string(key);
  if (overridden_.count(dotted)) return "--set " + dotted;
  return File() + ": [" + std::string(section) + "] " + std::string(key);
}

std::string Provenance::OverridesIn(std::string_view section) const {
  std::string prefix = std::string(section) + ".", list;
  for (const auto& dotted : overridden_)
    if (dotted.rfind(prefix, 0) == 0) list += (list.empty() ? "--set " : ", --set ") + dotted;
  return list;
}

}  // namespace internal

namespace {

using internal::Field;
using internal::FieldRef;
using internal::Provenance;
using internal::Section;

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
// Spelled out because clang before 17 lacks deduction for aggregates.
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

// A TOML basic string: quotes, backslashes and control characters escaped; UTF-8 kept as is.
std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    auto u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", u);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

// Whether `text` is valid TOML. ToToml checks with it what it writes of the user's bytes: TOML is
// UTF-8 without raw control characters, and a --set value or a config path of other bytes would
// make the run's config.toml unreadable.
bool ParsesAsToml(const std::string& text) {
  try {
    (void)toml::parse(text);
    return true;
  } catch (const toml::parse_error&) {
    return false;
  }
}

// "string \"abc\"", "integer 5", "float 1.5": what the user wrote, for "got ..." in messages.
std::string Describe(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "string " + Quote(n.as_string()->get());
    case toml::node_type::integer:
      return "integer " + std::to_string(n.as_integer()->get());
    case toml::node_type::floating_point:
      return "float " + ShortestDecimal(n.as_floating_point()->get());
    case toml::node_type::boolean:
      return n.as_boolean()->get() ? "true" : "false";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date or time";
  }
}

// Number of a TOML integer or float; throws naming `where` for any other type.
double NumberOf(const toml::node& n, const std::string& where) {
  if (n.is_integer()) return static_cast<double>(n.as_integer()->get());
  if (n.is_floating_point()) return n.as_floating_point()->get();
  ThrowBadInput(where + ": expected a number, got " + Describe(n));
}

int64_t IntegerOf(const toml::node& n, const std::string& where) {
  if (!n.is_integer()) ThrowBadInput(where + ": expected an integer, got " + Describe(n));
  return n.as_integer()->get();
}

// Stores `n` into the field after checking its TOML type (and that it fits the C++ type).
void Assign(const toml::node& n, const FieldRef& ref, const std::string& where) {
  std::visit(Overloaded{
                 [&](int* p) {
                   int64_t v = IntegerOf(n, where);
                   if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
                     ThrowBadInput(where + ": expected a 32-bit integer, got " + std::to_string(v));
                   *p = static_cast<int>(v);
                 },
                 [&](uint64_t* p) {
                   int64_t v = IntegerOf(n, where);
                   if (v < 0)
                     ThrowBadInput(where + ": expected an integer >= 0, got " + std::to_string(v));
                   *p = static_cast<uint64_t>(v);
                 },
                 [&](float* p) {
                   double v = NumberOf(n, where);
                   // Non-finite values pass here and are refused by the range checks with a message
                   // about the value; a finite value beyond float range would silently become inf.
                   if (std::isfinite(v) && std::abs(v) > std::numeric_limits<float>::max())
                     ThrowBadInput(where + ": expected a number within float range, got " +
                                   ShortestDecimal(v));
                   *p = static_cast<float>(v);
                 },
                 [&](double* p) { *p = NumberOf(n, where); },
                 [&](bool* p) {
                   if (!n.is_boolean())
                     ThrowBadInput(where + ": expected true or false, got " + Describe(n));
                   *p = n.as_boolean()->get();
                 },
                 [&](std::string* p) {
                   if (!n.is_string())
                     ThrowBadInput(where + ": expected a string, got " + Describe(n));
                   *p = n.as_string()->get();
                 },
             },
             ref);
}

std::string KnownSections(const std::vector<Section>& sections) {
  std::string s;
  for (const auto& sec : sections) s += (s.empty() ? "" : ", ") + std::string(sec.name);
  return s;
}

std::string KnownKeys(const Section& sec) {
  std::string s;
  for (const auto& f : sec.fields) s += (s.empty() ? "" : ", ") + std::string(f.key);
  // An array of tables, so not a Field of the table-driven schema; parsed by ApplySources.
  if (sec.name == "data") s += ", sources";
  return s;
}

// [[data.sources]]: an array of tables, each {path = "...", weight = 1.0}. Messages name the
// entry, e.g. "config a.toml: [data] sources[1].path: expected a string, got nothing".
void ApplySources(const toml::node& node, std::vector<DataSource>& out, const Provenance& prov) {
  const std::string where = prov.Where("data", "sources");
  const toml::array* arr = node.as_array();
  if (arr != nullptr && arr->empty())
    ThrowBadInput(where + ": expected at least one source, got an empty array");
  if (arr == nullptr || !arr->is_array_of_tables())
    ThrowBadInput(where + ": expected an array of tables ([[data.sources]]), got " +
                  (arr == nullptr ? Describe(node) : "an array of non-tables"));
  out.clear();
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::table& t = *arr->get(i)->as_table();
    const std::string entry = "sources[" + std::to_string(i) + "]";
    DataSource src;
    for (const auto& [key, value] : t) {
      const std::string at = prov.Where("data", entry + "." + std::string(key.str()));
      if (key.str() == "path")
        Assign(value, &src.path, at);
      else if (key.str() == "weight")
        Assign(value, &src.weight, at);
      else
        ThrowBadInput(at + ": unknown key (known: path, weight)");
    }
    if (!t.contains("path"))
      ThrowBadInput(prov.Where("data", entry + ".path") + ": expected a string, got nothing");
    out.push_back(std::move(src));
  }
}

Section* FindSection(std::vector<Section>& sections, std::string_view name) {
  for (auto& sec : sections)
    if (sec.name == name) return &sec;
  return nullptr;
}

const Field* FindField(const Section& sec, std::string_view key) {
  for (const auto& f : sec.fields)
    if (f.key == key) return &f;
  return nullptr;
}

toml::table ParseFile(const std::string& path) {
  const std::string file = "config " + path;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) ThrowBadInput(file + ": no such file");
  if (std::filesystem::is_directory(path, ec))
    ThrowBadInput(file + ": is a directory, expected a TOML file");
  std::ifstream in(path, std::ios::binary);
  if (!in) ThrowBadInput(file + ": cannot be opened for reading");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return toml::parse(text.str(), path);
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    ThrowBadInput(file + ":" + std::to_string(begin.line) + ":" + std::to_string(begin.column) +
                  ": invalid TOML: " + std::string(e.description()));
  }
}

void ApplyFile(const toml::table& root, std::vector<Section>& sections, RunConfig& cfg,
               const Provenance& prov) {
  for (const auto& [name, node] : root) {
    Section* sec = FindSection(sections, name.str());
    if (sec == nullptr || !node.is_table()) {
      std::string what = sec == nullptr ? "unknown section" : "expected a [section] table";
      ThrowBadInput(prov.File() + ": " + std::string(name.str()) + ": " + what +
                    " (known: " + KnownSections(sections) + ")");
    }
    for (const auto& [key, value] : *node.as_table()) {
      if (sec->name == "data" && key.str() == "sources") {
        ApplySources(value, cfg.data.sources, prov);
        continue;
      }
      // A sub-table ([monitor.alerts]): its keys belong to the section of the dotted name.
      if (Section* sub =
              FindSection(sections, std::string(sec->name) + "." + std::string(key.str()));
          sub && value.is_table()) {
        for (const auto& [k, v] : *value.as_table()) {
          const Field* f = FindField(*sub, k.str());
          const std::string where = prov.Where(sub->name, k.str());
          if (f == nullptr) ThrowBadInput(where + ": unknown key (known: " + KnownKeys(*sub) + ")");
          Assign(v, f->ref, where);
        }
        continue;
      }
      const Field* f = FindField(*sec, key.str());
      std::string where = prov.Where(sec->name, key.str());
      if (f == nullptr) ThrowBadInput(where + ": unknown key (known: " + KnownKeys(*sec) + ")");
      Assign(value, f->ref, where);
    }
  }
}

std::string_view Trim(std::string_view s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// One "section.key=value". The value is TOML value syntax (1e-3, true, "x"); a value that is not
// valid TOML is taken as a bare string, so that `train.precision=fp32` needs no shell quoting.
void ApplyOverride(const std::string& text, std::vector<Section>& sections, Provenance& prov) {
  const std::string usage = "--set " + text + ": expected section.key=value, e.g. optim.lr=1e-3";
  size_t eq = text.find('=');
  if (eq == std::string::npos) ThrowBadInput(usage);
  std::string_view path = Trim(std::string_view(text).substr(0, eq));
  std::string_view value = Trim(std::string_view(text).substr(eq + 1));
  size_t dot = path.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == path.size()) ThrowBadInput(usage);
  // monitor.alerts.webhook: the longest section name that exists.
  if (const size_t last = path.rfind('.');
      last != dot && FindSection(sections, path.substr(0, last)) != nullptr)
    dot = last;
  std::string_view sec_name = path.substr(0, dot);
  std::string_view key = path.substr(dot + 1);

  Section* sec = FindSection(sections, sec_name);
  if (sec == nullptr)
    ThrowBadInput("--set " + std::string(path) + ": unknown section \"" + std::string(sec_name) +
                  "\" (known: " + KnownSections(sections) + ")");
  if (sec_name == "data" && key.substr(0, key.find_first_of(".[")) == "sources")
    ThrowBadInput("--set " + std::string(path) +
                  ": the sources cannot be set with --set; write [[data.sources]] tables in the "
                  "config file");
  const Field* f = FindField(*sec, key);
  if (f == nullptr)
    ThrowBadInput("--set " + std::string(path) + ": unknown key (known: " + KnownKeys(*sec) + ")");
  prov.MarkOverridden(sec_name, key);
  const std::string where = prov.Where(sec_name, key);

  toml::table parsed;
  bool is_toml = false;
  try {
    parsed = toml::parse("v = " + std::string(value));
    // Exactly one key, so that "1\nother = 2" cannot smuggle in a second assignment.
    is_toml = parsed.size() == 1 && parsed.contains("v");
  } catch (const toml::parse_error&) {
    is_toml = false;
  }
  const bool wants_string = std::holds_alternative<std::string*>(f->ref);
  if (is_toml && (!wants_string || parsed["v"].is_string())) {
    Assign(*parsed.get("v"), f->ref, where);
  } else if (wants_string) {
    // A bare word (or something like 2024 given for a string key): the text itself.
    if (!ParsesAsToml("v = " + Quote(value)))
      ThrowBadInput(where + ": expected UTF-8 text, got other bytes");
    *std::get<std::string*>(f->ref) = std::string(value);
  } else {
    Assign(toml::value<std::string>(std::string(value)), f->ref, where);
  }
}

std::string TomlValue(const FieldRef& ref) {
  return std::visit(Overloaded{
                        [](int* p) { return std::to_string(*p); },
                        [](uint64_t* p) { return std::to_string(*p); },
                        [](bool* p) { return std::string(*p ? "true" : "false"); },
                        [](std::string* p) { return Quote(*p); },
                        [](auto* p) {
                          // Floats keep a decimal point so that the written file shows their type.
                          std::string s = ShortestDecimal(*p);
                          if (s.find_first_not_of("-0123456789") == std::string::npos) s += ".0";
                          return s;
                        },
                    },
                    ref);
}

}  // namespace

RunConfig LoadConfig(const std::string& path, const std::vector<std::string>& overrides) {
  RunConfig cfg;
  cfg.source = path;
  std::vector<Section> sections = internal::BindSections(cfg);
  Provenance prov(path);
  if (!path.empty()) ApplyFile(ParseFile(path), sections, cfg, prov);
  for (const auto& o : overrides) ApplyOverride(o, sections, prov);
  internal::ValidateValues(cfg, prov);
  return cfg;
}

std::string ToToml(const RunConfig& cfg) {
  RunConfig copy = cfg;  // BindSections hands out mutable pointers; nothing is written through
  std::ostringstream out;
  out << "# keel run configuration, fully resolved: every key with the value the run used.\n";
  // A path with a line break would end the comment early and corrupt the file; one that is not
  // UTF-8, or holds control characters, would make it unreadable.
  if (!cfg.source.empty() && cfg.source.find_first_of("\r\n") == std::string::npos &&
      ParsesAsToml("# Read from " + cfg.source))
    out << "# Read from " << cfg.source << ".\n";
  // The model shapes left at 0 come from the named config; a comment shows the values in force,
  // so that a run directory's config.toml says what was trained without looking up the name.
  std::optional<model::ModelConfig> resolved;
  try {
    resolved = cfg.ResolvedModel();
  } catch (const Error&) {
    // An invalid config is still written as it is; LoadConfig will name its error.
  }
  auto shape_note = [&](std::string_view key, const FieldRef& ref) -> std::string {
    const int* p = std::get_if<int*>(&ref) ? *std::get_if<int*>(&ref) : nullptr;
    const float* q = std::get_if<float*>(&ref) ? *std::get_if<float*>(&ref) : nullptr;
    if (!resolved || (p == nullptr && q == nullptr) || (p && *p != 0) || (q && *q != 0)) return "";
    std::string v;
    for (const auto& [k, text] : model::ShapeKeys(*resolved))
      if (k == key) v = text;
    if (v.empty()) return "";
    return "  # from " + cfg.model.name + ": " + v;
  };
  for (const auto& sec : internal::BindSections(copy)) {
    out << "\n[" << sec.name << "]\n";
    for (const auto& f : sec.fields) {
      out << f.key << " = " << TomlValue(f.ref);
      if (sec.name == "model") out << shape_note(f.key, f.ref);
      out << "\n";
    }
    // Array-of-tables entries belong right after their parent table's own keys.
    if (sec.name == "data")
      for (const DataSource& src : cfg.data.sources) {
        double w = src.weight;
        out << "\n[[data.sources]]\npath = " << Quote(src.path) << "\nweight = " << TomlValue(&w)
            << "\n";
      }
  }
  return out.str();
}

}  // namespace keel::train
