// Wire forms of what save()/load() exchange between ranks: save plans (gathered and
// scattered), write results (gathered), and a framing of several byte strings into one
// message. JSON (nlohmann) for plans and results: small, readable in a debugger, and only
// ever read by the same build (never persisted).
//
// Thread-safety: reentrant.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/item_writer.h"
#include "engine/save_plan.h"

namespace shardpoint::engine {

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
