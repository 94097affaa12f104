// `shardpoint inspect PATH [--json] [--hash]`: what a checkpoint holds.
//
// Keys follow PyTorch DCP's flattening (>= 2.4): mappings are descended with their keys
// as they are, lists (and tuples) are descended by position when they hold a tensor or a
// mapping; anything else is one object shown by its Python-like repr. So the same state
// gives the same keys whether it sits in a torch.save file or a DCP folder.
// Deviation from DCP: DCP keeps a tuple as one pickled object; we descend tuples that
// hold tensors so every tensor gets a key (and a hash).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/checkpoint_listing.h"
#include "cli/commands.h"
#include "cli/output.h"

namespace shardpoint::cli {
namespace {

class InspectCommand : public Command {
 public:
  void add_to(CLI::App& app) override {
    sub_ = app.add_subcommand("inspect", "Show the keys, tensors and objects of a checkpoint");
    sub_->footer("PATH is a torch.save file (.pt/.ckpt/meta.pt) or a DCP checkpoint folder.\n"
                 "Human output lists every key with dtype, shape and size of tensors and the repr of\n"
                 "other values. --json prints one object:\n"
                 "  {\"format\": \"torch\"|\"dcp\", \"tensors\": {KEY: {\"dtype\", \"shape\"[, \"sha256\"]}},\n"
                 "   \"objects\": {KEY: REPR}}\n"
                 "--hash adds the SHA-256 of each tensor's elements in row-major order, little-endian,\n"
                 "so the same tensor hashes the same whatever its strides, sharding or file. The zip\n"
                 "CRC-32 of every record read is checked on the way where no checksum sidecar covers\n"
                 "it (a torch.save file, a DCP folder PyTorch wrote): a mismatch is an error naming\n"
                 "file, record, key and byte range; the human listing ends with what was checked.\n"
                 "--no-zip-crc skips that.");
    sub_->add_option("PATH", path_, "checkpoint file or folder")->required();
    sub_->add_flag("--json", json_, "print one JSON object instead of the human listing");
    sub_->add_flag("--hash", hash_, "include the SHA-256 of every tensor (reads all data)");
    sub_->add_flag("--no-zip-crc", no_zip_crc_, "do not check the zip CRC-32s of what is read");
  }
  bool parsed() const override { return sub_->parsed(); }

  int run() override {
    auto listing = open_listing(Location::parse(path_), !no_zip_crc_);
    if (json_) {
      print_out(listing_to_json(*listing, hash_).dump(2) + "\n");
    } else {
      print_out(listing_to_text(*listing, hash_));
    }
    return 0;
  }

 private:
  CLI::App* sub_ = nullptr;
  std::string path_;
  bool json_ = false;
  bool hash_ = false;
  bool no_zip_crc_ = false;
};

}  // namespace

std::unique_ptr<Command> make_inspect_command() { return std::make_unique<InspectCommand>(); }

}  // namespace shardpoint::cli
