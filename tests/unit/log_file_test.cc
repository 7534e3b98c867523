// NCCL_DEBUG_FILE's name as NCCL expands it (src/core/log_file.cc). Where the lines go, shared with
// NCCL's own file, is tested in real processes: tests/interpose/test_logs.cc.
#include "log_file.h"

#include <gtest/gtest.h>
#include <limits.h>

#include <string>

namespace zc {
namespace {

TEST(LogFileName, HostAndPidAreExpandedAnywhere) {
  EXPECT_EQ(expand_log_file_name("/tmp/nccl.%h.%p", "node7", 4242), "/tmp/nccl.node7.4242");
  EXPECT_EQ(expand_log_file_name("%p-%h/%h", "a", 1), "1-a/a");
  EXPECT_EQ(expand_log_file_name("/var/log/plain.log", "a", 1), "/var/log/plain.log");
}

TEST(LogFileName, PercentPercentIsOnePercentAndOtherEscapesStay) {
  EXPECT_EQ(expand_log_file_name("100%%.%%h", "a", 1), "100%.%h");
  EXPECT_EQ(expand_log_file_name("x%r%y%", "a", 1), "x%r%y%");
  EXPECT_EQ(expand_log_file_name("%", "a", 1), "%");
  EXPECT_EQ(expand_log_file_name("%%%p", "a", 9), "%9");
}

TEST(LogFileName, SlashAndPercentInTheHostBecomeDashes) {
  // As NCCL does: a host name cannot move the file to another directory or add an escape.
  EXPECT_EQ(expand_log_file_name("/tmp/%h.log", "a/b%p", 1), "/tmp/a-b-p.log");
}

TEST(LogFileName, IsCutAtPathMax) {
  const std::string pattern(PATH_MAX + 100, 'x');
  EXPECT_EQ(expand_log_file_name(pattern.c_str(), "a", 1).size(), static_cast<size_t>(PATH_MAX));
  EXPECT_EQ(expand_log_file_name("", "a", 1), "");
}

}  // namespace
}  // namespace zc
