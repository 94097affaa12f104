// Saves with zstd items compressed ahead on a pool (compress_ahead.h,
// SaveOptions::compression_threads): the data files are byte for byte what one thread per
// file writes (many items of mixed sizes, two files), the recorded items equal; an item over
// the in-memory limit (streamed with libzstd's workers) loads back exactly.
#include "engine/compress_ahead.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "comm/thread_communicator.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"
#include "storage/local_storage.h"
#include "test_util.h"

namespace shardpoint::engine {
namespace {

namespace fs = std::filesystem;

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Tensors of 1 KiB .. 2 MiB (noise in the low bytes, as trained weights), and one object.
struct State {
  std::vector<std::vector<float>> data;
  StateNode root{StateDict{}};

  explicit State(int tensors, std::int64_t big_elems = 0) {
    for (int t = 0; t < tensors + (big_elems > 0 ? 1 : 0); ++t) {
      const std::int64_t n = t == tensors ? big_elems : (std::int64_t{256} << (t % 12));
      std::vector<float>& v = data.emplace_back(static_cast<std::size_t>(n));
      std::uint32_t x = 12345u + static_cast<std::uint32_t>(t);
      for (float& f : v) {
        x = x * 1664525u + 1013904223u;
        f = t == tensors ? 0.0f : static_cast<float>(x >> 8) * 1e-9f;
      }
    }
    for (std::size_t t = 0; t < data.size(); ++t) {
      TensorShard s;
      s.global_shape = s.sizes = {static_cast<std::int64_t>(data[t].size())};
      s.offsets = {0};
      s.data = std::as_writable_bytes(std::span<float>(data[t]));
      root.set("t" + std::to_string(t), StateNode(s));
    }
    root.set("step", StateNode(pickle::Value::integer(9)));
  }
};

void save_to(const std::string& folder, State& state, int compression_threads) {
  auto st = storage::open_local_storage_at(folder);
  SaveOptions so;
  so.compression = Compression::kZstd;
  so.compression_threads = compression_threads;
  so.thread_count = 2;
  so.durable = false;
  comm::ThreadGroup one(1);
  one.run([&](comm::Communicator& comm) { save(state.root, *st, comm, so); });
}

TEST(CompressAheadTest, FilesAreWhatOneThreadPerFileWrites) {
  shardpoint::testing::TempDir dir;
  State state(40);
  save_to(dir.file("one"), state, 1);
  save_to(dir.file("pool"), state, 3);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.file("one"))) {
    const std::string name = e.path().filename().string();
    if (!name.ends_with(".distcp") && name != ".metadata") continue;
    EXPECT_EQ(file_bytes(e.path()), file_bytes(fs::path(dir.file("pool")) / name)) << name;
    ++files;
  }
  EXPECT_EQ(files, 3);  // two data files and .metadata
}

TEST(CompressAheadTest, ItemOverTheMemoryLimitStreamsAndLoads) {
  shardpoint::testing::TempDir dir;
  State state(6, std::int64_t{17} << 20);  // 68 MiB of zeros: streamed
  save_to(dir.file("ck"), state, 2);
  auto st = storage::open_local_storage_at(dir.file("ck"));
  std::vector<std::vector<float>> got;
  StateNode tmpl(StateDict{});
  for (std::size_t t = 0; t < state.data.size(); ++t) {
    got.emplace_back(state.data[t].size(), -1.0f);
    TensorShard s;
    s.global_shape = s.sizes = {static_cast<std::int64_t>(got[t].size())};
    s.offsets = {0};
    s.data = std::as_writable_bytes(std::span<float>(got[t]));
    tmpl.set("t" + std::to_string(t), StateNode(s));
  }
  tmpl.set("step", StateNode(pickle::Value::integer(0)));
  comm::ThreadGroup one(1);
  one.run([&](comm::Communicator& comm) { load(tmpl, *st, comm); });
  for (std::size_t t = 0; t < got.size(); ++t) {
    EXPECT_EQ(std::memcmp(got[t].data(), state.data[t].data(), got[t].size() * 4), 0) << t;
  }
  EXPECT_EQ(tmpl.find("step")->object()->as_int(), 9);
}

TEST(CompressAheadTest, ThreadCountDefaultsToTheMachine) {
  SaveOptions so;
  EXPECT_GE(compression_thread_count(so), 1);
  so.compression_threads = 5;
  EXPECT_EQ(compression_thread_count(so), 5);
}

}  // namespace
}  // namespace shardpoint::engine
