// Wire forms of what save()/load() exchange between ranks: the status byte that starts
// every message, save plans (gathered and scattered), write results (gathered), and a
// framing of several byte strings into one message. JSON (nlohmann) for plans and results:
// small, readable in a debugger, and only ever read by the same build (never persisted).
//
// Thread-safety: reentrant.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/item_writer.h"
#include "engine/save_plan.h"

namespace shardpoint::engine {

// The first byte of every message ranks exchange in save() and load() (steps: checkpoint.cc, checkpoint_load.cc):
// what the body is on success, or kError. Every step checks for the status it expects and
// treats anything else as that rank's failure, so a failure reaches every rank inside the
// step's own messages. Only ranks of one job read these bytes, but existing values must
// never change: ranks of builds that disagree would misread each other's failures.
enum class RankStatus : char {
  kPlan = 'P',         // save steps 1-2: a save plan; load step 4: this rank's block pieces
  kWriteResult = 'R',  // save step 3: the written items (encode_written_items)
  kMetadata = 'M',     // load step 1: what every rank needs (pack_parts)
  kError = 'E',        // comm::encode_error form: this rank (from the coordinator: the job) failed
};

// A message split into its status byte and the rest.
struct RankMessage {
  std::optional<RankStatus> status;  // nullopt: empty message or a byte no RankStatus has
  std::string_view body;             // the bytes after the status byte (empty if none)
};

// `status`'s byte followed by `body`.
std::string encode_rank_message(RankStatus status, std::string_view body = {});
// Never throws. The body views `message`, which must outlive it.
RankMessage decode_rank_message(std::string_view message);

std::string encode_save_plan(const SavePlan& plan);
// Throws FormatError naming `what` on malformed input.
SavePlan decode_save_plan(std::string_view bytes, std::string_view what);

std::string encode_written_items(const std::vector<WrittenItem>& items);
std::vector<WrittenItem> decode_written_items(std::string_view bytes, std::string_view what);

// Length-prefixed concatenation (8-byte little-endian length before each part).
std::string pack_parts(const std::vector<std::string>& parts);
// Throws FormatError naming `what` on truncated input.
std::vector<std::string> unpack_parts(std::string_view bytes, std::string_view what);

}  // namespace shardpoint::engine
