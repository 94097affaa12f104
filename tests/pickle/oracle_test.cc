// Interop with CPython (Debian's /usr/bin/python3): tests/pickle/oracle_cases.py writes
// reference pickles of many values at protocols 0-5; we read each, write it back at
// protocols 2 and 4, and Python loads our output and compares it with a fresh value.
// Oracle policy (test_util.h): a missing python3 skips, or fails with
// SHARDPOINT_REQUIRE_ORACLES=1.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>

#include "pickle/reader.h"
#include "pickle/repr.h"
#include "pickle/writer.h"
#include "shardpoint/error.h"
#include "test_util.h"

namespace shardpoint::pickle {
namespace {

using shardpoint::testing::read_text;
using shardpoint::testing::run_command;
using shardpoint::testing::TempDir;
using shardpoint::testing::write_text;

#define SP_REQUIRE_PYTHON(python_var)                                                            \
  std::string python_var = "/usr/bin/python3";                                                   \
  if (run_command(python_var + " -c 'import pickle' 2>/dev/null").exit_code != 0) {              \
    if (::shardpoint::testing::oracles_required()) FAIL() << "oracle missing: /usr/bin/python3"; \
    GTEST_SKIP() << "oracle missing: /usr/bin/python3 (apt-get install python3)";                \
  }

// Runs `oracle_cases.main()` with the script's folder on PYTHONPATH, so its classes pickle
// and load as oracle_cases.<Name>.
shardpoint::testing::CommandResult run_oracle(const std::string& python, const std::string& command,
                                              const TempDir& dir) {
  return run_command("cd '" SP_SOURCE_DIR "/tests/pickle' && PYTHONPATH=. " + python +
                     " -c 'import oracle_cases; oracle_cases.main()' " + command + " '" + dir.path().string() +
                     "' 2>&1");
}

// "<case>.p<N>.pkl" files written by Python, sorted.
std::vector<std::string> reference_pickles(const TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    std::string name = entry.path().filename().string();
    if (name.ends_with(".pkl") && std::count(name.begin(), name.end(), '.') == 2) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string case_of(const std::string& file) { return file.substr(0, file.find('.')); }

ValuePtr read_file(const TempDir& dir, const std::string& name) {
  std::string data = read_text(dir.file(name));
  return read_pickle(as_bytes(data), name);
}

std::string write_protocol(const Value& v, int protocol) {
  WriteOptions options;
  options.protocol = protocol;
  return pickle_to_string(v, options);
}

TEST(PickleOracle, RewrittenPicklesLoadEqualInPython) {
  SP_REQUIRE_PYTHON(python);
  TempDir dir;
  auto written = run_oracle(python, "write", dir);
  ASSERT_EQ(written.exit_code, 0) << written.output;
  auto names = reference_pickles(dir);
  ASSERT_GE(names.size(), 150u);
  for (const auto& name : names) {
    ValuePtr v;
    ASSERT_NO_THROW(v = read_file(dir, name)) << name;
    std::string stem = name.substr(0, name.size() - 4);
    for (int protocol : {2, 4}) {
      write_text(dir.file(stem + ".w" + std::to_string(protocol) + ".pkl"), write_protocol(*v, protocol));
    }
  }
  auto checked = run_oracle(python, "check", dir);
  std::istringstream lines(checked.output);
  std::string line, failures;
  std::size_t ok = 0;
  while (std::getline(lines, line)) {
    if (line.starts_with("OK ")) ++ok;
    if (line.starts_with("FAIL ") || line.find("Error") != std::string::npos) failures += line + "\n";
  }
  EXPECT_EQ(checked.exit_code, 0) << failures << checked.output.substr(0, 2000);
  EXPECT_EQ(failures, "");
  EXPECT_EQ(ok, 2 * names.size());
}

// For most values our protocol 2 and 4 output is byte for byte what CPython writes.
TEST(PickleOracle, ProtocolTwoAndFourBytesMatchCPython) {
  SP_REQUIRE_PYTHON(python);
  TempDir dir;
  auto written = run_oracle(python, "write", dir);
  ASSERT_EQ(written.exit_code, 0) << written.output;
  std::istringstream exact(read_text(dir.file("exact.txt")));
  std::string name;
  int compared = 0;
  while (std::getline(exact, name)) {
    // The tree read from any protocol rewrites to CPython's protocol 2 and 4 bytes.
    for (int protocol : {2, 4})
      for (int source = 0; source <= 5; ++source) {
        std::string file = name + ".p" + std::to_string(protocol) + ".pkl";
        std::string source_file = name + ".p" + std::to_string(source) + ".pkl";
        if (!std::filesystem::exists(dir.file(source_file))) continue;
        // Below protocol 2 CPython builds plain instances with copyreg._reconstructor instead
        // of NEWOBJ: a different tree, which we rewrite faithfully.
        if (read_text(dir.file(source_file)).find("copy_reg\n_reconstructor") != std::string::npos) continue;
        std::string original = read_text(dir.file(file));
        std::string ours = write_protocol(*read_file(dir, source_file), protocol);
        file = source_file + " as protocol " + std::to_string(protocol);
        EXPECT_EQ(ours.size(), original.size()) << file;
        auto diff = std::mismatch(ours.begin(), ours.end(), original.begin(), original.end());
        if (diff.first != ours.end() || diff.second != original.end()) {
          auto at = static_cast<std::size_t>(diff.first - ours.begin());
          std::size_t from = at < 20 ? 0 : at - 20;
          ADD_FAILURE() << file << ": first difference at byte " << at
                        << "\n ours:    " << ::testing::PrintToString(ours.substr(from, 50))
                        << "\n CPython: " << ::testing::PrintToString(original.substr(from, 50));
        }
        ++compared;
      }
  }
  EXPECT_GE(compared, 250);
}

TEST(PickleOracle, ReprMatchesPython) {
  SP_REQUIRE_PYTHON(python);
  TempDir dir;
  auto written = run_oracle(python, "write", dir);
  ASSERT_EQ(written.exit_code, 0) << written.output;
  int compared = 0;
  for (const auto& file : reference_pickles(dir)) {
    std::string repr_file = dir.file(case_of(file) + ".repr");
    if (!std::filesystem::exists(repr_file)) continue;
    EXPECT_EQ(repr(*read_file(dir, file), ReprOptions{.max_chars = 1 << 20}), read_text(repr_file)) << file;
    ++compared;
  }
  EXPECT_GE(compared, 60);
}

// Protocol 2 output uses only what PyTorch 1.13's weights-only unpickler accepts (for
// content it allows: no floats, see writer.h), so torch.load(weights_only=True) can read
// the pickles we write into tensor files.
TEST(PickleOracle, Protocol2LoadsWithTorch113WeightsOnlyUnpickler) {
  SP_REQUIRE_TORCH113(python);
  TempDir dir;
  auto od = Value::call("collections", "OrderedDict", {});
  auto shared = Value::str("shared");
  std::string le_2_70(9, '\0');
  le_2_70[8] = 0x40;
  od->mutable_entries() = {
      {Value::str("a"), Value::list({Value::integer(1), Value::tuple({Value::integer(2), shared})})},
      {Value::str("b"), Value::call("torch", "Size", {Value::tuple({Value::integer(2), Value::integer(3)})})},
      {Value::str("c"), Value::global("torch", "float32")},
      {Value::str("d"), Value::big_integer(le_2_70)},
      {Value::str("e"), Value::dict({{Value::str("n"), Value::none()}, {shared, Value::boolean(true)}})},
      {Value::str("f"), Value::list({Value::integer(-70000), Value::integer(300)})},
      {Value::str("g"), Value::call("torch.serialization", "_get_layout", {Value::str("torch.strided")})},
  };
  write_text(dir.file("w.pkl"), write_protocol(*od, 2));
  auto result = run_command(python +
                            " -c \"import collections, io, torch; "
                            "from torch._weights_only_unpickler import load; "
                            "v = load(open('" +
                            dir.file("w.pkl") +
                            "', 'rb')); "
                            "e = collections.OrderedDict(a=[1, (2, 'shared')], b=torch.Size((2, 3)), "
                            "c=torch.float32, d=2**70, e={'n': None, 'shared': True}, f=[-70000, 300], "
                            "g=torch.strided); "
                            "print('EQUAL' if v == e and type(v) is collections.OrderedDict else v)\" 2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, "EQUAL\n");
}

}  // namespace
}  // namespace shardpoint::pickle
