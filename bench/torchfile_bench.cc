// torchfile_bench: shardpoint's torch.save writer and mapped reader on a ~2 GiB state
// (model + Adam moments, GPT-2 shaped), one mode per run so each is a fresh process.
//
//   torchfile_bench write FILE [--layers N] [--buffered]   -> JSON line
//   torchfile_bench read FILE                               -> JSON line
//
// write: builds the state (pre-faulted), resets the peak-RSS counter, then writes FILE as
// one torch.save archive through the local storage driver (O_DIRECT unless --buffered)
// and commits it durably (fsync + rename + dir fsync). Reports seconds, payload bytes and
// the peak RSS beyond the state.
// read: maps FILE, finds every tensor and reads every byte of it (sums 64-bit words, so
// the data really is touched), reporting seconds and peak RSS growth. Nothing is copied.
// bench/torchfile_bench.py runs these beside PyTorch 1.13 and fio and prints the table.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>

#include "bench/bench_util.h"
#include "shardpoint/pickle_value.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"
#include "torchfile/torch_file.h"
#include "torchfile/torch_save_writer.h"

namespace shardpoint::bench {
namespace {

using pickle::Value;

struct OwnedTensor {
  std::string key;
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

std::vector<OwnedTensor> build_state(int layers) {
  std::vector<OwnedTensor> tensors;
  auto params = gpt2_parameters(layers);
  std::uint32_t seed = 1;
  auto add = [&](const std::string& key, const std::vector<std::int64_t>& shape) {
    OwnedTensor t{key, shape, std::vector<float>(static_cast<std::size_t>(numel(shape)))};
    for (std::size_t i = 0; i < t.data.size(); ++i)
      t.data[i] = static_cast<float>((i * 2654435761u + seed) % 1000) * 1e-3f;
    ++seed;
    tensors.push_back(std::move(t));
  };
  for (const auto& p : params) add("model." + p.name, p.shape);
  for (const auto& p : params) {
    add("optimizer.state." + p.name + ".exp_avg", p.shape);
    add("optimizer.state." + p.name + ".exp_avg_sq", p.shape);
  }
  return tensors;
}

// {"model": {name: T}, "optimizer": {"state": {name: {"step": 10, "exp_avg": T, ...}}}}
pickle::ValuePtr build_tree(const std::vector<OwnedTensor>& tensors, int layers) {
  auto params = gpt2_parameters(layers);
  std::size_t next = 0;
  auto tensor_node = [&](const OwnedTensor& t) {
    std::string key = std::to_string(next++);
    auto strides = torchfile::contiguous_strides(t.shape);
    return torchfile::make_tensor_node(DType::kFloat32, t.shape, strides, 0, key, t.data.size());
  };
  auto model = Value::dict();
  std::size_t i = 0;
  for (const auto& p : params) model->mutable_entries().push_back({Value::str(p.name), tensor_node(tensors[i++])});
  auto state = Value::dict();
  for (const auto& p : params) {
    auto s = Value::dict();
    s->mutable_entries().push_back({Value::str("step"), Value::integer(10)});
    s->mutable_entries().push_back({Value::str("exp_avg"), tensor_node(tensors[i++])});
    s->mutable_entries().push_back({Value::str("exp_avg_sq"), tensor_node(tensors[i++])});
    state->mutable_entries().push_back({Value::str(p.name), s});
  }
  auto optimizer = Value::dict({{Value::str("state"), state}});
  return Value::dict({{Value::str("model"), model}, {Value::str("optimizer"), optimizer}});
}

int run_write(const std::string& file, int layers, bool buffered) {
  auto tensors = build_state(layers);
  auto tree = build_tree(tensors, layers);
  std::uint64_t payload = 0;
  for (const auto& t : tensors) payload += t.data.size() * sizeof(float);
  std::uint64_t rss_before = proc_status_bytes("VmRSS");
  reset_peak_rss();

  double start = now_seconds();
  std::filesystem::path path(file);
  auto storage = storage::open_storage(path.parent_path().string());
  storage::WriteOptions options;
  options.direct_io = !buffered;
  auto writer = storage->open_writer(path.filename().string(), options);
  torchfile::TorchSaveOptions save_options;
  save_options.archive_name = path.stem().string();
  torchfile::TorchSaveWriter out(*writer, save_options);
  out.write_pickle(*tree);
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    out.write_storage(std::to_string(k), std::as_bytes(std::span(tensors[k].data)));
  }
  out.finish();
  writer->commit();
  double seconds = now_seconds() - start;

  std::uint64_t hwm = proc_status_bytes("VmHWM");
  std::printf("{\"mode\": \"write\", \"seconds\": %.4f, \"bytes\": %llu, \"file_bytes\": %llu, "
              "\"extra_peak_rss\": %lld, \"direct_io\": %s}\n",
              seconds, static_cast<unsigned long long>(payload),
              static_cast<unsigned long long>(std::filesystem::file_size(path)),
              static_cast<long long>(hwm) - static_cast<long long>(rss_before), buffered ? "false" : "true");
  return 0;
}

int run_read(const std::string& file) {
  std::uint64_t rss_before = proc_status_bytes("VmRSS");
  reset_peak_rss();
  double start = now_seconds();
  auto torch_file = torchfile::TorchFile::open(file);
  std::uint64_t bytes = 0, checksum = 0;
  for (const auto& info : torch_file->tensors()) {
    auto view = torch_file->storage_view(info);
    if (!view) return 1;
    const auto* words = reinterpret_cast<const std::uint64_t*>(view->data());
    std::size_t n = view->size() / 8;
    std::uint64_t s = 0;
    for (std::size_t w = 0; w < n; ++w) s += words[w];
    checksum += s;
    bytes += info.nbytes();
  }
  double seconds = now_seconds() - start;
  std::uint64_t hwm = proc_status_bytes("VmHWM");
  // Mapped pages of the file count in RSS but are page cache, not allocations: report the
  // anonymous growth separately.
  std::printf("{\"mode\": \"read\", \"seconds\": %.4f, \"bytes\": %llu, \"tensors\": %zu, "
              "\"peak_rss_growth\": %lld, \"anon_rss\": %llu, \"checksum\": %llu}\n",
              seconds, static_cast<unsigned long long>(bytes), torch_file->tensors().size(),
              static_cast<long long>(hwm) - static_cast<long long>(rss_before),
              static_cast<unsigned long long>(proc_status_bytes("RssAnon")), static_cast<unsigned long long>(checksum));
  return 0;
}

}  // namespace
}  // namespace shardpoint::bench

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: torchfile_bench write FILE [--layers N] [--buffered] | read FILE\n");
    return 2;
  }
  std::string mode = argv[1], file = argv[2];
  int layers = 24;
  bool buffered = false;
  for (int i = 3; i < argc; ++i) {
    if (std::strcmp(argv[i], "--layers") == 0 && i + 1 < argc) layers = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--buffered") == 0) buffered = true;
  }
  try {
    if (mode == "write") return shardpoint::bench::run_write(file, layers, buffered);
    if (mode == "read") return shardpoint::bench::run_read(file);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torchfile_bench: %s\n", e.what());
    return 1;
  }
  return 2;
}
