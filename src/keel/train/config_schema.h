// Internal to train/config*.cc: the config schema as data (every section and key, bound to a
// typed pointer into a RunConfig) and the provenance of each value for error messages.
//
// One table drives reading, overriding, writing and the "known keys" lists, so that a field
// added to config.h and to BindSections() is parsed, type-checked and written back everywhere.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "keel/model/config.h"
#include "keel/train/config.h"

namespace keel::train::internal {

using FieldRef = std::variant<int*, uint64_t*, float*, double*, bool*, std::string*>;

struct Field {
  std::string_view key;
  FieldRef ref;
};

struct Section {
  std::string_view name;
  std::vector<Field> fields;
};

// Every section and key in the order docs/CONFIG.md and ToToml list them, pointing into `cfg`.
std::vector<Section> BindSections(RunConfig& cfg);

// Says where a value came from, so that a message names what the user has to change: the file
// and key ("config a.toml: [optim] lr") or the command-line flag ("--set optim.lr").
class Provenance {
 public:
  explicit Provenance(std::string path) : path_(std::move(path)) {}

  void MarkOverridden(std::string_view section, std::string_view key);
  // "config a.toml", or "config (defaults)" when no file was given.
  std::string File() const;
  std::string Where(std::string_view section, std::string_view key) const;
  // The keys of `section` set by --set, as "--set section.key, ..."; empty when none.
  std::string OverridesIn(std::string_view section) const;

 private:
  std::string path_;
  std::set<std::string, std::less<>> overridden_;  // "section.key"
};

// Range and enum checks of every value, and the model shapes; throws keel::Error (bad input).
void ValidateValues(const RunConfig& cfg, const Provenance& where);

// The named model with the explicit shape overrides applied, validated; messages name `where`.
model::ModelConfig ResolveModel(const ModelSection& m, const Provenance& where);

}  // namespace keel::train::internal
