// A C++ program that uses shardpoint through its installed package: the public headers
// (<shardpoint/*.h>) and libshardpoint.so. With one rank it saves a small checkpoint (a
// tensor and an object), loads part of it back, reads a box with CheckpointReader, verifies
// it, and catches the library's error for a key the checkpoint lacks.
//
//   cmake -S examples/cpp_api -B build-example -DCMAKE_PREFIX_PATH=<install prefix>
//   cmake --build build-example && build-example/cpp_api_example /tmp/ckpt
#include <shardpoint/checkpoint.h>
#include <shardpoint/checkpoint_reader.h>
#include <shardpoint/error.h>
#include <shardpoint/pickle_value.h>
#include <shardpoint/single_communicator.h>
#include <shardpoint/state_dict.h>
#include <shardpoint/storage.h>
#include <shardpoint/storage_registry.h>
#include <shardpoint/verify.h>

#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace sp = shardpoint;

namespace {

// A box [offsets, offsets+sizes) of a float32 tensor of global shape `shape`, over `data`.
sp::engine::TensorShard float_box(sp::format::Shape shape, sp::format::Shape offsets, sp::format::Shape sizes,
                                  std::vector<float>& data) {
  sp::engine::TensorShard box;
  box.dtype = sp::DType::kFloat32;
  box.global_shape = std::move(shape);
  box.offsets = std::move(offsets);
  box.sizes = std::move(sizes);
  box.data = std::as_writable_bytes(std::span(data));
  return box;
}

bool check(bool ok, const char* what) {
  if (!ok) std::fprintf(stderr, "cpp_api_example: %s: wrong result\n", what);
  return ok;
}

int run(const std::string& folder) {
  std::unique_ptr<sp::storage::Storage> storage = sp::storage::open_storage(folder);
  std::unique_ptr<sp::comm::Communicator> comm = sp::comm::make_single_communicator();

  // Save: a 3x2 tensor and a step counter.
  std::vector<float> weight = {1, 2, 3, 4, 5, 6};
  sp::engine::StateNode state;
  state.set("weight", float_box({3, 2}, {0, 0}, {3, 2}, weight));
  state.set("step", sp::pickle::Value::integer(7));
  const sp::engine::SaveReport saved = sp::engine::save(state, *storage, *comm);

  // Load rows 1-2 of the tensor and the object (a placeholder names what is wanted).
  std::vector<float> rows(4);
  sp::engine::StateNode wanted;
  wanted.set("weight", float_box({3, 2}, {1, 0}, {2, 2}, rows));
  wanted.set("step", sp::pickle::Value::none());
  const sp::engine::LoadReport loaded = sp::engine::load(wanted, *storage, *comm);
  bool ok = check(rows == std::vector<float>{3, 4, 5, 6}, "load rows 1-2");
  ok &= check(wanted.find("step")->object()->as_int() == 7, "load step");

  // Random access without a communicator: column 1.
  sp::engine::CheckpointReader reader(*storage);
  std::vector<float> column(3);
  reader.read_box("weight", {0, 1}, {3, 1}, std::as_writable_bytes(std::span(column)));
  ok &= check(column == std::vector<float>{2, 4, 6}, "CheckpointReader column 1");
  ok &= check(reader.metadata().state_dict_metadata.size() == 2, "metadata entries");

  const sp::engine::VerifyReport report = sp::engine::verify(folder);
  ok &= check(report.ok() && report.tensors == 1 && report.objects == 1, "verify");

  // Errors are exceptions of one hierarchy (shardpoint/error.h): a strict load of a key the
  // checkpoint lacks is a PlanError.
  std::vector<float> absent(1);
  sp::engine::StateNode missing;
  missing.set("absent", float_box({1}, {0}, {1}, absent));
  bool threw = false;
  try {
    sp::engine::load(missing, *storage, *comm);
  } catch (const sp::PlanError& e) {
    threw = std::string(e.what()).find("absent") != std::string::npos;
  }
  ok &= check(threw, "PlanError for a missing key");

  std::printf("cpp_api_example: saved %zu file(s), %llu bytes; loaded %llu bytes; rows 1-2: %g %g %g %g; %s\n",
              saved.files.size(), static_cast<unsigned long long>(saved.bytes_written),
              static_cast<unsigned long long>(loaded.bytes_needed), rows[0], rows[1], rows[2], rows[3],
              ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: cpp_api_example CHECKPOINT_FOLDER\n");
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const sp::Error& e) {
    std::fprintf(stderr, "cpp_api_example: %s\n", e.what());
    return 1;
  }
}
