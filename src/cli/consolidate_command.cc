// `shardpoint consolidate CHECKPOINT_FOLDER [--output_file FILE]`: Lightning's
// consolidate_checkpoint (docs/lightning-layout.md §4), streaming with a fixed memory budget
// (shardpoint/consolidate.h). Folder and output may be local paths or object-store URLs.
// Validation messages and exit codes are Lightning's: each failure is one stderr line and
// exit 1, usage errors exit 2; nothing is printed on success.
// SIGINT/SIGTERM stop the copy between slabs; the temporary output is removed and the exit
// code is 130/143.
#include <csignal>
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/output.h"
#include "cli/progress.h"
#include "shardpoint/consolidate.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"

namespace shardpoint::cli {

namespace {

std::atomic<int> g_signal{0};

extern "C" void on_stop_signal(int sig) { g_signal.store(sig); }

class SignalGuard {
 public:
  SignalGuard() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

class ConsolidateCommand : public Command {
 public:
  void add_to(CLI::App& app) override {
    sub_ = app.add_subcommand(
        "consolidate",
        "Converts a distributed/sharded checkpoint into a single file that can be loaded with `torch.load()`.");
    sub_->footer("Streams: memory stays under --memory-budget-bytes whatever the checkpoint's size.\n"
                 "Layouts: trainer (default; Lightning Trainer: model -> state_dict, optimizer_N ->\n"
                 "optimizer_states; a ModelParallelStrategy checkpoint keeps its state_dict), fabric\n"
                 "(keys as saved), dcp (any DCP folder, meta.pt optional: what torch's\n"
                 "dcp_to_torch_save writes, with a Lightning folder's meta.pt merged on top as\n"
                 "Lightning's _load_distributed_checkpoint does, so the trainer state stays).\n"
                 "--format safetensors writes the model weights; with --max-shard-bytes the output is\n"
                 "a folder of model-0000i-of-0000n.safetensors files + model.safetensors.index.json.\n"
                 "--format hf-safetensors always writes that folder (Hugging Face's layout, as\n"
                 "PyTorch's HuggingFaceStorageWriter consolidates), one file unless --max-shard-bytes\n"
                 "splits it.\n"
                 "Default output: <folder>.consolidated next to the folder.\n"
                 "URLs: the folder and the output may each be an object-store URL (s3://, gs://,\n"
                 "az://, abfs[s]://) or a local path, in any combination; credentials come from the\n"
                 "environment as for every command. Remote input is read with ranged GETs and\n"
                 "remote output uploaded in parts, both within --memory-budget-bytes; the output\n"
                 "object appears only when complete (safetensors shards first, index last), and a\n"
                 "failed or interrupted upload is aborted.");
    sub_->add_option("CHECKPOINT_FOLDER", folder_,
                     "path or URL (s3://bucket/prefix, az://container/prefix, ...) of the sharded checkpoint")
        ->required();
    sub_->add_option("--output_file,--output-file,--output", output_,
                     "path or URL of the output file (default: <folder>.consolidated)");
    // The names are checked by run(), through the engine's one mapping (shardpoint/consolidate.h).
    // Each option's name is its name in ConsolidateOptions, the C API and Python (the older
    // spellings after it are kept for scripts).
    sub_->add_option("--layout", layout_, "trainer (default) | fabric | dcp");
    sub_->add_option("--format,--to", format_, "torch (default) | safetensors | hf-safetensors");
    sub_->add_option("--max-shard-bytes,--max-shard-size", max_shard_,
                     "safetensors: split into files of at most SIZE (e.g. 5GB)");
    sub_->add_option("--memory-budget-bytes,--memory-budget", budget_,
                     "memory for the copy, e.g. 1GiB (default " +
                         human_bytes(engine::ConsolidateOptions{}.memory_budget_bytes) + ")");
    sub_->add_flag("--quiet,-q", quiet_, "no progress bar");
    sub_->add_flag("--no-verify-checksums", no_verify_,
                   "do not check the checksum sidecar (or, without one, the zip CRC-32s) while reading");
    sub_->add_flag("--no-zip-crc", no_zip_crc_,
                   "do not check the zip CRC-32s of records no checksum sidecar covers (PyTorch's checkpoints)");
    sub_->add_flag("--stats", stats_, "print one JSON line of measurements on stderr when done");
  }
  bool parsed() const override { return sub_->parsed(); }

  int run() override {
    engine::ConsolidateOptions options;
    options.checkpoint_folder = Location::parse(folder_);
    if (!output_.empty()) options.output_file = Location::parse(output_);
    if (!layout_.empty()) options.layout = engine::consolidate_layout_from_name(layout_, "--layout");
    if (!format_.empty()) options.format = engine::consolidate_format_from_name(format_, "--format");
    if (!max_shard_.empty()) {
      if (options.format == engine::ConsolidateFormat::kTorchSave) {
        throw UsageError("--max-shard-bytes applies to --format safetensors and hf-safetensors only");
      }
      options.max_shard_bytes = parse_size(max_shard_);
      if (options.max_shard_bytes == 0) throw UsageError("--max-shard-bytes must be > 0");
    }
    if (!budget_.empty()) options.memory_budget_bytes = parse_size(budget_);
    if (options.memory_budget_bytes < (std::uint64_t{1} << 20))
      throw UsageError("--memory-budget-bytes must be at least 1MiB");
    options.verify_checksums = !no_verify_;
    options.check_zip_crc = !no_zip_crc_;
    options.cancel = &g_signal;

    SignalGuard guard;
    ProgressBar bar(!quiet_);
    try {
      engine::ConsolidateReport report = engine::consolidate(
          options, [&](const engine::ConsolidateProgress& p) { bar.update(p.bytes_done, p.bytes_total); });
      bar.finish();
      if (stats_) {
        std::fprintf(stderr,
                     "{\"tensors\": %llu, \"tensor_bytes\": %llu, \"bytes_read\": %llu, \"seconds\": %.3f, "
                     "\"slab_bytes\": %zu, \"base_rss_bytes\": %llu, \"peak_rss_bytes\": %llu, "
                     "\"zip_crc_records\": %llu, \"zip_crc_bytes\": %llu}\n",
                     static_cast<unsigned long long>(report.tensors),
                     static_cast<unsigned long long>(report.tensor_bytes),
                     static_cast<unsigned long long>(report.bytes_read), report.seconds, report.slab_bytes,
                     static_cast<unsigned long long>(report.base_rss_bytes),
                     static_cast<unsigned long long>(report.peak_rss_bytes),
                     static_cast<unsigned long long>(report.zip_crc.records_checked),
                     static_cast<unsigned long long>(report.zip_crc.bytes_checked));
      }
    } catch (const engine::Cancelled& e) {
      bar.finish();
      std::cerr << "shardpoint: " << e.what() << "\n";
      return 128 + g_signal.load();
    } catch (const UsageError&) {
      bar.finish();
      throw;
    } catch (const std::exception& e) {
      bar.finish();
      if (g_signal.load() != 0) {
        std::cerr << "shardpoint: interrupted; no output written\n";
        return 128 + g_signal.load();
      }
      throw;
    }
    bar.finish();
    return 0;
  }

 private:
  CLI::App* sub_ = nullptr;
  std::string folder_;
  std::string output_;
  // "": the engine's default (ConsolidateOptions).
  std::string layout_;
  std::string format_;
  std::string max_shard_;
  std::string budget_;
  bool quiet_ = false;
  bool no_verify_ = false;
  bool no_zip_crc_ = false;
  bool stats_ = false;
};

}  // namespace

std::uint64_t parse_size(const std::string& text) {
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) throw UsageError("not a size: \"" + text + "\" (expected e.g. 256MiB, 16M, 5GB)");
  double value = 0;
  try {
    value = std::stod(text.substr(0, i));
  } catch (const std::exception&) {
    throw UsageError("not a size: \"" + text + "\"");
  }
  std::string unit = text.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KIB") mult = 1024.0;
  else if (unit == "M" || unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TIB") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  else throw UsageError("not a size: \"" + text + "\" (units: B, KiB/K, MiB/M, GiB/G, TiB/T, KB, MB, GB, TB)");
  return static_cast<std::uint64_t>(value * mult);
}

std::unique_ptr<Command> make_consolidate_command() { return std::make_unique<ConsolidateCommand>(); }

}  // namespace shardpoint::cli
