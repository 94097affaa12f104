// The safetensors header parser: real headers (as PyTorch 2.15 and the safetensors library
// write them) and every kind of hostile input refused with one message naming file and tensor.
#include "format/safetensors_header.h"

#include <gtest/gtest.h>

#include <string>

#include "format/safetensors_writer.h"
#include "shardpoint/error.h"

namespace shardpoint::format {
namespace {

// A whole file: the 8-byte length, the header, `data_bytes` zero bytes of data.
std::string file_with(const std::string& header, std::size_t data_bytes) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

SafetensorsHeader parse_file(const std::string& file) {
  const MemorySource source(as_bytes(file), "m.safetensors");
  return read_safetensors_header(source, 0, "m.safetensors");
}

std::string refusal(const std::string& file) {
  try {
    parse_file(file);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "accepted";
}

// What HuggingFaceStorageWriter put in rank 1's shard of model file 2 (PyTorch 2.15).
const char* kDcpShard =
    R"({"__metadata__":{"DCP_SHARDING_INFO":"{\"b.weight\": {\"saved_offsets\": [3, 0]}, \"c.bias\": {\"saved_offsets\": [2]}}","DCP_VERSION":"1.0","format":"pt"},"b.weight":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"c.bias":{"dtype":"F16","shape":[1],"data_offsets":[12,14]}})";

TEST(SafetensorsHeaderTest, ReadsWhatDcpWrites) {
  const SafetensorsHeader h = parse_file(file_with(kDcpShard, 14));
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0], (SafetensorsTensor{"b.weight", DType::kBFloat16, {2, 3}, 0, 12}));
  EXPECT_EQ(h.tensors[1], (SafetensorsTensor{"c.bias", DType::kFloat16, {1}, 12, 14}));
  EXPECT_EQ(h.data_start(), 8 + std::string(kDcpShard).size());
  EXPECT_EQ(h.metadata.at("DCP_VERSION"), "1.0");
  EXPECT_EQ(h.find("c.bias"), &h.tensors[1]);
  EXPECT_EQ(h.find("nope"), nullptr);
  EXPECT_EQ(dcp_sharding_info(h, "m"), (std::map<std::string, Shape>{{"b.weight", {3, 0}}, {"c.bias", {2}}}));
}

TEST(SafetensorsHeaderTest, ReadsTheWritersOutputAndEmptyTensors) {
  StringSink sink;
  SafetensorsWriter writer(sink,
                           {{"w", DType::kFloat32, {2, 2}}, {"e", DType::kInt64, {0, 3}}, {"s", DType::kBool, {}}});
  writer.write(as_bytes(std::string(17, '\1')));
  writer.finish();
  const SafetensorsHeader h = parse_file(sink.str());
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[1], (SafetensorsTensor{"e", DType::kInt64, {0, 3}, 16, 16}));
  EXPECT_EQ(h.tensors[2], (SafetensorsTensor{"s", DType::kBool, {}, 16, 17}));
  EXPECT_EQ(h.data_start() % 8, 0u);  // the writer pads with spaces
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_TRUE(dcp_sharding_info(h, "m").empty());
}

TEST(SafetensorsHeaderTest, RefusesTruncatedAndLyingLengths) {
  const std::string good = file_with(kDcpShard, 14);
  for (std::size_t n = 0; n < good.size(); ++n) {
    EXPECT_NE(refusal(good.substr(0, n)), "accepted") << n;
  }
  EXPECT_EQ(refusal(std::string("\x10\0\0\0", 4)),
            "m.safetensors: safetensors header: expected an 8-byte length at offset 0, found 4 bytes");
  std::string lying = good;
  lying[0] = static_cast<char>(0xff);
  lying[1] = static_cast<char>(0xff);
  EXPECT_NE(refusal(lying).find("reaches past the end of the file"), std::string::npos) << refusal(lying);
  std::string huge = good;
  huge[7] = static_cast<char>(0x7f);
  EXPECT_NE(refusal(huge).find("m.safetensors: safetensors header length"), std::string::npos);
}

TEST(SafetensorsHeaderTest, RefusesBadEntriesNamingTheTensor) {
  auto one = [](const std::string& entry, std::size_t data) {
    return refusal(file_with("{\"t\":" + entry + "}", data));
  };
  EXPECT_EQ(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 4),
            "m.safetensors: tensor \"t\": data_offsets [0, 8] outside the data (4 bytes)");
  EXPECT_EQ(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})", 8),
            "m.safetensors: tensor \"t\": float32 [3] needs 12 bytes, data_offsets hold 8");
  EXPECT_EQ(one(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})", 8),
            "m.safetensors: tensor \"t\": data_offsets [8, 0] outside the data (8 bytes)");
  EXPECT_EQ(one(R"({"dtype":"X9","shape":[2],"data_offsets":[0,8]})", 8),
            "m.safetensors: tensor \"t\": unknown dtype \"X9\"");
  EXPECT_EQ(one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", 8),
            "m.safetensors: tensor \"t\": shape [-2]: expected non-negative integers");
  EXPECT_EQ(one(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})", 8),
            "m.safetensors: tensor \"t\": shape [2.5]: expected non-negative integers");
  EXPECT_EQ(
      one(R"({"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]})", 8),
      "m.safetensors: tensor \"t\": float32 [4294967296, 4294967296, 16] needs more than 2^64 bytes, data_offsets "
      "hold 8");
  EXPECT_EQ(one(R"({"dtype":"F32","shape":[2]})", 8),
            "m.safetensors: tensor \"t\": expected \"data_offsets\" [begin, end] of non-negative integers");
  EXPECT_EQ(one("[1]", 8), "m.safetensors: tensor \"t\": expected an object, found array");
}

TEST(SafetensorsHeaderTest, RefusesOverlapsAndBadJson) {
  EXPECT_EQ(refusal(file_with(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                              R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                              4)),
            "m.safetensors: tensor \"b\": data_offsets [2, 4] overlap tensor \"a\" [0, 4]");
  EXPECT_NE(refusal(file_with("{\"a\": ", 0)).find("m.safetensors: safetensors header: not valid JSON"),
            std::string::npos);
  EXPECT_EQ(refusal(file_with("[1]", 0)),
            "m.safetensors: safetensors header: expected a JSON object starting with '{'");
  // A JSON bomb: nesting is refused while parsing, long before memory runs out.
  const std::string deep = "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_EQ(refusal(file_with(deep, 0)), "m.safetensors: safetensors header: JSON nested deeper than 3 levels");
  EXPECT_EQ(refusal(file_with(R"({"__metadata__":{"k":1}})", 0)),
            "m.safetensors: safetensors header: __metadata__ \"k\": expected a string");
}

TEST(SafetensorsHeaderTest, RefusesBadShardingInfo) {
  auto info = [](const std::string& json) {
    std::string escaped;
    for (char c : json) escaped += c == '"' ? std::string("\\\"") : std::string(1, c);
    const std::string header = "{\"__metadata__\":{\"DCP_SHARDING_INFO\":\"" + escaped +
                               "\"},\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}";
    try {
      dcp_sharding_info(parse_file(file_with(header, 2)), "m");
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(info(R"({"t": {"saved_offsets": [4]}})"), "accepted");
  EXPECT_EQ(info(R"({"u": {"saved_offsets": [4]}})"),
            "m: __metadata__ \"DCP_SHARDING_INFO\": names tensor \"u\", which the header lacks");
  EXPECT_EQ(info(R"({"t": {"saved_offsets": [4, 0]}})"),
            "m: __metadata__ \"DCP_SHARDING_INFO\": tensor \"t\": expected \"saved_offsets\" with 1 entries");
  EXPECT_EQ(info(R"({"t": {"saved_offsets": [-1]}})"),
            "m: __metadata__ \"DCP_SHARDING_INFO\": tensor \"t\": saved_offsets [-1]: expected non-negative integers");
}

}  // namespace
}  // namespace shardpoint::format
