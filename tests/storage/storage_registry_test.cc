// URL dispatch: every built-in scheme resolves, unknown ones are UsageErrors naming the URL.
#include "shardpoint/storage_registry.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "shardpoint/error.h"
#include "shardpoint/storage.h"
#include "test_util.h"

namespace shardpoint::storage {
namespace {

TEST(StorageRegistryTest, EveryBuiltinSchemeResolves) {
  shardpoint::testing::TempDir dir;
  auto plain = open_storage(dir.path().string());
  EXPECT_EQ(plain->url(), "file://" + dir.path().string());
  EXPECT_TRUE(plain->features().local_path);

  auto file = open_storage("file://" + dir.path().string());
  EXPECT_EQ(file->url(), "file://" + dir.path().string());
  auto upper = open_storage("FILE://" + dir.path().string());
  EXPECT_EQ(upper->url(), "file://" + dir.path().string());

  auto memory = open_storage("memory://registry-test");
  EXPECT_EQ(memory->url(), "memory://registry-test");
  EXPECT_FALSE(memory->features().local_path);

  // url() round-trips through open_storage.
  plain->write_atomic("k", as_bytes(std::string_view("v")));
  EXPECT_EQ(open_storage(plain->url())->stat("k"), 1u);
  memory->write_atomic("k", as_bytes(std::string_view("vv")));
  EXPECT_EQ(open_storage(memory->url())->stat("k"), 2u);

  std::vector<std::string> schemes = registered_storage_schemes();
  EXPECT_NE(std::find(schemes.begin(), schemes.end(), "file"), schemes.end());
  EXPECT_NE(std::find(schemes.begin(), schemes.end(), "memory"), schemes.end());
}

TEST(StorageRegistryTest, RelativePathIsLocal) {
  auto s = open_storage("some/relative/dir");
  EXPECT_TRUE(s->url().starts_with("file:///"));
  EXPECT_TRUE(s->url().ends_with("/some/relative/dir"));
}

TEST(StorageRegistryTest, UnknownSchemeNamesUrlAndAcceptedSchemes) {
  try {
    open_storage("nosuch://bucket/prefix");
    FAIL();
  } catch (const UsageError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("nosuch://bucket/prefix"), std::string::npos) << msg;
    EXPECT_NE(msg.find("file://"), std::string::npos) << msg;
    EXPECT_NE(msg.find("memory://"), std::string::npos) << msg;
  }
  EXPECT_THROW(open_storage(""), UsageError);
}

Location g_opened;  // what open_nothing was given last

std::unique_ptr<Storage> open_nothing(const Location& location, const StorageOptions&) {
  g_opened = location;
  return nullptr;
}
std::unique_ptr<Storage> open_nothing_else(const Location&, const StorageOptions&) { return nullptr; }

TEST(StorageRegistryTest, RegistrationIsIdempotentAndConflictsAreErrors) {
  register_storage_scheme("test-scheme", &open_nothing);
  register_storage_scheme("test-scheme", &open_nothing);
  EXPECT_THROW(register_storage_scheme("test-scheme", &open_nothing_else), UsageError);
  EXPECT_EQ(open_storage("test-scheme://x"), nullptr);
}

TEST(StorageRegistryTest, DriversGetTheParsedLocation) {
  register_storage_scheme("test-scheme", &open_nothing);
  EXPECT_EQ(open_storage("Test-Scheme://bucket//p/q/?k=v"), nullptr);
  EXPECT_EQ(g_opened.scheme(), Scheme::kOther);
  EXPECT_EQ(g_opened.scheme_name(), "test-scheme");
  EXPECT_EQ(g_opened.authority(), "bucket");
  EXPECT_EQ(g_opened.path(), "p/q");
  EXPECT_EQ(g_opened.query_options(), (std::vector<std::pair<std::string, std::string>>{{"k", "v"}}));
  EXPECT_EQ(g_opened.text(), "Test-Scheme://bucket//p/q/?k=v");
  EXPECT_TRUE(g_opened.dropped_segments());
  EXPECT_EQ(open_storage(Location::parse("test-scheme://b2")), nullptr);
  EXPECT_EQ(g_opened.authority(), "b2");
}

}  // namespace
}  // namespace shardpoint::storage
