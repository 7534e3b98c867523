// What a user meets first, on the CPU side: the log's "[dev]" field, and the launcher's list of
// variables, which must stay the library's (tools/zerocta-run warns about unknown ZEROCTA_*
// names before it execs, with the same list and the same words as the library).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "config.h"
#include "log.h"

namespace zc {
namespace {

// Runs fn with stderr sent to a temporary file and returns what it wrote.
template <typename Fn>
std::string capture_stderr(Fn fn) {
  char path[] = "/tmp/zerocta-first-contact-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return "mkstemp failed";
  const int saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  fn();
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  return text.str();
}

TEST(FirstContactLog, DeviceFieldIsMinusOneUntilSetAndPerThread) {
  const LogLevel level = log_level();
  log_set_level(LogLevel::kWarn);
  EXPECT_EQ(log_device(), -1);
  std::string err = capture_stderr([] { ZC_WARN("first"); });
  EXPECT_NE(err.find(" [-1] zerocta WARN first\n"), std::string::npos) << err;

  log_set_device(3);
  EXPECT_EQ(log_device(), 3);
  err = capture_stderr([] { ZC_WARN("second"); });
  EXPECT_NE(err.find(" [3] zerocta WARN second\n"), std::string::npos) << err;

  // Another thread has its own field.
  std::string other;
  int other_device = 0;
  std::thread t([&] {
    other_device = log_device();
    other = capture_stderr([] { ZC_WARN("other thread"); });
  });
  t.join();
  EXPECT_EQ(other_device, -1);
  EXPECT_NE(other.find(" [-1] zerocta WARN other thread\n"), std::string::npos) << other;

  log_set_device(-1);
  err = capture_stderr([] { ZC_WARN("third"); });
  EXPECT_NE(err.find(" [-1] zerocta WARN third\n"), std::string::npos) << err;
  log_set_level(level);
}

TEST(FirstContactLog, DeviceScopeTagsLinesAndRestoresTheField) {
  const LogLevel level = log_level();
  log_set_level(LogLevel::kWarn);
  log_set_device(1);
  std::string err;
  {
    LogDeviceScope on(5);  // what ScopedDevice and the route's freeze use
    err = capture_stderr([] { ZC_WARN("inside"); });
    {
      LogDeviceScope unknown(-1);  // an unknown device keeps the tag it finds
      err += capture_stderr([] { ZC_WARN("unknown"); });
    }
  }
  err += capture_stderr([] { ZC_WARN("after"); });
  EXPECT_NE(err.find(" [5] zerocta WARN inside\n"), std::string::npos) << err;
  EXPECT_NE(err.find(" [5] zerocta WARN unknown\n"), std::string::npos) << err;
  EXPECT_NE(err.find(" [1] zerocta WARN after\n"), std::string::npos) << err;
  log_set_device(-1);
  log_set_level(level);
}

// The words of a bash array assignment `readonly NAME=(a b c)` in tools/zerocta-run (one line).
std::vector<std::string> launcher_array(const std::string& name) {
  std::ifstream in(std::string(ZEROCTA_SOURCE_DIR) + "/tools/zerocta-run");
  const std::string start = "readonly " + name + "=(";
  std::vector<std::string> words;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(start, 0) != 0) continue;
    std::istringstream list(line.substr(start.size(), line.find(')') - start.size()));
    for (std::string w; list >> w;) words.push_back(w);
    break;
  }
  return words;
}

TEST(FirstContactLauncher, KnowsExactlyTheLibrarysVariablesInTableOrder) {
  std::vector<std::string> table;
  for (const ConfigVar& v : config_table()) table.push_back(v.name);
  EXPECT_EQ(launcher_array("LIBRARY_VARS"), table)
      << "tools/zerocta-run's LIBRARY_VARS must list config_table()'s names in its order "
         "(the suggestion for a misspelt name depends on it)";
  std::vector<std::string> tools(tool_var_names().begin(), tool_var_names().end());
  EXPECT_EQ(launcher_array("TOOL_VARS"), tools);
}

TEST(FirstContactLauncher, UsesTheLibrarysWordsAndThreshold) {
  std::ifstream in(std::string(ZEROCTA_SOURCE_DIR) + "/tools/zerocta-run");
  std::stringstream text;
  text << in.rdbuf();
  const std::string script = text.str();
  EXPECT_NE(script.find("readonly SUGGEST_DISTANCE=" + std::to_string(kSuggestDistance) + "\n"),
            std::string::npos);
  EXPECT_NE(script.find("is not a zerocta variable and is ignored"), std::string::npos);
  EXPECT_NE(script.find("did you mean"), std::string::npos);
  EXPECT_NE(script.find("(the nearest zerocta variable is"), std::string::npos);
}

}  // namespace
}  // namespace zc
