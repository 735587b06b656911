// The README documents every subcommand and flag that `deltafin --help` shows, and its Quick
// start opens with the two commands (demo first, then tests) that CI and new users run.
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "test_util.h"

namespace deltafin {
namespace {

std::string readme() {
  return test::slurp(std::string(DELTAFIN_TEST_DATA) + "/../../README.md");
}

std::vector<std::string> subcommands() {
  auto r = test::run_deltafin({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  std::vector<std::string> out;
  auto pos = r.out.find("Subcommands:");
  EXPECT_NE(pos, std::string::npos);
  std::regex line(R"(\n  ([a-z][a-z-]*)\s)");
  std::string rest = r.out.substr(pos);
  for (std::sregex_iterator it(rest.begin(), rest.end(), line), end; it != end; ++it)
    out.push_back((*it)[1]);
  return out;
}

TEST(Readme, DocumentsEverySubcommandAndFlag) {
  const std::string doc = readme();
  auto cmds = subcommands();
  EXPECT_GE(cmds.size(), 8u);
  for (const auto& c : cmds) {
    EXPECT_NE(doc.find("deltafin " + c), std::string::npos)
        << "README does not describe `deltafin " << c << "`";
    auto r = test::run_deltafin({c, "--help"});
    EXPECT_EQ(r.exit_code, 0) << c;
    std::regex flag(R"((--[a-z][a-z0-9-]*))");
    std::set<std::string> flags;
    for (std::sregex_iterator it(r.out.begin(), r.out.end(), flag), end; it != end; ++it)
      flags.insert((*it)[1]);
    for (const auto& f : flags) {
      if (f == "--help") continue;
      std::regex whole(f + "(?![a-z0-9-])");
      EXPECT_TRUE(std::regex_search(doc, whole)) << "README does not document " << c << " " << f;
    }
  }
}

TEST(Readme, QuickStartIsDemoThenTests) {
  const std::string doc = readme();
  auto q = doc.find("## Quick start");
  ASSERT_NE(q, std::string::npos);
  auto open = doc.find("```", q);
  auto body = doc.find('\n', open) + 1;
  auto close = doc.find("```", body);
  EXPECT_EQ(doc.substr(body, close - body), "make demo\nmake test\n");
  // .ci/run calls the README's test command.
  std::string ci = test::slurp(std::string(DELTAFIN_TEST_DATA) + "/../../.ci/run");
  EXPECT_NE(ci.find("make test"), std::string::npos);
}

}  // namespace
}  // namespace deltafin
