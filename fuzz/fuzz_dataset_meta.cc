// Fuzzes a keel-tokens meta.json (data::ReadDatasetMeta), and checks that what it accepts,
// DatasetMetaToJson writes back readably and unchanged.
//
// Input: the bytes of meta.json.
#include "fuzz_util.h"
#include "keel/data/dataset_meta.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static keel::fuzz::Scratch dir("dataset_meta");
  dir.Write("meta.json", keel::fuzz::Text(data, size));
  keel::fuzz::ExpectOnlyKeelErrors([&] {
    const keel::data::DatasetMeta meta = keel::data::ReadDatasetMeta(dir.path());
    const std::string written = keel::data::DatasetMetaToJson(meta);
    dir.Write("meta.json", written);
    keel::fuzz::ExpectSuccess("reading back DatasetMetaToJson's output", [&] {
      const keel::data::DatasetMeta again = keel::data::ReadDatasetMeta(dir.path());
      keel::fuzz::Check(keel::data::DatasetMetaToJson(again) == written,
                        "meta.json round trip changed it:\n" + written);
    });
  });
  return 0;
}
