// Proves the PyTorch 2.6 oracle works: a 2-rank gloo DCP save + load through
// scripts/oracle-python, writing into a host temporary directory.
#include <filesystem>
#include <string>

#include "test_util.h"

namespace shardpoint::testing {
namespace {

TEST(OracleTest, RunnerSeesHostPathsAndPassesExitCode) {
  SP_REQUIRE_TORCH26(python);
  TempDir dir;
  write_text(dir.file("in.txt"), "from the host");
  const std::string script = "import sys; open(sys.argv[2], 'w').write(open(sys.argv[1]).read().upper()); sys.exit(5)";
  CommandResult r =
      run_command(python + " -c \"" + script + "\" " + dir.file("in.txt") + " " + dir.file("out.txt") + " 2>&1");
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_EQ(read_text(dir.file("out.txt")), "FROM THE HOST");
}

TEST(OracleTest, TwoRankGlooDcpSaveAndLoad) {
  SP_REQUIRE_TORCH26(python);
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  CommandResult r = run_command(python + " " SP_SOURCE_DIR "/tests/oracle/dcp_smoke.py " + ckpt + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("dcp smoke ok: torch 2.6"), std::string::npos) << r.output;
  for (const char* name : {".metadata", "__0_0.distcp", "__1_0.distcp"}) {
    EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::path(ckpt) / name)) << name;
  }
}

}  // namespace
}  // namespace shardpoint::testing
