// `shardpoint reshard SRC DST --ranks N`: rewrite a checkpoint as a DCP folder saved by N
// ranks with dim-0 sharding (shardpoint/reshard.h). SRC and DST may be storage URLs. Errors are
// one line, exit 1 (a DST that exists and is not empty included); bad arguments exit 2. A
// failed reshard leaves no output: the engine removes its files, this command the DST
// folder it created.
#include <sys/stat.h>

#include <filesystem>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli/checkpoint_listing.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"
#include "shardpoint/reshard.h"
#include "shardpoint/storage_registry.h"

namespace shardpoint::cli {

namespace {

class ReshardCommand : public Command {
 public:
  void add_to(CLI::App& app) override {
    sub_ = app.add_subcommand("reshard", "Rewrite a checkpoint as a DCP folder saved by N ranks (dim-0 sharding)");
    sub_->footer("SRC is a DCP checkpoint folder or a torch.save file; DST is a new folder (it must not\n"
                 "exist, or be empty). DST becomes what a job of N ranks would save with every tensor\n"
                 "sharded on dim 0 the way DTensor's Shard(0) does (ceil division, so the last ranks may\n"
                 "hold empty boxes): files __0_0.distcp .. __{N-1}_0.distcp, a .metadata PyTorch >= 2.0\n"
                 "loads, and shardpoint's checksum sidecar. 0-dim tensors, and tensors a sharded DCP\n"
                 "source stored whole as one chunk (replicated tensors), are written whole once; objects\n"
                 "are kept with their nesting. `--ranks 1` with a torch.save SRC converts torch.save to\n"
                 "DCP. Keys and values are unchanged: `shardpoint inspect --json --hash` shows the same\n"
                 "tensors before and after.\n"
                 "\n"
                 "--compression zstd stores each item as one zstd frame, recorded as PyTorch's ZStandard\n"
                 "extension records it (transform \"stream.zstd/1\"): PyTorch >= 2.7 with the zstandard\n"
                 "module reads it back. A zstd SRC is read whatever the option.\n"
                 "\n"
                 "SRC and DST may be storage URLs (DST: an empty prefix). A SRC URL is a DCP checkpoint\n"
                 "when <SRC>/.metadata exists, else a torch.save file when its last segment is an\n"
                 "object; otherwise it is refused as not a committed checkpoint.\n\n" +
                 std::string(storage_url_help()) +
                 "\n"
                 "Commit: the data files first, then the checksum sidecar, then .metadata in one atomic\n"
                 "write (on object stores one PUT), so an interrupted reshard leaves no checkpoint that\n"
                 "a loader would accept; delete DST and run it again.\n"
                 "\n"
                 "Lightning: a SRC folder with Lightning's meta.pt (trainer state) gets it in DST too,\n"
                 "byte for byte (checked by its zip CRC-32s first) and written after .metadata, so\n"
                 "DST is a sharded checkpoint Lightning resumes from (FSDPStrategy or\n"
                 "ModelParallelStrategy) at any world size.\n"
                 "\n"
                 "Checks: SRC is verified as it is read, by its checksum sidecar or, without one, by\n"
                 "the zip CRC-32 of every record read whole (every record of a torch.save SRC). A\n"
                 "mismatch fails the reshard with one line naming file, record, key and byte range, and\n"
                 "leaves no output. A record read only in part (a tensor that views part of its\n"
                 "storage) cannot be checked: the summary says how many. --no-zip-crc skips the zip\n"
                 "CRC-32s, --no-verify-checksums every check.\n"
                 "\n"
                 "Memory: streams, whatever the checkpoint's size. Each file being written\n"
                 "(--parallel-files, default 4) reads its items from SRC in slabs of --memory-budget-bytes\n"
                 "/ --parallel-files bytes and appends them as they arrive; SRC is read with pread or\n"
                 "ranged GETs, never mapped. Peak\n"
                 "RSS is about the budget plus the output driver's staging buffers (64 MiB; object\n"
                 "stores: their multipart part buffers), an object-store SRC's read cache (S3: 64 MiB\n"
                 "per file being read), the objects and the .metadata.\n"
                 "\n"
                 "Exit status: 0 done, 1 failure (unreadable SRC, I/O or authentication error), 2 usage\n"
                 "error.");
    sub_->add_option("SRC", src_, "checkpoint to read: DCP folder or torch.save file (path or URL)")->required();
    sub_->add_option("DST", dst_, "new DCP folder to write (path or URL)")->required();
    sub_->add_option("--ranks", ranks_, "number of ranks to write as (files __0_0 .. __{N-1}_0)")
        ->required()
        ->check(CLI::Range(1, 65536));
    // Each option's name is its name in ReshardOptions, the C API and Python (the older
    // spellings after it are kept for scripts).
    sub_->add_option(
            "--thread-count,--threads", options_.save.thread_count,
            fmt::format(
                "files written in parallel per rank (DCP's thread_count; default {}, at least 4 on object stores)",
                options_.save.thread_count))
        ->check(CLI::Range(1, 64));
    sub_->add_option("--memory-budget-bytes,--memory-budget", budget_,
                     fmt::format("tensor bytes held at once while copying, e.g. 1GiB (default {})",
                                 human_bytes(options_.memory_budget_bytes)));
    sub_->add_option("--parallel-files,--parallel", options_.parallel_files, "files written at once (default 4)")
        ->check(CLI::Range(1, 256));
    sub_->add_flag("--no-verify-checksums,--no-verify", no_verify_,
                   "do not verify the source's checksums (sidecar, or zip CRC-32s) while reading");
    sub_->add_flag("--no-zip-crc", no_zip_crc_,
                   "do not check the zip CRC-32s of source records no checksum sidecar covers");
    sub_->add_flag("--no-direct-io", no_direct_, "write through the page cache instead of O_DIRECT");
    sub_->add_option("--compression,--compress", compression_,
                     "store every item compressed: none (default) or zstd (PyTorch's ZStandard extension)");
    sub_->add_option("--compression-level,--compress-level", options_.save.compression_level,
                     fmt::format("zstd level (default {}, as PyTorch)", options_.save.compression_level))
        ->check(CLI::Range(1, 19));
    sub_->add_flag("--quiet,-q", quiet_, "print nothing on success");
  }
  bool parsed() const override { return sub_->parsed(); }

  int run() override {
    engine::ReshardOptions options = options_;
    if (!budget_.empty()) options.memory_budget_bytes = parse_size(budget_);
    if (options.memory_budget_bytes < (std::uint64_t{1} << 20))
      throw UsageError("--memory-budget-bytes must be at least 1MiB");
    const Location src = Location::parse(src_);
    const Location dst = Location::parse(dst_);
    const bool remote_dst = dst.is_remote();
    bool created_dst = false;  // a failed reshard removes the DST folder it created
    if (!remote_dst) {
      std::error_code ec;
      created_dst = !std::filesystem::exists(dst_, ec) && !ec;
      if (std::filesystem::exists(dst_, ec)) {
        if (!std::filesystem::is_directory(dst_, ec))
          throw Error("reshard: DST " + dst_ + " exists and is not a folder");
        if (!std::filesystem::is_empty(dst_, ec)) throw Error("reshard: DST " + dst_ + " exists and is not empty");
      }
      if (!src.is_remote() && std::filesystem::equivalent(src_, dst_, ec)) {
        throw Error("reshard: SRC and DST are the same path");
      }
    }
    if (src_ == dst_) throw Error("reshard: SRC and DST are the same location");
    auto destination = storage::open_storage(dst);
    if (remote_dst && !destination->list("").empty()) {
      throw Error("reshard: DST " + dst_ + " is not empty (objects under the prefix)");
    }
    options.ranks = ranks_;
    options.verify_checksums = !no_verify_;
    options.check_zip_crc = !no_zip_crc_;
    options.save.direct_io = !no_direct_;
    if (!compression_.empty()) options.save.compression = engine::compression_from_name(compression_, "--compression");
    engine::ReshardReport report;
    try {
      report = engine::reshard(src, *destination, options);
    } catch (...) {
      // reshard() removed its files; the folder goes too when it is empty (a file it could
      // not remove, after a lost permission, keeps it). Best effort: its error is the one.
      std::error_code ignored;
      if (created_dst) std::filesystem::remove(dst_, ignored);
      throw;
    }
    if (!quiet_) {
      print_out(fmt::format("{}: {} tensors ({}), {} objects from {} checkpoint {} written as {} ranks in {:.2f} s\n",
                            dst_, report.tensors, human_bytes(report.payload_bytes), report.objects,
                            engine::checkpoint_kind_name(report.source_format), src_, ranks_, report.seconds));
      if (report.meta_pt_bytes > 0) {
        print_out(fmt::format("{}: Lightning's meta.pt carried ({})\n", dst_, human_bytes(report.meta_pt_bytes)));
      }
      if (const std::string crc = zip_crc_text(report.zip_crc); !crc.empty()) print_out(src_ + ": " + crc + "\n");
    }
    return 0;
  }

 private:
  CLI::App* sub_ = nullptr;
  std::string src_, dst_;
  int ranks_ = 1;
  engine::ReshardOptions options_;  // the engine's defaults, with the flags given
  std::string budget_;              // "": the engine's default
  bool no_verify_ = false;
  bool no_zip_crc_ = false;
  bool no_direct_ = false;
  std::string compression_;  // "": the engine's default
  bool quiet_ = false;
};

}  // namespace

std::unique_ptr<Command> make_reshard_command() { return std::make_unique<ReshardCommand>(); }

}  // namespace shardpoint::cli
