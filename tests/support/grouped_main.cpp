// main() of the grouped test executables (tests/CMakeLists.txt compiles several tests/test_*.cpp
// into one executable to save compile time; see README "Tests"). It behaves like
// GoogleTest's gtest_main, with one addition: started under the name of one of its source files
// (the build puts a link tests/test_x -> its group next to the group), it runs only the tests
// defined in tests/test_x.cpp, so `build/<preset>/tests/test_x` works as it did when every file
// was its own executable. An explicit --gtest_filter is combined with that restriction
// (both must match). Started under its own name it runs everything, like gtest_main.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace {

// "dir/test_x.cpp" or "dir/test_x" -> "test_x"
std::string grouped_main_stem(std::string_view path) {
  const auto slash = path.find_last_of("/\\");
  if (slash != std::string_view::npos) path.remove_prefix(slash + 1);
  return std::string(path.substr(0, path.find('.')));
}

// GoogleTest's glob: '*' any run of characters, '?' one character.
bool grouped_main_glob(std::string_view pattern, std::string_view name) {
  if (pattern.empty()) return name.empty();
  if (pattern[0] == '*')
    return grouped_main_glob(pattern.substr(1), name) ||
           (!name.empty() && grouped_main_glob(pattern, name.substr(1)));
  return !name.empty() && (pattern[0] == '?' || pattern[0] == name[0]) &&
         grouped_main_glob(pattern.substr(1), name.substr(1));
}

bool grouped_main_any(std::string_view patterns, std::string_view name) {
  while (true) {
    const auto colon = patterns.find(':');
    if (grouped_main_glob(patterns.substr(0, colon), name)) return true;
    if (colon == std::string_view::npos) return false;
    patterns.remove_prefix(colon + 1);
  }
}

// GoogleTest's --gtest_filter semantics: "POSITIVE[-NEGATIVE]", each ':'-separated globs.
bool grouped_main_selected(std::string_view filter, std::string_view name) {
  const auto dash = filter.find('-');
  std::string_view positive = filter.substr(0, dash);
  if (positive.empty()) positive = "*";
  if (!grouped_main_any(positive, name)) return false;
  return dash == std::string_view::npos || !grouped_main_any(filter.substr(dash + 1), name);
}

// The filter naming every test defined in `stem`.cpp that `user_filter` also selects.
std::string grouped_main_file_filter(const std::string& stem, const std::string& user_filter) {
  std::string filter;
  const testing::UnitTest& all = *testing::UnitTest::GetInstance();
  for (int i = 0; i < all.total_test_suite_count(); ++i) {
    const testing::TestSuite& suite = *all.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j) {
      const testing::TestInfo& test = *suite.GetTestInfo(j);
      const std::string name = std::string(test.test_suite_name()) + '.' + test.name();
      if (grouped_main_stem(test.file()) != stem || !grouped_main_selected(user_filter, name)) continue;
      if (!filter.empty()) filter += ':';
      filter += name;
    }
  }
  return filter;
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const std::string self = grouped_main_stem(argc > 0 ? argv[0] : "");
  if (self.rfind("test_", 0) == 0) {
    const std::string only = grouped_main_file_filter(self, GTEST_FLAG_GET(filter));
    GTEST_FLAG_SET(filter, only.empty() ? std::string("-*") : only);
  }
  return RUN_ALL_TESTS();
}
