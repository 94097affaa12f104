#include "core/byte_stream.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace shardpoint {
namespace {

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string(name) + std::to_string(::getpid()))).string();
}

TEST(ByteStream, FileSinkThenSourcesAgree) {
  std::string path = temp_path("sp_byte_stream_");
  std::string payload;
  for (int i = 0; i < 300000; ++i) payload.push_back(static_cast<char>(i * 13));
  {
    UniqueFd fd = UniqueFd::open(path, O_WRONLY | O_CREAT | O_TRUNC);
    FileSink sink(fd, 0, 4096);
    sink.write(std::string_view(payload).substr(0, 100));
    sink.write(std::string_view(payload).substr(100));  // larger than the buffer: direct
    EXPECT_EQ(sink.position(), payload.size());
    sink.flush();
    fd.close();
  }
  auto file = FileSource::open(path);
  auto mapped = MappedSource::open(path);
  ASSERT_EQ(file->size(), payload.size());
  EXPECT_EQ(file->read_string(1000, 50, "x"), payload.substr(1000, 50));
  auto window = mapped->window(500, 1000, "w");
  EXPECT_EQ(window->read_string(10, 5, "x"), payload.substr(510, 5));
  auto view = window->view(0, 1000, "v");
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(as_chars(*view), payload.substr(500, 1000));
  EXPECT_THROW(window->read_string(999, 2, "past end"), FormatError);
  EXPECT_THROW(file->read_string(payload.size(), 1, "past end"), FormatError);
  std::filesystem::remove(path);
}

TEST(ByteStream, MissingFileIsNotFound) {
  try {
    FileSource::open("/nonexistent/shardpoint/file");
    FAIL();
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/shardpoint/file"), std::string::npos);
  }
}

}  // namespace
}  // namespace shardpoint
