// Tests of the ZEROCTA_* configuration (src/core/config.cc): defaults, every bad-input class per
// variable type, size suffixes and boundaries, the fingerprint, and that the table documents
// exactly the variables that are read.
#include "config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace zc {
namespace {

using Env = std::map<std::string, std::string>;

Config parse_env(const Env& env) {
  return parse_config([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

const ConfigVar& row(const std::string& name) {
  for (const ConfigVar& v : config_table()) {
    if (name == v.name) return v;
  }
  ADD_FAILURE() << name << " is not in config_table()";
  static const ConfigVar kMissing = {"", "", "", "", ""};
  return kMissing;
}

// The documented error line for a printable value.
std::string invalid_line(const std::string& name, const std::string& value) {
  const ConfigVar& v = row(name);
  return name + "=\"" + value + "\" is invalid (accepted: " + v.values + "); using the default \"" +
         v.def + "\"";
}

// Every parsed value (not errors, not fingerprint), so "kept the default" can be checked
// field by field with a readable failure.
void expect_same_values(const Config& a, const Config& b) {
  EXPECT_EQ(a.enable, b.enable);
  EXPECT_EQ(a.strict, b.strict);
  EXPECT_EQ(a.log, b.log);
  EXPECT_EQ(a.cta_policy, b.cta_policy);
  EXPECT_EQ(a.cta_policy_force, b.cta_policy_force);
  EXPECT_EQ(a.allgather, b.allgather);
  EXPECT_EQ(a.min_bytes, b.min_bytes);
  EXPECT_EQ(a.auto_max_ranks, b.auto_max_ranks);
  EXPECT_EQ(a.reducescatter, b.reducescatter);
  EXPECT_EQ(a.rs_scratch_bytes, b.rs_scratch_bytes);
  EXPECT_EQ(a.rs_ctas, b.rs_ctas);
  EXPECT_EQ(a.stats, b.stats);
  EXPECT_EQ(a.nvtx, b.nvtx);
  EXPECT_EQ(a.nccl_library, b.nccl_library);
  EXPECT_EQ(a.channel_dir, b.channel_dir);
  EXPECT_EQ(a.log_from_nccl_debug, b.log_from_nccl_debug);
  EXPECT_EQ(a.log_file, b.log_file);
  EXPECT_EQ(a.nccl_writes_log_file, b.nccl_writes_log_file);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return parts;
}

std::string to_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Upper-cases every other letter: "zerocta" -> "ZeRoCtA".
std::string mixed_case(std::string s) {
  for (size_t i = 0; i < s.size(); i += 2) {
    s[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[i])));
  }
  return s;
}

// The test's own map from each variable to its field; a new variable must be added here
// (TableTest.TypedFieldMapsCoverTheTable fails otherwise).
const std::map<std::string, bool Config::*> kBoolFields = {
    {"ZEROCTA_ENABLE", &Config::enable},
    {"ZEROCTA_STRICT", &Config::strict},
    {"ZEROCTA_CTA_POLICY_FORCE", &Config::cta_policy_force},
    {"ZEROCTA_NVTX", &Config::nvtx},
};
const std::map<std::string, uint64_t Config::*> kSizeFields = {
    {"ZEROCTA_MIN_BYTES", &Config::min_bytes},
    {"ZEROCTA_RS_SCRATCH", &Config::rs_scratch_bytes},
};
const std::map<std::string, uint64_t Config::*> kCountFields = {
    {"ZEROCTA_AUTO_MAX_RANKS", &Config::auto_max_ranks},
    {"ZEROCTA_RS_CTAS", &Config::rs_ctas},
};
const std::map<std::string, std::string Config::*> kStringFields = {
    {"ZEROCTA_STATS", &Config::stats},
    {"ZEROCTA_NCCL_LIBRARY", &Config::nccl_library},
};
// String variables with a non-empty default, for which empty is invalid.
const std::map<std::string, std::string Config::*> kDirFields = {
    {"ZEROCTA_CHANNEL_DIR", &Config::channel_dir},
};
const std::set<std::string> kEnumNames = {"ZEROCTA_LOG", "ZEROCTA_CTA_POLICY", "ZEROCTA_ALLGATHER",
                                          "ZEROCTA_REDUCESCATTER"};

// ---------------------------------------------------------------- defaults

TEST(ConfigDefaults, EmptyEnvironmentGivesTheDocumentedDefaults) {
  Config c = parse_env({});
  EXPECT_TRUE(c.errors.empty());
  EXPECT_TRUE(c.enable);
  EXPECT_FALSE(c.strict);
  EXPECT_EQ(c.log, LogLevel::kWarn);
  EXPECT_EQ(c.cta_policy, CtaPolicyMode::kZero);
  EXPECT_FALSE(c.cta_policy_force);
  EXPECT_EQ(c.allgather, RouteMode::kNccl);
  EXPECT_EQ(c.min_bytes, 64ull << 20);
  EXPECT_EQ(c.auto_max_ranks, 4u);
  EXPECT_EQ(c.stats, "");
  EXPECT_TRUE(c.nvtx);
  EXPECT_EQ(c.nccl_library, "");
  EXPECT_EQ(c.channel_dir, "/dev/shm");
}

TEST(ConfigDefaults, DefaultConstructedConfigIsTheParsedEmptyEnvironment) {
  Config parsed = parse_env({});
  expect_same_values(Config{}, parsed);
  EXPECT_EQ(config_fingerprint(Config{}), parsed.fingerprint);
}

TEST(ConfigDefaults, NoLookupFunctionMeansNothingIsSet) {
  Config c = parse_config(EnvLookup{});
  EXPECT_TRUE(c.errors.empty());
  expect_same_values(c, parse_env({}));
}

TEST(ConfigDefaults, TableDefaultTextsParseToTheDefaults) {
  Env env;
  for (const ConfigVar& v : config_table()) {
    if (v.def[0] != '\0') env[v.name] = v.def;
  }
  Config c = parse_env(env);
  EXPECT_TRUE(c.errors.empty()) << c.errors.front();
  expect_same_values(c, parse_env({}));
  EXPECT_EQ(c.fingerprint, parse_env({}).fingerprint);
}

TEST(ConfigDefaults, EmptyDefaultIsOnlyUsedForStringVariables) {
  for (const ConfigVar& v : config_table()) {
    if (v.def[0] == '\0') {
      EXPECT_STREQ(v.type, "string") << v.name;
    }
  }
}

// ---------------------------------------------------------------- the table

TEST(TableTest, NamesExactlyTheVariablesParseConfigReads) {
  std::multiset<std::string> asked;
  parse_config([&asked](const char* name) -> const char* {
    asked.insert(name);
    return nullptr;
  });
  // The table's, and the NCCL variables zerocta follows (documented with ZEROCTA_LOG).
  std::multiset<std::string> documented;
  for (const ConfigVar& v : config_table()) documented.insert(v.name);
  for (const char* name : nccl_var_names()) documented.insert(name);
  EXPECT_EQ(asked, documented);
  // Each exactly once: no duplicate rows, no variable read twice.
  EXPECT_EQ(std::set<std::string>(asked.begin(), asked.end()).size(), asked.size());
}

TEST(TableTest, ReadsTheSameVariablesWhenAllAreSet) {
  // A parser that only looks at some variables once others are set would escape the test
  // above; set everything to a valid value and record again.
  std::set<std::string> asked;
  Env env;
  for (const ConfigVar& v : config_table()) env[v.name] = v.def;
  env["NCCL_DEBUG"] = "INFO";
  env["NCCL_DEBUG_FILE"] = "/tmp/nccl.%h.%p";
  parse_config([&](const char* name) -> const char* {
    asked.insert(name);
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  EXPECT_EQ(asked.size(), config_table().size() + nccl_var_names().size());
}

TEST(TableTest, TheLogRowNamesTheNcclVariablesItFollows) {
  const std::string meaning = row("ZEROCTA_LOG").meaning;
  for (const char* name : nccl_var_names())
    EXPECT_NE(meaning.find(name), std::string::npos) << name << " is not in: " << meaning;
}

TEST(TableTest, RowsAreComplete) {
  const std::set<std::string> types = {"bool", "enum", "size", "count", "string"};
  for (const ConfigVar& v : config_table()) {
    std::string name = v.name;
    EXPECT_EQ(name.rfind("ZEROCTA_", 0), 0u) << name;
    EXPECT_EQ(types.count(v.type), 1u) << name << " has type " << v.type;
    EXPECT_NE(std::string(v.values), "") << name;
    std::string meaning = v.meaning;
    ASSERT_FALSE(meaning.empty()) << name;
    EXPECT_EQ(meaning.back(), '.') << name << ": the meaning is one sentence";
    EXPECT_EQ(meaning.find(". "), std::string::npos) << name << ": the meaning is one sentence";
    for (const char* text : {v.values, v.def, v.meaning}) {
      EXPECT_EQ(std::string(text).find('\n'), std::string::npos) << name;
    }
  }
}

TEST(TableTest, TypedFieldMapsCoverTheTable) {
  for (const ConfigVar& v : config_table()) {
    std::string type = v.type;
    size_t in_maps = kBoolFields.count(v.name) + kSizeFields.count(v.name) +
                     kCountFields.count(v.name) + kStringFields.count(v.name) +
                     kDirFields.count(v.name) + kEnumNames.count(v.name);
    EXPECT_EQ(in_maps, 1u) << v.name << ": add it to the test's field maps";
    const std::map<std::string, size_t> in_typed_map = {
        {"bool", kBoolFields.count(v.name)},
        {"size", kSizeFields.count(v.name)},
        {"count", kCountFields.count(v.name)},
        {"string", kStringFields.count(v.name) + kDirFields.count(v.name)},
        {"enum", kEnumNames.count(v.name)},
    };
    auto it = in_typed_map.find(type);
    ASSERT_NE(it, in_typed_map.end()) << v.name;
    EXPECT_EQ(it->second, 1u) << v.name << " is in the wrong field map for type " << type;
  }
}

TEST(TableTest, DocumentedDefaultsMatchTheRequirements) {
  const std::map<std::string, std::string> required = {
      {"ZEROCTA_ENABLE", "1"},
      {"ZEROCTA_STRICT", "0"},
      {"ZEROCTA_LOG", "warn"},
      {"ZEROCTA_CTA_POLICY", "zero"},
      {"ZEROCTA_CTA_POLICY_FORCE", "0"},
      {"ZEROCTA_ALLGATHER", "nccl"},
      {"ZEROCTA_MIN_BYTES", "64M"},
      {"ZEROCTA_AUTO_MAX_RANKS", "4"},
      {"ZEROCTA_REDUCESCATTER", "nccl"},
      {"ZEROCTA_RS_SCRATCH", "128M"},
      {"ZEROCTA_RS_CTAS", "32"},
      {"ZEROCTA_STATS", ""},
      {"ZEROCTA_NVTX", "1"},
      {"ZEROCTA_NCCL_LIBRARY", ""},
      {"ZEROCTA_CHANNEL_DIR", "/dev/shm"},
  };
  std::map<std::string, std::string> documented;
  for (const ConfigVar& v : config_table()) documented[v.name] = v.def;
  EXPECT_EQ(documented, required);
}

// ---------------------------------------------------------------- bad values, any type

TEST(BadValues, EachBadValueGivesOneLineAndKeepsTheDefault) {
  // Invalid for every bool, enum and size variable alike.
  const std::vector<std::string> bad = {"",   " ",  "1 ",  " 1",     "-1",  "x",
                                        "1x", "\t", "0 0", "on off", "16Mx"};
  const Config defaults = parse_env({});
  for (const ConfigVar& v : config_table()) {
    if (std::string(v.type) == "string") continue;
    for (const std::string& value : bad) {
      SCOPED_TRACE(std::string(v.name) + "=\"" + value + "\"");
      Config c = parse_env({{v.name, value}});
      ASSERT_EQ(c.errors.size(), 1u);
      if (value != "\t") {  // a tab is escaped in the line; see the escaping test
        EXPECT_EQ(c.errors[0], invalid_line(v.name, value));
      }
      expect_same_values(c, defaults);
      EXPECT_EQ(c.fingerprint, defaults.fingerprint);
    }
  }
}

TEST(BadValues, TheRequirementsExampleLineIsExact) {
  Config c = parse_env({{"ZEROCTA_LOG", "verbose"}});
  ASSERT_EQ(c.errors.size(), 1u);
  EXPECT_EQ(c.errors[0],
            "ZEROCTA_LOG=\"verbose\" is invalid (accepted: none|warn|info|debug); using the "
            "default \"warn\"");
}

TEST(BadValues, OneLinePerBadVariable) {
  Config c = parse_env({{"ZEROCTA_LOG", "loud"},
                        {"ZEROCTA_ENABLE", "2"},
                        {"ZEROCTA_MIN_BYTES", "-1"},
                        {"ZEROCTA_ALLGATHER", "fast"},
                        {"ZEROCTA_NVTX", "1"}});
  ASSERT_EQ(c.errors.size(), 4u);
  std::set<std::string> named;
  for (const std::string& line : c.errors) named.insert(line.substr(0, line.find('=')));
  EXPECT_EQ(named, (std::set<std::string>{"ZEROCTA_LOG", "ZEROCTA_ENABLE", "ZEROCTA_MIN_BYTES",
                                          "ZEROCTA_ALLGATHER"}));
}

TEST(BadValues, ControlCharactersAndQuotesStayOnOneEscapedLine) {
  Config c = parse_env({{"ZEROCTA_LOG", "a\nb\"c\\d\x7f\xff"}});
  ASSERT_EQ(c.errors.size(), 1u);
  const std::string& line = c.errors[0];
  for (char ch : line) {
    EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << "byte " << static_cast<int>(ch) << " in " << line;
  }
  EXPECT_NE(line.find("ZEROCTA_LOG=\"a\\x0ab\\\"c\\\\d\\x7f\\xff\" is invalid"), std::string::npos)
      << line;
}

TEST(BadValues, HugeValueIsShortenedInTheLine) {
  std::string huge(100000, 'x');
  Config c = parse_env({{"ZEROCTA_CTA_POLICY", huge}});
  ASSERT_EQ(c.errors.size(), 1u);
  EXPECT_LT(c.errors[0].size(), 400u);
  EXPECT_NE(c.errors[0].find("xxxx\"... is invalid"), std::string::npos) << c.errors[0];
}

// ---------------------------------------------------------------- bools

TEST(Bools, EveryAcceptedWordInAnyCase) {
  const std::set<std::string> truthy = {"1", "true", "yes", "on"};
  const std::set<std::string> falsy = {"0", "false", "no", "off"};
  for (const auto& [name, field] : kBoolFields) {
    std::vector<std::string> words = split(row(name).values, '|');
    EXPECT_EQ(std::set<std::string>(words.begin(), words.end()).size(), 8u) << name;
    for (const std::string& word : words) {
      ASSERT_EQ(truthy.count(word) + falsy.count(word), 1u) << name << ": " << word;
      for (const std::string& spelled : {word, to_upper(word), mixed_case(word)}) {
        Config c = parse_env({{name, spelled}});
        EXPECT_TRUE(c.errors.empty()) << name << "=" << spelled;
        EXPECT_EQ(c.*field, truthy.count(word) == 1) << name << "=" << spelled;
      }
    }
  }
}

TEST(Bools, RejectsNearMisses) {
  for (const auto& [name, field] : kBoolFields) {
    for (const char* bad : {"2", "10", "01", "tru", "truee", "y", "n", "enable", "of", "onn", "+1",
                            "0x1", "true\n"}) {
      Config c = parse_env({{name, bad}});
      ASSERT_EQ(c.errors.size(), 1u) << name << "=" << bad;
      EXPECT_EQ(c.*field, Config{}.*field) << name << "=" << bad;
    }
  }
}

// ---------------------------------------------------------------- enums

TEST(Enums, EveryDocumentedWordParsesInAnyCaseAndPrintsBack) {
  struct Case {
    const char* name;
    std::function<std::string(const Config&)> printed;
  };
  const std::vector<Case> cases = {
      {"ZEROCTA_LOG", [](const Config& c) { return std::string(to_string(c.log)); }},
      {"ZEROCTA_CTA_POLICY", [](const Config& c) { return std::string(to_string(c.cta_policy)); }},
      {"ZEROCTA_ALLGATHER", [](const Config& c) { return std::string(to_string(c.allgather)); }},
      {"ZEROCTA_REDUCESCATTER",
       [](const Config& c) { return std::string(to_string(c.reducescatter)); }},
  };
  ASSERT_EQ(cases.size(), kEnumNames.size());
  for (const Case& k : cases) {
    std::vector<std::string> words = split(row(k.name).values, '|');
    EXPECT_GE(words.size(), 2u) << k.name;
    for (const std::string& word : words) {
      for (const std::string& spelled : {word, to_upper(word), mixed_case(word)}) {
        Config c = parse_env({{k.name, spelled}});
        EXPECT_TRUE(c.errors.empty()) << k.name << "=" << spelled;
        EXPECT_EQ(k.printed(c), word) << k.name << "=" << spelled;
      }
    }
  }
}

TEST(Enums, SpecificWordsMapToTheirValues) {
  EXPECT_EQ(parse_env({{"ZEROCTA_LOG", "none"}}).log, LogLevel::kNone);
  EXPECT_EQ(parse_env({{"ZEROCTA_LOG", "Debug"}}).log, LogLevel::kDebug);
  EXPECT_EQ(parse_env({{"ZEROCTA_LOG", "INFO"}}).log, LogLevel::kInfo);
  EXPECT_EQ(parse_env({{"ZEROCTA_CTA_POLICY", "keep"}}).cta_policy, CtaPolicyMode::kKeep);
  EXPECT_EQ(parse_env({{"ZEROCTA_CTA_POLICY", "Efficiency"}}).cta_policy,
            CtaPolicyMode::kEfficiency);
  EXPECT_EQ(parse_env({{"ZEROCTA_CTA_POLICY", "DEFAULT"}}).cta_policy, CtaPolicyMode::kDefault);
  EXPECT_EQ(parse_env({{"ZEROCTA_ALLGATHER", "Auto"}}).allgather, RouteMode::kAuto);
  EXPECT_EQ(parse_env({{"ZEROCTA_ALLGATHER", "zerocta"}}).allgather, RouteMode::kZerocta);
  EXPECT_EQ(parse_env({{"ZEROCTA_ALLGATHER", "nccl"}}).allgather, RouteMode::kNccl);
  EXPECT_EQ(parse_env({{"ZEROCTA_ALLGATHER", "OFF"}}).allgather, RouteMode::kOff);
  EXPECT_EQ(parse_env({{"ZEROCTA_REDUCESCATTER", "Zerocta"}}).reducescatter, RouteMode::kZerocta);
  // The two collectives' settings are apart.
  EXPECT_EQ(parse_env({{"ZEROCTA_REDUCESCATTER", "auto"}}).allgather, RouteMode::kNccl);
}

TEST(Enums, RejectsNearMisses) {
  const std::map<std::string, std::vector<const char*>> bad = {
      {"ZEROCTA_LOG", {"verbose", "warning", "warn ", "0", "3", "trace", "de bug"}},
      {"ZEROCTA_CTA_POLICY", {"zero ", "0", "none", "efficient", "zero|keep", "keepp"}},
      {"ZEROCTA_ALLGATHER", {"nccl-ce", "nccl-", "zero-cta", "on", "1", "ce", "auto nccl", ""}},
      {"ZEROCTA_REDUCESCATTER", {"sum", "on", "1", "ce", ""}},
  };
  for (const auto& [name, values] : bad) {
    for (const char* value : values) {
      Config c = parse_env({{name, value}});
      ASSERT_EQ(c.errors.size(), 1u) << name << "=" << value;
      EXPECT_EQ(c.errors[0], invalid_line(name, value));
      expect_same_values(c, parse_env({}));
    }
  }
}

// ---------------------------------------------------------------- logging like NCCL

TEST(NcclDebug, SetsTheLevelWhileZeroctaLogIsUnset) {
  const std::map<std::string, LogLevel> expected = {
      {"NONE", LogLevel::kNone}, {"VERSION", LogLevel::kNone}, {"WARN", LogLevel::kWarn},
      {"INFO", LogLevel::kInfo}, {"ABORT", LogLevel::kInfo},   {"TRACE", LogLevel::kDebug},
  };
  for (const auto& [word, level] : expected) {
    std::string lower = word;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    // NCCL compares its words ignoring case.
    for (const std::string& text : {word, lower, mixed_case(lower)}) {
      Config c = parse_env({{"NCCL_DEBUG", text}});
      EXPECT_EQ(c.log, level) << text;
      EXPECT_TRUE(c.log_from_nccl_debug) << text;
      EXPECT_TRUE(c.errors.empty()) << text;
    }
  }
}

TEST(NcclDebug, ZeroctaLogWins) {
  for (const char* nccl : {"NONE", "VERSION", "WARN", "INFO", "TRACE"}) {
    for (const char* mine : {"none", "warn", "info", "debug"}) {
      Config c = parse_env({{"NCCL_DEBUG", nccl}, {"ZEROCTA_LOG", mine}});
      EXPECT_EQ(to_string(c.log), std::string(mine)) << nccl << " " << mine;
      EXPECT_FALSE(c.log_from_nccl_debug);
    }
  }
  // A bad ZEROCTA_LOG is still set: its line names the default, and the default it is.
  Config c = parse_env({{"NCCL_DEBUG", "TRACE"}, {"ZEROCTA_LOG", "verbose"}});
  EXPECT_EQ(c.log, LogLevel::kWarn);
  EXPECT_FALSE(c.log_from_nccl_debug);
  ASSERT_EQ(c.errors.size(), 1u);
  EXPECT_EQ(c.errors[0], invalid_line("ZEROCTA_LOG", "verbose"));
}

TEST(NcclDebug, OtherValuesAreNcclsToJudgeAndKeepTheDefault) {
  for (const char* text : {"", "DEBUG", "INFO,COLL", " INFO", "verbose", "2"}) {
    Config c = parse_env({{"NCCL_DEBUG", text}});
    EXPECT_EQ(c.log, LogLevel::kWarn) << text;
    EXPECT_FALSE(c.log_from_nccl_debug) << text;
    EXPECT_FALSE(c.nccl_writes_log_file) << text;
    EXPECT_TRUE(c.errors.empty()) << text;
  }
}

TEST(NcclDebug, NcclWritesTheFileAboveVersionOnly) {
  // NCCL opens NCCL_DEBUG_FILE only at WARN or more (src/debug.cc there).
  const std::map<std::string, bool> opens = {{"NONE", false}, {"VERSION", false}, {"WARN", true},
                                             {"INFO", true},  {"ABORT", true},    {"TRACE", true}};
  for (const auto& [word, nccl_opens] : opens) {
    Config c = parse_env({{"NCCL_DEBUG", word}, {"ZEROCTA_LOG", "none"}});
    EXPECT_EQ(c.nccl_writes_log_file, nccl_opens) << word;
  }
  EXPECT_FALSE(parse_env({}).nccl_writes_log_file);
}

TEST(NcclDebug, TheFileIsReadAsItIsWhateverTheLevels) {
  EXPECT_EQ(parse_env({}).log_file, "");
  EXPECT_EQ(parse_env({{"NCCL_DEBUG_FILE", "/tmp/n.%h.%p"}}).log_file, "/tmp/n.%h.%p");
  Config c = parse_env({{"NCCL_DEBUG_FILE", "/tmp/x"}, {"ZEROCTA_LOG", "none"}});
  EXPECT_EQ(c.log_file, "/tmp/x");
  EXPECT_TRUE(c.errors.empty());
  // Not a protocol setting: ranks may log differently.
  EXPECT_EQ(c.fingerprint, parse_env({}).fingerprint);
  EXPECT_EQ(parse_env({{"NCCL_DEBUG", "INFO"}}).fingerprint, parse_env({}).fingerprint);
}

TEST(NcclDebug, LevelForNcclDebugLeavesTheLevelAloneOnOtherText) {
  LogLevel l = LogLevel::kDebug;
  EXPECT_FALSE(log_level_for_nccl_debug(nullptr, &l));
  EXPECT_FALSE(log_level_for_nccl_debug("INFOX", &l));
  EXPECT_EQ(l, LogLevel::kDebug);
  EXPECT_TRUE(log_level_for_nccl_debug("warn", &l));
  EXPECT_EQ(l, LogLevel::kWarn);
}

TEST(Enums, ToStringNamesAnOutOfRangeValue) {
  EXPECT_STREQ(to_string(static_cast<CtaPolicyMode>(99)), "unknown");
  EXPECT_STREQ(to_string(static_cast<RouteMode>(99)), "unknown");
  EXPECT_STREQ(to_string(static_cast<LogLevel>(99)), "unknown");
}

// ---------------------------------------------------------------- parse_size

uint64_t size_or_die(const char* text) {
  uint64_t v = 0;
  EXPECT_TRUE(parse_size(text, &v)) << text;
  return v;
}

TEST(ParseSize, PlainDigitsAreBytes) {
  EXPECT_EQ(size_or_die("0"), 0u);
  EXPECT_EQ(size_or_die("1"), 1u);
  EXPECT_EQ(size_or_die("4097"), 4097u);
  EXPECT_EQ(size_or_die("000016"), 16u);
}

TEST(ParseSize, EverySuffixIsAPowerOf1024) {
  const std::vector<std::pair<std::string, unsigned>> suffixes = {
      {"K", 10}, {"M", 20}, {"G", 30},   {"T", 40},   {"k", 10},   {"m", 20},
      {"g", 30}, {"t", 40}, {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40},
  };
  for (const auto& [suffix, shift] : suffixes) {
    for (uint64_t n : {0ull, 1ull, 3ull, 1000ull}) {
      std::string text = std::to_string(n) + suffix;
      EXPECT_EQ(size_or_die(text.c_str()), n << shift) << text;
    }
  }
}

TEST(ParseSize, Boundaries) {
  EXPECT_EQ(size_or_die("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(size_or_die("0018446744073709551615"), UINT64_MAX);
  EXPECT_EQ(size_or_die("16777215T"), ((1ull << 24) - 1) << 40);
  EXPECT_EQ(size_or_die("17179869183G"), ((1ull << 34) - 1) << 30);
  EXPECT_EQ(size_or_die("17592186044415M"), ((1ull << 44) - 1) << 20);
  EXPECT_EQ(size_or_die("18014398509481983K"), ((1ull << 54) - 1) << 10);
  uint64_t v = 7;
  for (const char* over : {"18446744073709551616", "18446744073709551625", "99999999999999999999",
                           "184467440737095516150", "16777216T", "16777216TiB", "17179869184G",
                           "17592186044416M", "18014398509481984K", "18446744073709551615K"}) {
    EXPECT_FALSE(parse_size(over, &v)) << over;
  }
  EXPECT_EQ(v, 7u) << "a failed parse must leave the output unchanged";
}

TEST(ParseSize, RejectsJunkSignsWhitespaceAndOtherSpellings) {
  uint64_t v = 7;
  EXPECT_FALSE(parse_size(nullptr, &v));
  EXPECT_FALSE(parse_size("1", nullptr));
  for (const char* bad :
       {"",     " ",    "-1",    "-0",    "+1",    " 1",     "1 ",    "1\n",  "16Mx", "16MB",
        "16mb", "16B",  "16kib", "16KIB", "16Kib", "16KiBx", "16Ki",  "16iB", "16KK", "1.5M",
        "1e6",  "0x10", "M",     "K16",   "16 M",  "1,000",  "1_000", "16P",  "16E"}) {
    EXPECT_FALSE(parse_size(bad, &v)) << "\"" << bad << "\"";
  }
  EXPECT_EQ(v, 7u);
}

TEST(FormatSize, ShortestExactSpelling) {
  EXPECT_EQ(format_size(0), "0");
  EXPECT_EQ(format_size(1000), "1000");
  EXPECT_EQ(format_size(4096), "4K");
  EXPECT_EQ(format_size(16ull << 20), "16M");
  EXPECT_EQ(format_size(3ull << 30), "3G");
  EXPECT_EQ(format_size(1ull << 50), "1024T");
  EXPECT_EQ(format_size(UINT64_MAX), "18446744073709551615");
}

TEST(FormatSize, RoundTripsThroughParseSize) {
  std::mt19937_64 rng(12345);
  std::vector<uint64_t> values = {
      0, 1, 1023, 1024, 1025, UINT64_MAX, UINT64_MAX << 10, UINT64_MAX << 40, 1ull << 63};
  for (int i = 0; i < 2000; ++i) {
    uint64_t r = rng();
    values.push_back(r);
    values.push_back(r << (i % 48));  // many with K/M/G/T-exact values
  }
  for (uint64_t v : values) {
    uint64_t back = 0;
    ASSERT_TRUE(parse_size(format_size(v).c_str(), &back)) << v;
    EXPECT_EQ(back, v) << format_size(v);
  }
}

// ---------------------------------------------------------------- size variables

TEST(SizeVariables, AcceptSuffixedValues) {
  for (const auto& [name, field] : kSizeFields) {
    for (const char* text : {"1g", "16MiB", "3K", "4097"}) {
      Config c = parse_env({{name, text}});
      EXPECT_TRUE(c.errors.empty()) << name << "=" << text;
      EXPECT_EQ(c.*field, size_or_die(text)) << name << "=" << text;
    }
  }
}

TEST(SizeVariables, RejectOverflowAndNegatives) {
  for (const auto& [name, field] : kSizeFields) {
    for (const char* bad : {"18446744073709551616", "16777216T", "-1", "-16M", "16Mx", ""}) {
      Config c = parse_env({{name, bad}});
      ASSERT_EQ(c.errors.size(), 1u) << name << "=" << bad;
      EXPECT_EQ(c.errors[0], invalid_line(name, bad));
      EXPECT_EQ(c.*field, Config{}.*field);
    }
  }
}

TEST(CountVariables, AcceptPlainNumbersOnly) {
  for (const auto& [name, field] : kCountFields) {
    for (const char* good : {"0", "2", "8", "1000000"}) {
      Config c = parse_env({{name, good}});
      EXPECT_TRUE(c.errors.empty()) << name << "=" << good;
      EXPECT_EQ(c.*field, std::stoull(good)) << name;
    }
    for (const char* bad : {"1000001", "4K", "+4", "4.0", "0x4", "18446744073709551617"}) {
      Config c = parse_env({{name, bad}});
      ASSERT_EQ(c.errors.size(), 1u) << name << "=" << bad;
      EXPECT_EQ(c.errors[0], invalid_line(name, bad));
      EXPECT_EQ(c.*field, Config{}.*field);
    }
  }
}

TEST(SizeVariables, MinBytesTakesTheWholeRange) {
  EXPECT_EQ(parse_env({{"ZEROCTA_MIN_BYTES", "0"}}).min_bytes, 0u);
  Config c = parse_env({{"ZEROCTA_MIN_BYTES", "18446744073709551615"}});
  EXPECT_TRUE(c.errors.empty());
  EXPECT_EQ(c.min_bytes, UINT64_MAX);
}

// ---------------------------------------------------------------- string variables

TEST(StringVariables, AnyValueIsKeptAndEmptyMeansUnset) {
  for (const auto& [name, field] : kStringFields) {
    EXPECT_EQ(parse_env({}).*field, "") << name;
    for (const char* value : {"", "0", "1", "/tmp/zerocta stats.json", "relative/p\xc3\xa4th"}) {
      Config c = parse_env({{name, value}});
      EXPECT_TRUE(c.errors.empty()) << name << "=" << value;
      EXPECT_EQ(c.*field, value) << name;
    }
  }
}

TEST(StringVariables, DirectoryKeepsAnyNonEmptyValueAndRejectsEmpty) {
  for (const auto& [name, field] : kDirFields) {
    EXPECT_EQ(parse_env({}).*field, "/dev/shm") << name;
    for (const char* value : {"/tmp", "relative/dir", "/tmp/zerocta dir"}) {
      Config c = parse_env({{name, value}});
      EXPECT_TRUE(c.errors.empty()) << name << "=" << value;
      EXPECT_EQ(c.*field, value) << name;
    }
    Config c = parse_env({{name, ""}});
    ASSERT_EQ(c.errors.size(), 1u) << name;
    EXPECT_EQ(c.errors[0], invalid_line(name, ""));
    EXPECT_EQ(c.*field, "/dev/shm") << name;
  }
}

// ---------------------------------------------------------------- fingerprint

TEST(Fingerprint, IdenticalConfigsHashAlike) {
  Env env = {{"ZEROCTA_ALLGATHER", "zerocta"}, {"ZEROCTA_MIN_BYTES", "1M"}};
  Config a = parse_env(env);
  Config b = parse_env(env);
  EXPECT_EQ(a.fingerprint, b.fingerprint);
  EXPECT_EQ(a.fingerprint, config_fingerprint(a));
  EXPECT_NE(a.fingerprint, 0u);
}

// Settings that change what peers expect from a rank (each value differs from the default
// and from every other entry) ...
const std::vector<std::pair<const char*, const char*>> kProtocolChanges = {
    {"ZEROCTA_ENABLE", "0"},         {"ZEROCTA_CTA_POLICY", "efficiency"},
    {"ZEROCTA_CTA_POLICY", "keep"},  {"ZEROCTA_CTA_POLICY", "default"},
    {"ZEROCTA_ALLGATHER", "auto"},   {"ZEROCTA_ALLGATHER", "zerocta"},
    {"ZEROCTA_ALLGATHER", "off"},    {"ZEROCTA_MIN_BYTES", "16777217"},
    {"ZEROCTA_MIN_BYTES", "0"},      {"ZEROCTA_AUTO_MAX_RANKS", "0"},
    {"ZEROCTA_AUTO_MAX_RANKS", "8"}, {"ZEROCTA_REDUCESCATTER", "auto"},
    {"ZEROCTA_REDUCESCATTER", "zerocta"}, {"ZEROCTA_REDUCESCATTER", "off"},
    {"ZEROCTA_RS_SCRATCH", "32M"},
};
// ... and settings that stay on the rank. ZEROCTA_CHANNEL_DIR decides where ranks meet, so
// ranks that differ in it never compare fingerprints at all.
const std::vector<std::pair<const char*, const char*>> kLocalChanges = {
    {"ZEROCTA_LOG", "debug"},
    {"ZEROCTA_LOG", "none"},
    {"ZEROCTA_STATS", "1"},
    {"ZEROCTA_STATS", "/tmp/s.json"},
    {"ZEROCTA_NVTX", "0"},
    {"ZEROCTA_STRICT", "1"},
    {"ZEROCTA_CTA_POLICY_FORCE", "1"},
    {"ZEROCTA_NCCL_LIBRARY", "/opt/nccl/libnccl.so.2"},
    {"ZEROCTA_CHANNEL_DIR", "/tmp"},
    {"ZEROCTA_RS_CTAS", "8"},
};

TEST(Fingerprint, EveryVariableIsEitherProtocolOrLocal) {
  // A new variable must be sorted into one of the lists above, so its effect on the
  // fingerprint is tested.
  std::set<std::string> protocol, local;
  for (const auto& change : kProtocolChanges) protocol.insert(change.first);
  for (const auto& change : kLocalChanges) local.insert(change.first);
  for (const ConfigVar& v : config_table())
    EXPECT_EQ(protocol.count(v.name) + local.count(v.name), 1u) << v.name;
  EXPECT_EQ(protocol.size() + local.size(), config_table().size());
}

TEST(Fingerprint, EveryProtocolFieldChangesIt) {
  std::set<uint64_t> seen = {parse_env({}).fingerprint};
  for (const auto& [name, value] : kProtocolChanges) {
    Config c = parse_env({{name, value}});
    ASSERT_TRUE(c.errors.empty()) << name << "=" << value;
    EXPECT_TRUE(seen.insert(c.fingerprint).second) << name << "=" << value;
  }
}

TEST(Fingerprint, DirectFieldChangesChangeIt) {
  const Config base;
  const uint64_t h = config_fingerprint(base);
  Config c = base;
  c.min_bytes += 4096;
  EXPECT_NE(config_fingerprint(c), h);
  c = base;
  c.auto_max_ranks = base.min_bytes;  // swapping values between fields must not collide
  c.min_bytes = base.auto_max_ranks;
  EXPECT_NE(config_fingerprint(c), h);
  c = base;
  c.allgather = RouteMode::kAuto;
  EXPECT_NE(config_fingerprint(c), h);
  c = base;
  c.enable = false;
  EXPECT_NE(config_fingerprint(c), h);
  c = base;
  c.cta_policy = CtaPolicyMode::kKeep;
  EXPECT_NE(config_fingerprint(c), h);
}

TEST(Fingerprint, LocalOnlySettingsDoNotChangeIt) {
  const uint64_t base = parse_env({}).fingerprint;
  for (const auto& [name, value] : kLocalChanges) {
    Config c = parse_env({{name, value}});
    ASSERT_TRUE(c.errors.empty()) << name;
    EXPECT_EQ(c.fingerprint, base) << name << "=" << value;
  }
  Env every_local;  // later values of a repeated name win; all are local anyway
  for (const auto& [name, value] : kLocalChanges) every_local[name] = value;
  EXPECT_EQ(parse_env(every_local).fingerprint, base);
}

// FNV-1a 64 of a text, written out here so the test does not trust the code it checks.
uint64_t fnv1a(const std::string& text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  return h;
}

TEST(Fingerprint, IsStableAcrossBuilds) {
  // Ranks of different builds compare fingerprints: the canonical text is part of the
  // protocol, and changing it (a new protocol field, a new version tag) must be deliberate.
  EXPECT_EQ(config_fingerprint(Config{}),
            fnv1a("zerocta-config-v3 enable=1 cta_policy=zero allgather=nccl "
                  "min_bytes=67108864 auto_max_ranks=4 reducescatter=nccl "
                  "rs_scratch_bytes=134217728"));
  Config c = parse_env({{"ZEROCTA_ENABLE", "0"},
                        {"ZEROCTA_CTA_POLICY", "keep"},
                        {"ZEROCTA_ALLGATHER", "auto"},
                        {"ZEROCTA_MIN_BYTES", "1M"},
                        {"ZEROCTA_AUTO_MAX_RANKS", "0"},
                        {"ZEROCTA_REDUCESCATTER", "zerocta"},
                        {"ZEROCTA_RS_SCRATCH", "8M"}});
  EXPECT_EQ(c.fingerprint, fnv1a("zerocta-config-v3 enable=0 cta_policy=keep allgather=auto "
                                 "min_bytes=1048576 auto_max_ranks=0 reducescatter=zerocta "
                                 "rs_scratch_bytes=8388608"));
}

TEST(Fingerprint, DependsOnValuesNotSpelling) {
  const uint64_t base = parse_env({}).fingerprint;
  for (const char* spelled : {"64M", "64m", "64MiB", "65536K", "67108864"}) {
    EXPECT_EQ(parse_env({{"ZEROCTA_MIN_BYTES", spelled}}).fingerprint, base) << spelled;
  }
  EXPECT_EQ(parse_env({{"ZEROCTA_CTA_POLICY", "ZERO"}}).fingerprint, base);
  EXPECT_EQ(parse_env({{"ZEROCTA_ENABLE", "yes"}}).fingerprint, base);
}

// ---------------------------------------------------------------- config()

TEST(ProcessConfig, IsParsedOnceAndShared) {
  std::vector<const Config*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&seen, i] { seen[i] = &config(); });
  }
  for (std::thread& t : threads) t.join();
  for (const Config* p : seen) EXPECT_EQ(p, &config());
  Config fresh = parse_config([](const char* name) { return std::getenv(name); });
  expect_same_values(config(), fresh);
  EXPECT_EQ(config().fingerprint, fresh.fingerprint);
}

TEST(ProcessConfig, ReadsTheRealEnvironmentOnce) {
  // A fresh process (threadsafe death tests re-execute the binary), so config() has not
  // been called yet there, whatever other tests did here.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("ZEROCTA_LOG", "debug", 1);
        setenv("ZEROCTA_MIN_BYTES", "3K", 1);
        setenv("ZEROCTA_NVTX", "bogus", 1);
        const Config& first = config();
        bool parsed = first.log == LogLevel::kDebug && first.min_bytes == 3072 &&
                      first.errors.size() == 1 && first.nvtx;
        setenv("ZEROCTA_LOG", "none", 1);
        bool cached = &config() == &first && config().log == LogLevel::kDebug;
        std::exit(parsed && cached ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
}

// ---------------------------------------------------------------- unknown ZEROCTA_* names

TEST(EditDistance, CountsInsertDeleteSubstituteAndSwap) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("ZEROCTA_ALLGATHER", "ZEROCTA_ALLGATHER"), 0u);
  EXPECT_EQ(edit_distance("ZEROCTA_ALLGATHR", "ZEROCTA_ALLGATHER"), 1u);    // deleted
  EXPECT_EQ(edit_distance("ZEROCTA_ALLLGATHER", "ZEROCTA_ALLGATHER"), 1u);  // inserted
  EXPECT_EQ(edit_distance("ZEROCTA_ALLGATHEP", "ZEROCTA_ALLGATHER"), 1u);   // substituted
  EXPECT_EQ(edit_distance("ZEROCTA_ALLGAHTER", "ZEROCTA_ALLGATHER"), 1u);   // swapped
  EXPECT_EQ(edit_distance("zerocta_allgather", "ZEROCTA_ALLGATHER"), 0u);   // case ignored
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("ca", "abc"), 3u);  // optimal string alignment, not full Damerau
}

TEST(EditDistance, IsSymmetric) {
  const char* const words[] = {
      "", "a", "ZEROCTA_LOG", "ZEROCTA_LGO", "ZEROCTA_MIN_SIZE", "ZEROCTA_MIN_BYTES", "xyz"};
  for (const char* a : words)
    for (const char* b : words) EXPECT_EQ(edit_distance(a, b), edit_distance(b, a)) << a << b;
}

std::vector<UnknownVar> unknown_in(std::vector<const char*> env) {
  env.push_back(nullptr);
  return find_unknown_vars(env.data());
}

TEST(UnknownVars, AMisspeltNameGetsTheClosestKnownName) {
  std::vector<UnknownVar> u = unknown_in({"PATH=/bin", "ZEROCTA_ALLGATHR=auto"});
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0].name, "ZEROCTA_ALLGATHR");
  EXPECT_EQ(u[0].closest, "ZEROCTA_ALLGATHER");
  EXPECT_EQ(u[0].distance, 1u);
  EXPECT_EQ(unknown_var_line(u[0]),
            "ZEROCTA_ALLGATHR is not a zerocta variable and is ignored; did you mean "
            "ZEROCTA_ALLGATHER?");
}

TEST(UnknownVars, TypicalTyposPointToTheIntendedVariable) {
  const std::map<std::string, std::string> typos = {
      {"ZEROCTA_LOGG", "ZEROCTA_LOG"},
      {"ZEROCTA_STAT", "ZEROCTA_STATS"},
      {"ZEROCTA_MINBYTES", "ZEROCTA_MIN_BYTES"},
      {"ZEROCTA_MIN_BYTE", "ZEROCTA_MIN_BYTES"},
      {"ZEROCTA_CHANEL_DIR", "ZEROCTA_CHANNEL_DIR"},
      {"ZEROCTA_NCCL_LIBARY", "ZEROCTA_NCCL_LIBRARY"},
      {"ZEROCTA_NVXT", "ZEROCTA_NVTX"},
      {"ZEROCTA_AUTO_MAX_RANK", "ZEROCTA_AUTO_MAX_RANKS"},
      {"ZEROCTA_CTA_POLCY", "ZEROCTA_CTA_POLICY"},
      {"ZEROCTA_CTA_POLICY_FORCED", "ZEROCTA_CTA_POLICY_FORCE"},
      {"ZEROCTA_ENABLED", "ZEROCTA_ENABLE"},
      {"ZEROCTA_allgather", "ZEROCTA_ALLGATHER"},
  };
  for (const auto& t : typos) {
    const std::string entry = t.first + "=1";
    std::vector<UnknownVar> u = unknown_in({entry.c_str()});
    ASSERT_EQ(u.size(), 1u) << t.first;
    EXPECT_EQ(u[0].closest, t.second) << t.first;
    EXPECT_LE(u[0].distance, kSuggestDistance) << t.first;
    EXPECT_NE(unknown_var_line(u[0]).find("did you mean " + t.second + "?"), std::string::npos);
  }
}

TEST(UnknownVars, AFarNameNamesTheNearestWithoutGuessing) {
  std::vector<UnknownVar> u = unknown_in({"ZEROCTA_SOMETHING_ELSE_ENTIRELY=1"});
  ASSERT_EQ(u.size(), 1u);
  EXPECT_GT(u[0].distance, kSuggestDistance);
  const std::string line = unknown_var_line(u[0]);
  EXPECT_EQ(line,
            "ZEROCTA_SOMETHING_ELSE_ENTIRELY is not a zerocta variable and is ignored (the "
            "nearest zerocta variable is " +
                u[0].closest + ")");
  EXPECT_EQ(line.find("did you mean"), std::string::npos);
}

TEST(UnknownVars, KnownToolAndForeignNamesAreNotReported) {
  std::vector<const char*> env;
  std::vector<std::string> keep;
  for (const ConfigVar& v : config_table()) keep.push_back(std::string(v.name) + "=x");
  for (const char* tool : tool_var_names()) keep.push_back(std::string(tool) + "=x");
  for (const std::string& e : keep) env.push_back(e.c_str());
  // ZCTEST_*: the project's test programs' own variables, outside the prefix on purpose.
  for (const char* other : {"NCCL_DEBUG=INFO", "zerocta_log=info", "ZEROCTA=1", "XZEROCTA_LOG=1",
                            "LD_PRELOAD=/x/libzerocta.so", "ZCTEST_SOAK_ITERS=3", "=", ""})
    env.push_back(other);
  EXPECT_TRUE(unknown_in(env).empty());
  EXPECT_TRUE(find_unknown_vars(nullptr).empty());
  EXPECT_NE(std::find(tool_var_names().begin(), tool_var_names().end(), std::string("ZEROCTA_LIB")),
            tool_var_names().end());
  // An example script's variable (LD_PRELOAD-examples/) is a tool's too.
  EXPECT_NE(
      std::find(tool_var_names().begin(), tool_var_names().end(), std::string("ZEROCTA_BUILD")),
      tool_var_names().end());
  EXPECT_TRUE(unknown_in({"ZEROCTA_BUILD=build"}).empty());
}

TEST(UnknownVars, EachNameOnceInEnvironmentOrder) {
  std::vector<UnknownVar> u = unknown_in(
      {"ZEROCTA_B=1", "ZEROCTA_LOG=info", "ZEROCTA_A=2", "ZEROCTA_B=3", "ZEROCTA_NOVALUE"});
  ASSERT_EQ(u.size(), 3u);
  EXPECT_EQ(u[0].name, "ZEROCTA_B");
  EXPECT_EQ(u[1].name, "ZEROCTA_A");
  EXPECT_EQ(u[2].name, "ZEROCTA_NOVALUE");
  // A bare prefix is a name too.
  ASSERT_EQ(unknown_in({"ZEROCTA_=1"}).size(), 1u);
}

TEST(UnknownVars, TiesGoToTheFirstNameOfTheTable) {
  // The closest name at the smallest distance, the table's first among equals.
  for (const char* name : {"ZEROCTA_X", "ZEROCTA_", "ZEROCTA_QQQQQQQQQQQQQQQQQQQQQQQQQQQQ"}) {
    std::vector<UnknownVar> u = unknown_in({name});
    ASSERT_EQ(u.size(), 1u);
    size_t best = SIZE_MAX;
    std::string first;
    for (const ConfigVar& v : config_table()) {
      size_t d = edit_distance(name, v.name);
      if (d < best) best = d, first = v.name;
    }
    EXPECT_EQ(u[0].closest, first) << name;
    EXPECT_EQ(u[0].distance, best) << name;
  }
}

TEST(UnknownVars, OddNamesStayOnOnePrintableLine) {
  const std::string huge = "ZEROCTA_" + std::string(5000, 'Q');
  std::vector<UnknownVar> u = unknown_in({"ZEROCTA_A\nB=1", "ZEROCTA_\x1b[31mRED=1", huge.c_str()});
  ASSERT_EQ(u.size(), 3u);
  EXPECT_EQ(unknown_var_line(u[0]).rfind("ZEROCTA_A\\x0aB is not a zerocta variable", 0), 0u)
      << unknown_var_line(u[0]);
  for (const UnknownVar& v : u) {
    const std::string line = unknown_var_line(v);
    EXPECT_LT(line.size(), 200u) << line;
    for (char ch : line) EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << line;
  }
  EXPECT_NE(unknown_var_line(u[2]).find("QQQ... is not a zerocta variable"), std::string::npos);
}

TEST(UnknownVars, ReadsTheProcessEnvironment) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("ZEROCTA_ALLGATHR", "auto", 1);
        std::vector<UnknownVar> u = find_unknown_vars_in_environment();
        bool found = false;
        for (const UnknownVar& v : u) found = found || v.name == "ZEROCTA_ALLGATHR";
        unsetenv("ZEROCTA_ALLGATHR");
        for (const UnknownVar& v : find_unknown_vars_in_environment())
          found = found && v.name != "ZEROCTA_ALLGATHR";
        std::exit(found ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace zc
