// dcp_bench: one rank of the DCP save/load benchmark (bench/dcp_bench.py launches N of
// them with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; the communicator is the TCP driver, the
// only multi-process one this program links, so no rank carries LibTorch).
//
//   dcp_bench save DIR [--layers 24] [--threads 1] [--no-checksum]
//   dcp_bench load DIR [--layers 24] [--threads 4] [--no-verify] [--no-zip-crc]
//   dcp_bench crc-floor DIR [--rounds 5]
//
// The state is the one bench/dcp_bench.py describes (the PyTorch peer's): GPT-2 style
// parameters plus Adam exp_avg/exp_avg_sq, all float32 and Shard(0) over a 1-D mesh of the
// world size (DTensor's ceil split), plus a replicated 0-dim float32 `step` per parameter
// and one param group of 11 keys:
//   {"model": {fqn: w}, "optimizer_0": {"state": {fqn: {"step", "exp_avg", "exp_avg_sq"}},
//                                       "param_groups": [{...}]}}
// Element i (global row-major index) of tensor key k holds ((fnv1a32(k) + 7919 i) mod 1000
// - 500) / 8, as bench/dcp_bench.py's PyTorch peer writes it, so either side's checkpoint
// loads and verifies here.
//
// Each rank builds and pre-faults its boxes, resets VmHWM, waits at a barrier, times the
// save()/load() call, verifies (load), and prints one JSON line:
//   {"rank", "world_size", "seconds", "bytes" (payload of this rank's boxes), "own_bytes",
//    "peak_rss" (VmHWM during the call), "rss_before", "bytes_written" | "bytes_needed",
//    "bytes_read", "data_bytes_read", "device_read_bytes" (/proc/self/io read_bytes),
//    "cpu_seconds" (user + system CPU of the process during the call, all threads),
//    "major_faults", "zip_crc_records" / "zip_crc_bytes" / "zip_crc_partial" (load: the zip
//    CRC-32 checks of blobs no sidecar covers), "verified"}
// Exit codes: 0 ok, 1 a loaded value differs, 2 an exception.
//
// crc-floor (no ranks): the least a CRC-32 check can cost a load that copies from the page
// cache. One thread preads every regular file in DIR in 256 KiB pieces (the piece a checked
// load hashes right after its read) into a buffer it has touched before, once alone and once
// with crc32() over each piece; rounds alternate, the fastest of each is kept. Prints
// {"bytes", "copy_seconds", "copy_crc_seconds", "crc_gbps"} (crc_gbps: CRC-32 over a hot
// 256 KiB piece, the same run). Run it with DIR already in the page cache.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "core/checksum.h"
#include "engine/chunking.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/communicator_from_env.h"
#include "shardpoint/pickle_value.h"
#include "shardpoint/storage_registry.h"

namespace sb = shardpoint::bench;
namespace se = shardpoint::engine;
using shardpoint::pickle::Value;

namespace {

std::uint32_t fnv1a32(const std::string& s) {
  std::uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

// Values of key's tensor from row-major element `first` on, out.size() of them.
void fill(const std::string& key, std::int64_t first, std::span<float> out) {
  std::uint64_t h = fnv1a32(key);
  std::uint64_t m = (h + 7919ull * static_cast<std::uint64_t>(first)) % 1000;
  for (float& v : out) {
    v = static_cast<float>(static_cast<std::int64_t>(m) - 500) / 8.0f;
    m += 7919 % 1000;
    if (m >= 1000) m -= 1000;
  }
}

std::uint64_t proc_io(const std::string& field) {
  std::ifstream in("/proc/self/io");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
  }
  return 0;
}

// User + system CPU seconds and major faults of the process so far.
std::pair<double, long> cpu_and_major_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return {sec(u.ru_utime) + sec(u.ru_stime), u.ru_majflt};
}

struct Tensor {
  std::string key;  // value key (fqn of the flattened state)
  se::Shape shape;
  std::vector<float> data;  // this rank's box
  se::Shape offsets, sizes;
};

struct RankState {
  std::vector<Tensor> tensors;  // stable addresses after build
  se::StateNode root;
  std::uint64_t bytes = 0;
};

RankState build(int layers, int rank, int world, bool fill_values) {
  RankState st;
  auto params = sb::gpt2_parameters(layers);
  // keys: model.<p>, optimizer_0.state.<p>.exp_avg / exp_avg_sq / step
  for (const auto& p : params) {
    for (std::string key : {"model." + p.name, "optimizer_0.state." + p.name + ".exp_avg",
                            "optimizer_0.state." + p.name + ".exp_avg_sq"}) {
      Tensor t;
      t.key = key;
      t.shape = p.shape;
      auto box = se::shard_box(p.shape, {world}, {se::Placement::shard(0)}, {rank});
      t.offsets = box.offsets;
      t.sizes = box.sizes;
      t.data.resize(static_cast<std::size_t>(se::volume(box.sizes)));
      st.tensors.push_back(std::move(t));
    }
    Tensor step;
    step.key = "optimizer_0.state." + p.name + ".step";
    step.data.assign(1, 10.0f);
    st.tensors.push_back(std::move(step));
  }
  for (Tensor& t : st.tensors) {
    if (t.shape.empty()) continue;
    std::int64_t row = sb::numel({t.shape.begin() + 1, t.shape.end()});
    if (fill_values) {
      fill(t.key, t.offsets[0] * row, t.data);
    } else {
      std::memset(t.data.data(), 0xff, t.data.size() * sizeof(float));  // pre-fault
    }
    st.bytes += t.data.size() * sizeof(float);
  }
  auto shard_of = [](Tensor& t) {
    se::TensorShard s;
    s.dtype = shardpoint::DType::kFloat32;
    s.global_shape = t.shape;
    s.offsets = t.offsets;
    s.sizes = t.sizes;
    s.data = std::as_writable_bytes(std::span<float>(t.data));
    return s;
  };
  se::StateDict model, opt_state;
  std::size_t i = 0;
  for (const auto& p : params) {
    model.emplace_back(p.name, shard_of(st.tensors[i]));
    se::StateDict per;
    per.emplace_back("step", shard_of(st.tensors[i + 3]));
    per.emplace_back("exp_avg", shard_of(st.tensors[i + 1]));
    per.emplace_back("exp_avg_sq", shard_of(st.tensors[i + 2]));
    opt_state.emplace_back(p.name, se::StateNode(std::move(per)));
    i += 4;
  }
  std::vector<shardpoint::pickle::ValuePtr> names;
  for (const auto& p : params) names.push_back(Value::str(p.name));
  shardpoint::pickle::DictEntries group = {
      {Value::str("lr"), Value::floating(1e-3)},
      {Value::str("betas"), Value::tuple({Value::floating(0.9), Value::floating(0.999)})},
      {Value::str("eps"), Value::floating(1e-8)},
      {Value::str("weight_decay"), Value::floating(0.0)},
      {Value::str("amsgrad"), Value::boolean(false)},
      {Value::str("foreach"), Value::none()},
      {Value::str("maximize"), Value::boolean(false)},
      {Value::str("capturable"), Value::boolean(false)},
      {Value::str("differentiable"), Value::boolean(false)},
      {Value::str("fused"), Value::none()},
      {Value::str("params"), Value::list(std::move(names))}};
  se::StateDict groups_dict;
  for (auto& [k, v] : group) groups_dict.emplace_back(k->as_string(), se::StateNode(v));
  se::StateList groups;
  groups.emplace_back(std::move(groups_dict));
  se::StateDict optimizer;
  optimizer.emplace_back("state", se::StateNode(std::move(opt_state)));
  optimizer.emplace_back("param_groups", se::StateNode(std::move(groups)));
  se::StateDict root;
  root.emplace_back("model", se::StateNode(std::move(model)));
  root.emplace_back("optimizer_0", se::StateNode(std::move(optimizer)));
  st.root = se::StateNode(std::move(root));
  return st;
}

// Number of elements of the loaded state that differ from the expected values.
std::uint64_t count_mismatches(const RankState& st) {
  std::uint64_t bad = 0;
  std::vector<float> want;
  for (const Tensor& t : st.tensors) {
    if (t.shape.empty()) {
      bad += t.data[0] != 10.0f;
      continue;
    }
    want.resize(t.data.size());
    std::int64_t row = sb::numel({t.shape.begin() + 1, t.shape.end()});
    fill(t.key, t.offsets[0] * row, want);
    if (std::memcmp(want.data(), t.data.data(), want.size() * sizeof(float)) != 0) ++bad;
  }
  return bad;
}

// The crc-floor mode (see the header).
nlohmann::ordered_json crc_floor(const std::string& dir, int rounds) {
  constexpr std::size_t kPiece = std::size_t{256} << 10;
  std::vector<std::string> files;
  std::uint64_t largest = 0, bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    files.push_back(entry.path().string());
    largest = std::max<std::uint64_t>(largest, entry.file_size());
    bytes += entry.file_size();
  }
  std::vector<std::byte> buffer(largest + kPiece, std::byte{1});  // touched: no page faults timed
  std::uint32_t sink = 0;
  auto pass = [&](bool with_crc) {
    const double t0 = sb::now_seconds();
    for (const std::string& path : files) {
      const int fd = ::open(path.c_str(), O_RDONLY);
      if (fd < 0) throw std::runtime_error("open " + path + ": " + std::strerror(errno));
      std::uint32_t crc = 0;
      for (std::uint64_t at = 0;; at += kPiece) {
        const ssize_t n = ::pread(fd, buffer.data() + at, kPiece, static_cast<off_t>(at));
        if (n <= 0) break;
        if (with_crc) crc = shardpoint::crc32(crc, shardpoint::ByteSpan(buffer.data() + at, n));
      }
      ::close(fd);
      sink ^= crc;
    }
    return sb::now_seconds() - t0;
  };
  double copy = 1e9, copy_crc = 1e9;
  for (int r = 0; r < rounds; ++r) {
    copy = std::min(copy, pass(false));
    copy_crc = std::min(copy_crc, pass(true));
  }
  double hot = 1e9;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = sb::now_seconds();
    for (int i = 0; i < 4096; ++i) sink ^= shardpoint::crc32(sink, shardpoint::ByteSpan(buffer.data(), kPiece));
    hot = std::min(hot, sb::now_seconds() - t0);
  }
  nlohmann::ordered_json out;
  out["bytes"] = bytes;
  out["copy_seconds"] = copy;
  out["copy_crc_seconds"] = copy_crc;
  out["crc_gbps"] = 4096.0 * kPiece / hot / 1e9;
  out["sink"] = sink;  // keeps the CRCs from being optimised away
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: dcp_bench save|load|crc-floor DIR [--layers N] [--threads N] [--no-checksum] [--no-verify] "
                 "[--no-zip-crc]\n";
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  if (mode == "crc-floor") {
    const int rounds = argc > 4 && std::string(argv[3]) == "--rounds" ? std::stoi(argv[4]) : 5;
    try {
      std::cout << crc_floor(dir, rounds).dump() << std::endl;
      return 0;
    } catch (const std::exception& e) {
      std::cerr << "dcp_bench: " << e.what() << "\n";
      return 2;
    }
  }
  int layers = 24, threads = -1;
  bool checksum = true, verify = true, zip_crc = true;
  for (int a = 3; a < argc; ++a) {
    std::string arg = argv[a];
    if (arg == "--layers" && a + 1 < argc) layers = std::stoi(argv[++a]);
    else if (arg == "--threads" && a + 1 < argc) threads = std::stoi(argv[++a]);
    else if (arg == "--no-checksum") checksum = false;
    else if (arg == "--no-verify") verify = false;
    else if (arg == "--no-zip-crc") zip_crc = false;
    else {
      std::cerr << "dcp_bench: unknown argument " << arg << "\n";
      return 2;
    }
  }
  try {
    auto comm = shardpoint::comm::make_communicator_from_env();
    const int rank = comm->rank(), world = comm->world_size();
    auto storage = shardpoint::storage::open_storage(dir);
    RankState st = build(layers, rank, world, mode == "save");
    nlohmann::ordered_json out;
    out["rank"] = rank;
    out["world_size"] = world;
    out["own_bytes"] = st.bytes;
    out["bytes"] = st.bytes;
    std::uint64_t io_before = proc_io("read_bytes");
    out["rss_before"] = sb::proc_status_bytes("VmRSS");
    sb::reset_peak_rss();
    comm->barrier();
    const auto [cpu0, majflt0] = cpu_and_major_faults();
    if (mode == "save") {
      se::SaveOptions options;
      if (threads > 0) options.thread_count = threads;
      if (!checksum) options.checksum = se::ChecksumAlgorithm::kNone;
      double t0 = sb::now_seconds();
      se::SaveReport r = se::save(st.root, *storage, *comm, options);
      out["seconds"] = sb::now_seconds() - t0;
      out["call_window"] = {t0, t0 + out["seconds"].get<double>()};  // CLOCK_MONOTONIC, for perf --time
      const auto [cpu1, majflt1] = cpu_and_major_faults();
      out["cpu_seconds"] = cpu1 - cpu0;
      out["major_faults"] = majflt1 - majflt0;
      out["peak_rss"] = sb::proc_status_bytes("VmHWM");
      out["bytes_written"] = r.bytes_written;
      out["plan_seconds"] = r.plan_seconds;
      out["write_seconds"] = r.write_seconds;
      out["commit_seconds"] = r.commit_seconds;
      out["verified"] = true;
    } else if (mode == "load") {
      se::LoadOptions options;
      if (threads > 0) options.thread_count = threads;
      options.verify_checksums = verify;
      options.check_zip_crc = zip_crc;
      double t0 = sb::now_seconds();
      se::LoadReport r = se::load(st.root, *storage, *comm, options);
      out["seconds"] = sb::now_seconds() - t0;
      out["call_window"] = {t0, t0 + out["seconds"].get<double>()};  // CLOCK_MONOTONIC, for perf --time
      const auto [cpu1, majflt1] = cpu_and_major_faults();
      out["cpu_seconds"] = cpu1 - cpu0;
      out["major_faults"] = majflt1 - majflt0;
      out["peak_rss"] = sb::proc_status_bytes("VmHWM");
      out["bytes_needed"] = r.bytes_needed;
      out["bytes_read"] = r.bytes_read;
      out["data_bytes_read"] = r.data_bytes_read;
      out["zip_crc_records"] = r.zip_crc.records_checked;
      out["zip_crc_bytes"] = r.zip_crc.bytes_checked;
      out["zip_crc_partial"] = r.zip_crc.records_partial;
      out["device_read_bytes"] = proc_io("read_bytes") - io_before;
      out["verified"] = count_mismatches(st) == 0;
    } else {
      std::cerr << "dcp_bench: mode must be save or load\n";
      return 2;
    }
    std::cout << out.dump() << std::endl;
    return out["verified"].get<bool>() ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "dcp_bench: " << e.what() << "\n";
    return 2;
  }
}
