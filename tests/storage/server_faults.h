// Shared steps of the server-fault tests (s3_, gcs_, azure_faults_test.cc): a driver reads
// through tests/storage/fault_proxy.py while it breaks answers one kind at a time, and must
// get the right bytes back after retries counted under the right cause; when every attempt
// is broken, the error is one line naming the object. Writes whose request bodies the proxy
// damages must be refused by the server, sent again and stored exact, or fail leaving no
// object.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "fault_proxy.h"
#include "shardpoint/error.h"
#include "shardpoint/storage.h"
#include "storage/http/retry_stats.h"

namespace shardpoint::storage::testing {

// A fault kind of fault_proxy.py and the retry causes a client may count for it.
struct FaultCase {
  std::string kind;
  std::vector<http::RetryCause> causes;
};

inline const std::vector<FaultCase>& ranged_get_faults() {
  using C = http::RetryCause;
  static const std::vector<FaultCase> cases = {
      {"overlong", {C::kMalformed}},  // met by the request after it, on the same connection
      {"longbody", {C::kBadRange}},   {"truncate", {C::kTruncated}}, {"short206", {C::kBadRange}},
      {"wrongrange", {C::kBadRange}}, {"garbage", {C::kMalformed}},  {"reset", {C::kConnection, C::kTruncated}},
      {"500", {C::kServerError}},     {"503", {C::kThrottled}},      {"429", {C::kThrottled}},
      {"slow", {C::kTimeout}},
  };
  return cases;
}

// Deterministic bytes that differ at every offset of interest.
inline std::string pattern_bytes(std::size_t n, std::uint32_t seed) {
  std::string s(n, '\0');
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& c : s) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

// What a fault walk saw: faults the proxy injected by kind, retries the client counted.
struct FaultTally {
  std::map<std::string, int> injected;
  http::RetryCounts retries;
};

inline std::string describe_tally(const FaultTally& t) {
  std::string out = "faults injected:";
  for (const auto& [kind, n] : t.injected) out += " " + kind + "=" + std::to_string(n);
  return out + "; " + http::describe_retry_counts(t.retries);
}

// Writes `key` (1 MiB + 37 bytes, no faults), then for each kind of ranged_get_faults():
// faults the first ranged GET with it and reads two ranges, which must equal what was
// written, with a retry counted under one of the kind's causes. `storage` must retry at least
// twice with a low-speed limit shorter than the proxy's slow answers.
inline FaultTally read_through_every_fault(Storage& storage, FaultProxy& proxy, const std::string& key) {
  const std::string data = pattern_bytes((std::size_t{1} << 20) + 37, 7);
  proxy.set_faults("");
  storage.write_atomic(key, as_bytes(data));
  FaultTally tally;
  const http::RetryCounts start = http::retry_counts();
  for (const FaultCase& c : ranged_get_faults()) {
    SCOPED_TRACE("fault " + c.kind);
    proxy.set_faults("RGET 1 1 " + c.kind);
    const http::RetryCounts before = http::retry_counts();
    for (auto [offset, length] : {std::pair<std::size_t, std::size_t>{12345, 300000}, {700001, 200000}}) {
      std::string got(length, '\0');
      storage.read(key, offset, std::as_writable_bytes(std::span(got)));
      EXPECT_TRUE(got == data.substr(offset, length)) << "bytes differ at offset " << offset;
    }
    const http::RetryCounts added = http::retry_counts_since(before, http::retry_counts());
    std::uint64_t expected = 0;
    for (http::RetryCause cause : c.causes) expected += added[cause];
    EXPECT_GE(expected, 1u) << http::describe_retry_counts(added);
    EXPECT_EQ(added.exhausted, 0u);
    const std::map<std::string, int> faults = proxy.faults();
    EXPECT_EQ(faults.count(c.kind) ? faults.at(c.kind) : 0, 1);
    for (const auto& [kind, n] : faults) tally.injected[kind] += n;
  }
  tally.retries = http::retry_counts_since(start, http::retry_counts());
  std::cout << "[fault walk] " << describe_tally(tally) << "\n";
  return tally;
}

// Every ranged GET of `key` (written here) broken with `kind`: the read fails with one line
// that names the object, says what broke and how many retries were made.
inline void expect_exhausted_read_names_object(Storage& storage, FaultProxy& proxy, const std::string& key,
                                               const std::string& kind, const std::string& expected_text) {
  SCOPED_TRACE("fault " + kind + " on every attempt");
  proxy.set_faults("");
  const std::string data = pattern_bytes(1000, 3);
  storage.write_atomic(key, as_bytes(data));
  proxy.set_faults("RGET 1 0 " + kind);
  std::string got(100, '\0');
  const http::RetryCounts before = http::retry_counts();
  try {
    storage.read(key, 10, std::as_writable_bytes(std::span(got)));
    ADD_FAILURE() << "read succeeded although every attempt was broken";
  } catch (const StorageError& e) {
    const std::string msg = e.what();
    std::cout << "[exhausted " << kind << "] " << msg << "\n";
    EXPECT_NE(msg.find(storage.describe_key(key)), std::string::npos) << msg;
    EXPECT_NE(msg.find(expected_text), std::string::npos) << msg;
    EXPECT_NE(msg.find("retries"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_TRUE(e.retryable()) << msg;
  }
  EXPECT_EQ(http::retry_counts_since(before, http::retry_counts()).exhausted, 1u);
  proxy.set_faults("");
}

// Writes data to key: through a writer (parts, blocks or chunks when data is larger than
// one), or with write_atomic() (one request) when `atomic`.
inline void write_object(Storage& storage, const std::string& key, const std::string& data, bool atomic) {
  if (atomic) {
    storage.write_atomic(key, as_bytes(data));
    return;
  }
  auto writer = storage.open_writer(key);
  writer->append(as_bytes(data));
  writer->commit();
}

// Writes data to key through the proxy, whose schedule damages `damaged` request bodies:
// each is refused by the server and sent again (a retry counted as a body checksum
// mismatch), and `direct` (the server itself) reads back exactly data.
inline void expect_damaged_bodies_sent_again(Storage& storage, Storage& direct, FaultProxy& proxy,
                                             const std::string& key, const std::string& data, bool atomic,
                                             const std::string& schedule, int damaged) {
  SCOPED_TRACE(key + " with " + schedule);
  proxy.set_faults(schedule);
  const http::RetryCounts before = http::retry_counts();
  write_object(storage, key, data, atomic);
  const http::RetryCounts added = http::retry_counts_since(before, http::retry_counts());
  std::cout << "[damaged bodies " << key << "] " << describe_tally({proxy.faults(), added}) << "\n";
  EXPECT_EQ(proxy.faults(), (std::map<std::string, int>{{"damagebody", damaged}}));
  EXPECT_EQ(added[http::RetryCause::kBodyChecksum], static_cast<std::uint64_t>(damaged));
  EXPECT_EQ(added.exhausted, 0u);
  proxy.set_faults("");
  std::string got(data.size(), '\0');
  direct.read(key, 0, std::as_writable_bytes(std::span(got)));
  EXPECT_TRUE(got == data) << "the object differs from the bytes written";
}

// Writes data to key through the proxy while its schedule breaks some request on every
// attempt: the write fails with one line naming the object and containing expected_text
// and retries ("3 retries"), a retryable error, and `direct` finds no object at the key.
inline void expect_failed_write_leaves_nothing(Storage& storage, Storage& direct, FaultProxy& proxy,
                                               const std::string& key, const std::string& data, bool atomic,
                                               const std::string& schedule, const std::string& expected_text,
                                               const std::string& retries) {
  SCOPED_TRACE(key + " with " + schedule);
  proxy.set_faults(schedule);
  const http::RetryCounts before = http::retry_counts();
  try {
    write_object(storage, key, data, atomic);
    ADD_FAILURE() << "the write succeeded although every attempt was broken";
  } catch (const StorageError& e) {
    const std::string msg = e.what();
    std::cout << "[write exhausted " << key << "] " << msg << "\n";
    EXPECT_NE(msg.find(storage.describe_key(key)), std::string::npos) << msg;
    EXPECT_NE(msg.find(expected_text), std::string::npos) << msg;
    EXPECT_NE(msg.find(retries + ")"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_TRUE(e.retryable()) << msg;
  }
  const http::RetryCounts added = http::retry_counts_since(before, http::retry_counts());
  std::cout << "[write exhausted " << key << "] " << describe_tally({proxy.faults(), added}) << "\n";
  EXPECT_GE(added.exhausted, 1u);
  proxy.set_faults("");
  EXPECT_FALSE(direct.try_stat(key)) << "an object exists after the failed write";
}

}  // namespace shardpoint::storage::testing
