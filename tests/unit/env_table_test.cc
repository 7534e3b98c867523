// The ZEROCTA_* table as markdown (what tools/zerocta-env-table prints), and the README check:
// README.md must hold exactly that table between its markers, so the documentation cannot
// drift from src/core/config.cc.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "config.h"

namespace zc {
namespace {

constexpr const char* kBeginMarker = "<!-- zerocta-env-table:begin -->";
constexpr const char* kEndMarker = "<!-- zerocta-env-table:end -->";
constexpr const char* kHowToRegenerate =
    "Generate the table from src/core/config.cc with\n"
    "    ./build/tools/zerocta-env-table --update README.md\n"
    "(or paste the output of ./build/tools/zerocta-env-table between the lines\n"
    "    <!-- zerocta-env-table:begin -->\n"
    "    <!-- zerocta-env-table:end -->\n"
    "of README.md).";

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Cells of a markdown table row, split at the pipes that are not escaped.
std::vector<std::string> cells_of(const std::string& row) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 0; i < row.size(); ++i) {
    if (row[i] == '\\' && i + 1 < row.size() && row[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (row[i] == '|') {
      cells.push_back(cell);
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  cells.push_back(cell);
  // "| a | b |" splits into "", " a ", " b ", "": drop the outer empties.
  if (cells.size() >= 2 && cells.front().empty() && cells.back().empty()) {
    cells.erase(cells.begin());
    cells.pop_back();
  }
  for (std::string& c : cells) {
    size_t b = c.find_first_not_of(' ');
    size_t e = c.find_last_not_of(' ');
    c = b == std::string::npos ? "" : c.substr(b, e - b + 1);
  }
  return cells;
}

TEST(EnvTableMarkdown, HeaderThenOneRowPerVariableInTableOrder) {
  std::string md = config_table_markdown();
  ASSERT_FALSE(md.empty());
  EXPECT_EQ(md.back(), '\n');
  std::vector<std::string> lines = lines_of(md);
  ASSERT_EQ(lines.size(), config_table().size() + 2);
  EXPECT_EQ(lines[0], "| Variable | Meaning | Values | Default |");
  EXPECT_EQ(cells_of(lines[1]).size(), 4u);
  for (const std::string& c : cells_of(lines[1]))
    EXPECT_EQ(c.find_first_not_of("-:"), std::string::npos);
  for (size_t i = 0; i < config_table().size(); ++i) {
    const ConfigVar& v = config_table()[i];
    std::vector<std::string> cells = cells_of(lines[i + 2]);
    ASSERT_EQ(cells.size(), 4u) << lines[i + 2];
    EXPECT_EQ(cells[0], "`" + std::string(v.name) + "`");
    EXPECT_EQ(cells[1], v.meaning);
    std::string type = v.type;
    if (type == "bool" || type == "enum") {
      EXPECT_EQ(cells[2], "`" + std::string(v.values) + "`") << v.name;
    } else {
      EXPECT_EQ(cells[2], v.values) << v.name;
    }
    if (v.def[0] == '\0') {
      EXPECT_EQ(cells[3], "unset") << v.name;
    } else {
      EXPECT_EQ(cells[3], "`" + std::string(v.def) + "`") << v.name;
    }
  }
}

TEST(EnvTableMarkdown, ReadmeHoldsTheCurrentTable) {
  const std::string path = std::string(ZEROCTA_SOURCE_DIR) + "/README.md";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path << " does not exist or cannot be read; it must document the "
                         << "ZEROCTA_* variables between the two marker lines below. "
                         << kHowToRegenerate;
  std::stringstream buf;
  buf << in.rdbuf();
  std::vector<std::string> lines = lines_of(buf.str());

  size_t begin = lines.size(), end = lines.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i] == kBeginMarker && begin == lines.size()) begin = i;
    if (lines[i] == kEndMarker && begin != lines.size() && i > begin) {
      end = i;
      break;
    }
  }
  ASSERT_TRUE(begin < lines.size() && end < lines.size())
      << path << " lacks the lines " << kBeginMarker << " and " << kEndMarker
      << " (in that order). " << kHowToRegenerate;

  // Blank lines next to the markers are allowed (some renderers want them).
  size_t first = begin + 1, last = end;
  while (first < last && lines[first].empty()) ++first;
  while (last > first && lines[last - 1].empty()) --last;
  std::string section;
  for (size_t i = first; i < last; ++i) section += lines[i] + "\n";

  EXPECT_EQ(section, config_table_markdown())
      << "The ZEROCTA_* table in " << path << " differs from config_table() in src/core/config.cc. "
      << kHowToRegenerate;
}

}  // namespace
}  // namespace zc
