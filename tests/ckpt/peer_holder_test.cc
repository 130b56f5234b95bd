// Tier-0 holders (ckpt/peer_holder.h) and their client: items arrive whole and checked, the newest
// two steps of each run's file stay, a full holder refuses, and a save sent by N ranks' writers
// reads back through the ordinary reader, verified, from the holder's memory.
#include "keel/ckpt/peer_holder.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "keel/ckpt/checkpoint_dir.h"
#include "keel/ckpt/manifest_build.h"
#include "keel/ckpt/peer_client.h"
#include "keel/ckpt/peer_socket.h"
#include "keel/ckpt/reader.h"
#include "keel/ckpt/writer.h"
#include "keel/core/error.h"

namespace keel::ckpt {
namespace {

// A holder on a free loopback port, in a thread, for the test's lifetime.
struct Holder {
  explicit Holder(uint64_t max_bytes = 0, std::string spill = "") {
    std::promise<int> port;
    auto listening = port.get_future();
    thread = std::thread([&, max_bytes, spill] {
      peer::HolderOptions o;
      o.port = 0;
      o.max_bytes = max_bytes;
      o.spill_dir = spill;
      peer::RunHolder(o, stop, [&](int p) { port.set_value(p); });
    });
    address = {"127.0.0.1", listening.get()};
  }
  ~Holder() {
    stop = true;
    thread.join();
  }
  peer::Client client() const { return peer::Client(address, 5); }
  std::atomic<bool> stop{false};
  std::thread thread;
  peer::Address address;
};

std::vector<std::string> Keys(const peer::Client& c, const std::string& prefix) {
  std::vector<std::string> out;
  for (const peer::Item& i : c.List(prefix)) out.push_back(i.key);
  return out;
}

TEST(PeerHolder, KeepsWhatArrivesWholeAndGivesBackAnyRange) {
  Holder h;
  const peer::Client c = h.client();
  const std::string bytes = "0123456789abcdef";
  EXPECT_EQ(c.Put("run/step_00000003/rank_00000.bin", bytes.data(), bytes.size()),
            Hash(bytes.data(), bytes.size()));
  // A hash the caller passes is the one sent (the writer's buddy copy sends the one the first copy
  // took): a wrong one is refused, and the right one stores the bytes.
  EXPECT_THROW(c.Put("given/step_00000002/rank_00000.bin", "abcd", 4, 0, {}, Hash("abce", 4)),
               Error);
  EXPECT_EQ(c.Put("given/step_00000002/rank_00000.bin", "abcd", 4, 0, {}, Hash("abcd", 4)),
            Hash("abcd", 4));
  const std::vector<peer::Item> items = c.List("run/");
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].bytes, bytes.size());
  EXPECT_EQ(items[0].xxh3, Hash(bytes.data(), bytes.size()));
  char got[5] = {};
  c.Get("run/step_00000003/rank_00000.bin", 10, 4, got);
  EXPECT_STREQ(got, "abcd");
  EXPECT_THROW(c.Get("run/step_00000003/rank_00000.bin", 10, 7, got), Error);  // past the end
  EXPECT_THROW(c.Get("run/step_00000003/rank_00001.bin", 0, 1, got), Error);   // not held
  // Bytes whose hash does not match what the sender says are refused, and replace nothing.
  peer::Socket s = peer::Socket::Connect("127.0.0.1", h.address.port, 5);
  s.SendLine("PUT run/step_00000003/rank_00000.bin 4");
  s.SendAll("abce", 4);
  s.SendLine(HashHex(Hash("abcd", 4)));
  EXPECT_EQ(s.RecvLine().rfind("ERR run/step_00000003/rank_00000.bin: xxh3", 0), 0u);
  c.Get("run/step_00000003/rank_00000.bin", 0, 4, got);
  EXPECT_STREQ(got, "0123");
  // Lengths and keys that do not parse are refused with a line, and the holder goes on.
  peer::Socket bad = peer::Socket::Connect("127.0.0.1", h.address.port, 5);
  bad.SendLine("PUT run/x -1");
  EXPECT_EQ(bad.RecvLine().rfind("ERR PUT run/x: length \"-1\"", 0), 0u);
  EXPECT_THROW(c.Put("../escape", "a", 1), Error);
  peer::Socket trim = peer::Socket::Connect("127.0.0.1", h.address.port, 5);
  trim.SendLine("TRIM run abc");
  EXPECT_EQ(trim.RecvLine().rfind("ERR TRIM run: step", 0), 0u);
  EXPECT_EQ(c.List("run/").size(), 1u);  // an unreadable TRIM wiped nothing
}

// A memfd holding `bytes` at offset 3, for a PUTFD.
int MemfdOf(const std::string& bytes) {
  const int fd = ::memfd_create("test", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 3), ssize_t(bytes.size()));
  return fd;
}

TEST(PeerHolder, ARankOfThisHostHandsItsCopyOverByDescriptor) {
  Holder h;
  const peer::Client c = h.client();
  ASSERT_TRUE(c.local());
  const std::string bytes = "0123456789abcdef";
  const int fd = MemfdOf(bytes);
  const std::string key = "run/step_00000003/rank_00000.bin";
  ASSERT_TRUE(c.PutLocal(key, fd, 3, bytes.size(), Hash(bytes.data(), bytes.size())));
  std::string got(bytes.size(), '\0');
  c.Get(key, 0, bytes.size(), got.data());
  EXPECT_EQ(got, bytes);
  EXPECT_EQ(c.List("run/").at(0).xxh3, Hash(bytes.data(), bytes.size()));
  // Bytes that do not match the hash the sender gives, or fewer bytes than it says, are refused
  // and replace nothing.
  EXPECT_THROW(c.PutLocal(key, fd, 4, bytes.size() - 1, Hash(bytes.data(), bytes.size() - 1)),
               Error);
  EXPECT_THROW(c.PutLocal(key, fd, 3, bytes.size() + 1, Hash(bytes.data(), bytes.size())), Error);
  c.Get(key, 0, bytes.size(), got.data());
  EXPECT_EQ(got, bytes);
  ::close(fd);
  // Over TCP no descriptor can come: refused with a line.
  peer::Socket s = peer::Socket::Connect("127.0.0.1", h.address.port, 5);
  s.SendLine("PUTFD " + key + " 0 4 " + HashHex(Hash("0123", 4)));
  EXPECT_EQ(s.RecvLine(), "ERR PUTFD " + key + ": no descriptor came with it");
  // A holder on another host is not handed anything: the caller sends over TCP.
  const peer::Client remote({"192.0.2.1", h.address.port}, 1);  // TEST-NET-1, never local
  EXPECT_FALSE(remote.local());
  EXPECT_FALSE(remote.PutLocal(key, 0, 0, 1, 0));
}

TEST(PeerHolder, KeepsTheNewestTwoStepsOfEachFileAndTrimsALeftTimeline) {
  Holder h;
  const peer::Client c = h.client();
  for (int step : {3, 6, 9})
    for (const char* file : {"rank_00000.bin", "rank_00001.bin"})
      c.Put("run/" + StepDirName(step) + "/" + file, "x", 1);
  c.Put("other/step_00000003/rank_00000.bin", "y", 1);
  EXPECT_EQ(Keys(c, "run/"), (std::vector<std::string>{
                                 "run/step_00000006/rank_00000.bin",
                                 "run/step_00000006/rank_00001.bin",
                                 "run/step_00000009/rank_00000.bin",
                                 "run/step_00000009/rank_00001.bin",
                             }));
  // An older step than one held is refused: the newer one is a timeline a restart left behind.
  EXPECT_THROW(c.Put("run/step_00000005/rank_00000.bin", "z", 1), Error);
  EXPECT_EQ(c.Trim("run", 6), 2);  // step 9 is after the restart's step 6
  EXPECT_EQ(Keys(c, "run/").size(), 2u);
  EXPECT_EQ(Keys(c, "other/").size(), 1u);  // another run's files are not touched
  EXPECT_EQ(c.Trim("run", -1), 2);
  EXPECT_TRUE(Keys(c, "run/").empty());
}

// A PUT receives into the bytes of the step it retires (Store::Recycle): the new step holds
// exactly what was sent, and a transfer cut off half-way loses only the retired step, never the
// newer one kept beside it.
TEST(PeerHolder, ACopyReceivedIntoTheRetiredStepsBytesKeepsTheNewerStepWhole) {
  Holder h;
  const peer::Client c = h.client();
  const std::string file = "/rank_00000.bin";
  const std::string a(1 << 16, 'a'), b(1 << 16, 'b'), d(1 << 16, 'd');
  c.Put("run/" + StepDirName(3) + file, a.data(), a.size());
  c.Put("run/" + StepDirName(6) + file, b.data(), b.size());
  {
    peer::Socket s = peer::Socket::Connect("127.0.0.1", h.address.port, 5);
    s.SendLine("PUT run/" + StepDirName(9) + file + " " + std::to_string(d.size()));
    s.SendAll(d.data(), d.size() / 2);
  }  // closed half-way
  // The holder notices the close on its own thread; step 3 left when the transfer began.
  for (int i = 0; i < 1000 && Keys(c, "run/").size() != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(Keys(c, "run/"), std::vector<std::string>{"run/" + StepDirName(6) + file});
  std::string got(b.size(), '?');
  c.Get("run/" + StepDirName(6) + file, 0, got.size(), got.data());
  EXPECT_EQ(got, b);
  c.Put("run/" + StepDirName(9) + file, d.data(), d.size());
  c.Put("run/" + StepDirName(12) + file, a.data(), a.size());  // into step 6's bytes
  c.Get("run/" + StepDirName(9) + file, 0, got.size(), got.data());
  EXPECT_EQ(got, d);
  c.Get("run/" + StepDirName(12) + file, 0, got.size(), got.data());
  EXPECT_EQ(got, a);
  EXPECT_EQ(Keys(c, "run/").size(), 2u);
}

// A restore's GETs share one connection (peer::Reader); an error answer drops it, and the next GET
// opens a fresh one.
TEST(PeerHolder, AReaderKeepsOneConnectionForItsGets) {
  Holder h;
  const peer::Client c = h.client();
  std::string bytes(1 << 20, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 7 + i / 4096);
  const std::string key = "run/" + StepDirName(4) + "/rank_00000.bin";
  c.Put(key, bytes.data(), bytes.size());
  peer::Reader r(h.address, 5);
  std::string got(bytes.size(), '?');
  for (size_t off = 0; off < bytes.size(); off += 100000)
    r.Get(key, off, std::min<size_t>(100000, bytes.size() - off), got.data() + off);
  EXPECT_EQ(got, bytes);
  EXPECT_THROW(r.Get("run/" + StepDirName(4) + "/rank_00001.bin", 0, 1, got.data()), Error);
  char four[4];
  r.Get(key, 8, 4, four);
  EXPECT_EQ(std::string(four, 4), bytes.substr(8, 4));
}

TEST(PeerHolder, AFullHolderRefusesAndKeepsWhatItHas) {
  Holder h(/*max_bytes=*/10);
  const peer::Client c = h.client();
  c.Put("run/step_00000001/rank_00000.bin", "12345678", 8);
  try {
    c.Put("run/step_00000001/rank_00001.bin", "12345678", 8);
    FAIL() << "a PUT past max_bytes was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("full: holds 8 of its 10 bytes"), std::string::npos)
        << e.what();
  }
  c.Put("run/step_00000001/rank_00000.bin", "abcdefghij", 10);  // a replacement fits
  EXPECT_EQ(c.List("run/").at(0).bytes, 10u);
}

TEST(PeerHolder, AHolderStartedAgainTakesBackWhatItSpilledAndDropsWhatDoesNotVerify) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("keel_spill_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    Holder h(0, dir.string());
    const peer::Client c = h.client();
    for (int step : {3, 6, 9}) c.Put("run/" + StepDirName(step) + "/rank_00000.bin", "abc", 3);
    c.Put("run/step_00000009/rank_00001.bin", "defg", 4);
    c.Put("run/step_00000009/rank_00001.bin", "DEFG", 4);  // replaced: one file stays
    for (const peer::Item& i : c.List("")) EXPECT_FALSE(i.from_disk) << i.key;
  }
  // Step 3 went with retention, on disk too; the replaced file's older version as well.
  EXPECT_FALSE(fs::exists(dir / "run/step_00000003"));
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 3);
  // A torn or changed file is not taken back.
  const fs::path six = dir / "run/step_00000006";
  const fs::path f = fs::directory_iterator(six)->path();
  std::ofstream(f, std::ios::trunc) << "abX";
  std::ofstream(six / "rank_00000.bin.0123456789abcdef.tmp") << "partial";
  {
    Holder h(0, dir.string());
    const peer::Client c = h.client();
    const std::vector<peer::Item> items = c.List("run/");
    ASSERT_EQ(items.size(), 2u);
    for (const peer::Item& i : items) EXPECT_TRUE(i.from_disk) << i.key;
    EXPECT_EQ(items[0].key, "run/step_00000009/rank_00000.bin");
    char got[5] = {};
    c.Get("run/step_00000009/rank_00001.bin", 0, 4, got);
    EXPECT_STREQ(got, "DEFG");
    EXPECT_EQ(c.Trim("run", -1), 2);  // a fresh run's trim empties the folder too
  }
  files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 0);
  fs::remove_all(dir);
}

TEST(PeerHolder, AnUnreachableHolderIsAnErrorNamingIt) {
  int port = 0;
  {
    Holder h;
    port = h.address.port;
  }
  try {
    peer::Client({"127.0.0.1", port}, 1).List("");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos);
  }
  EXPECT_THROW(peer::ParseAddresses("h1:29790,h2", "$KEEL_PEER_HOLDERS"), Error);
  EXPECT_EQ(peer::ParseAddresses("h1:1,h2:2", "x").at(1).Name(), "h2:2");
}

TEST(PeerHolder, ASaveSentByThreeRanksReadsBackThroughTheReader) {
  Holder h;
  std::vector<TensorSpec> specs = {{"wte", {13, 7}, 0}, {"bias", {5}, 91}};
  std::vector<float> master(96), m(96);
  for (size_t i = 0; i < master.size(); ++i) master[i] = 0.5f * float(i), m[i] = -float(i);
  const int world = 3;
  PeerTarget to{"run", {h.address}, 0};
  for (int r = 0; r < world; ++r) {
    CheckpointWriter w("/nonexistent-root", r, world, {});
    if (r == 1) w.ShareStaging();  // its copy goes by descriptor, the others' over TCP
    StateView v;
    v.step = 12;
    v.tokens = 1200;
    v.state = {{"layout", {{"dp", world}}}, {"loader", {{"position", 48}}}};
    v.tensors = specs;
    v.buffers = {{"master", master.data()}, {"adam_m", m.data()}};
    w.Begin(v, to);
    ASSERT_EQ(w.WaitWritten(), CheckpointWriter::kWritten);
    w.Commit();
    w.Drain();
    for (const SaveReport& rep : w.TakeReports()) {
      EXPECT_EQ(rep.error, "");
      EXPECT_EQ(rep.holders, std::vector<std::string>{"127.0.0.1"});
      EXPECT_EQ(rep.handed_over, r == 1);
    }
  }
  const peer::Client c = h.client();
  ASSERT_EQ(c.List("run/step_00000012/").size(), size_t(2 * world + 1));  // + the manifest
  auto fetch = [&](const std::string& name) {
    const uint64_t n = c.List("run/step_00000012/" + name).at(0).bytes;
    std::string s(n, '\0');
    c.Get("run/step_00000012/" + name, 0, n, s.data());
    return s;
  };
  Manifest mf = ManifestFromJsonText(fetch("manifest.json"), "manifest.json");
  std::vector<std::pair<std::string, nlohmann::json>> sides;
  for (int r = 0; r < world; ++r) {
    const auto j = nlohmann::json::parse(fetch(RankFile(r, "json")));
    EXPECT_EQ(j["host"], "127.0.0.1");
    sides.emplace_back(RankFile(r, "json"), j["pieces"]);
  }
  // Without one rank's pieces the manifest does not cover its tensors: refused, naming one.
  Manifest partial = mf;
  EXPECT_THROW(AddRankPieces(partial, {sides[0], sides[2]}), Error);
  AddRankPieces(mf, sides);
  EXPECT_EQ(mf.step, 12);
  EXPECT_EQ(mf.state["loader"]["position"], 48);
  int reads = 0;
  auto reader = CheckpointReader::FromSource(
      "peer:step_00000012", mf, [&](const std::string& file, uint64_t off, uint64_t n, void* dst) {
        ++reads;
        c.Get("run/step_00000012/" + file, off, n, dst);
      });
  std::vector<float> back(96, 0.0f), back_m(96, 0.0f);
  reader.Load(specs, {{"master", back.data()}, {"adam_m", back_m.data()}});
  EXPECT_EQ(back, master);
  EXPECT_EQ(back_m, m);
  EXPECT_GT(reads, 0);
  // A byte changed in the holder is caught by the piece's hash, naming the copy.
  const std::string file0 = fetch(RankFile(0, "bin"));
  std::string bad = file0;
  bad[5] ^= 1;
  c.Put("run/step_00000012/" + RankFile(0, "bin"), bad.data(), bad.size());
  try {
    reader.Load(specs, {{"master", back.data()}});
    FAIL() << "a corrupted copy loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("peer:step_00000012/rank_00000.bin"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace keel::ckpt
