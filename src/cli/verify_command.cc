// `shardpoint verify PATH [--quick] [--json]`: prints what engine::verify() reports about a
// checkpoint (shardpoint/verify.h says what is checked). PATH is a local path or a storage URL.
// Exit 0 when clean (a one-line summary on stdout, or the JSON report); otherwise one line
// per problem on stdout (or the JSON report), a count on stderr, and exit 1.
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/checkpoint_listing.h"
#include "cli/commands.h"
#include "engine/block_checksum.h"
#include "shardpoint/location.h"
#include "shardpoint/reshard.h"
#include "shardpoint/verify.h"

namespace shardpoint::cli {
namespace {

// The summary line of a clean report. "verified" only for bytes a checksum covered.
std::string summary_line(const engine::VerifyReport& r) {
  std::string out = "ok: " + std::to_string(r.tensors) + " tensors, " + std::to_string(r.objects) + " objects";
  if (r.quick) return out + ": structure only (--quick: no tensor data read, no checksum checked)\n";
  if (r.verified_bytes == r.bytes) return out + ", " + std::to_string(r.bytes) + " bytes verified\n";
  return out + ", " + std::to_string(r.bytes) + " bytes read: " + std::to_string(r.verified_bytes) +
         " verified by a checksum, " + std::to_string(r.bytes - r.verified_bytes) +
         " with no checksum (read and parsed only)\n";
}

nlohmann::json coverage_json(const engine::VerifyCoverage& c) {
  nlohmann::json j;
  j["name"] = c.name;
  j["format"] = std::string(engine::checkpoint_kind_name(c.kind));
  j["structure_bytes"] = c.bytes;
  j["records"] = c.records;
  j["record_bytes"] = c.record_bytes;
  if (c.quick) {
    j["zip_crc32"] = nullptr;
  } else {
    j["zip_crc32"] = {{"records", c.zip_crc32_records},
                      {"bytes", c.zip_crc32_bytes},
                      {"no_checksum_records", c.no_checksum_records},
                      {"no_checksum_bytes", c.no_checksum_bytes}};
  }
  if (c.sidecar == engine::ChecksumAlgorithm::kNone) {
    j["sidecar"] = nullptr;
  } else {
    j["sidecar"] = {{"algorithm", std::string(engine::checksum_algorithm_name(c.sidecar))},
                    {"block_size", c.sidecar_block_size},
                    {"bytes", c.sidecar_bytes}};
  }
  return j;
}

class VerifyCommand : public Command {
 public:
  void add_to(CLI::App& app) override {
    sub_ = app.add_subcommand("verify", "Check that a checkpoint is complete and intact (reads all data)");
    sub_->footer("PATH is a DCP checkpoint folder or a torch.save file, or a storage URL of either: a\n"
                 "URL is a DCP checkpoint when <PATH>/.metadata exists, else a torch.save file when its\n"
                 "last segment is an object; a prefix with neither is refused (\"not a committed\n"
                 "checkpoint\", exit 1). Every byte is read (ranged reads on object stores) and\n"
                 "checked against the checksum sidecar where there is one and against the zip CRC-32\n"
                 "of every record of every torch.save archive (each .distcp item, meta.pt); a load\n"
                 "index (.shardpoint-index) must match .metadata and agree with it, the sidecar and\n"
                 "the blobs. Bytes no checksum covered (a record whose writer stored no CRC-32) are\n"
                 "counted as read, never as verified. --quick checks the structure only.\n\n" +
                 std::string(storage_url_help()) +
                 "\n"
                 "--json prints one object: path, format, ok, quick, tensors, objects, bytes,\n"
                 "verified_bytes, problems [{file, item, message}], and checks [{name, format,\n"
                 "structure_bytes, records, record_bytes, zip_crc32 {records, bytes,\n"
                 "no_checksum_records, no_checksum_bytes} or null, sidecar {algorithm, block_size,\n"
                 "bytes} or null}].\n\n"
                 "Exit 0 when clean; otherwise one line per problem and exit 1 (also when PATH cannot\n"
                 "be read, e.g. an authentication error).");
    sub_->add_option("PATH", path_, "checkpoint folder or file (path or URL)")->required();
    sub_->add_flag("--quick", quick_, "check the structure only: no tensor data read, no checksum checked");
    sub_->add_flag("--json", json_, "print the report as one JSON object");
  }
  bool parsed() const override { return sub_->parsed(); }

  int run() override {
    const Location where = Location::parse(path_);
    const bool remote = where.is_remote();
    engine::VerifyOptions options;
    options.quick = quick_;
    engine::VerifyReport report = engine::verify(where, options);
    // Problems inside a remote checkpoint name its URL ("s3://b/ckpt: __1_0.distcp: ...").
    for (auto& p : report.problems) {
      if (remote && p.message.find(path_) == std::string::npos) p.message = path_ + ": " + p.message;
    }
    if (json_) {
      print_out(to_json(report).dump(2) + "\n");
    } else if (report.ok()) {
      print_out(summary_line(report));
    } else {
      std::string out;
      for (const auto& p : report.problems) out += p.message + "\n";
      print_out(out);
    }
    if (report.ok()) return 0;
    std::cerr << "shardpoint: " << path_ << ": " << report.problems.size() << " problem"
              << (report.problems.size() == 1 ? "" : "s") << " found\n";
    return 1;
  }

 private:
  static nlohmann::json to_json(const engine::VerifyReport& r) {
    nlohmann::json j;
    j["path"] = r.name;
    j["format"] = std::string(engine::checkpoint_kind_name(r.kind));
    j["ok"] = r.ok();
    j["quick"] = r.quick;
    j["tensors"] = r.tensors;
    j["objects"] = r.objects;
    j["bytes"] = r.bytes;
    j["verified_bytes"] = r.verified_bytes;
    j["problems"] = nlohmann::json::array();
    for (const auto& p : r.problems)
      j["problems"].push_back({{"file", p.file}, {"item", p.item}, {"message", p.message}});
    j["checks"] = nlohmann::json::array();
    for (const auto& c : r.coverage) j["checks"].push_back(coverage_json(c));
    return j;
  }

  CLI::App* sub_ = nullptr;
  std::string path_;
  bool quick_ = false;
  bool json_ = false;
};

}  // namespace

std::unique_ptr<Command> make_verify_command() { return std::make_unique<VerifyCommand>(); }

}  // namespace shardpoint::cli
