// Proves the guard in front of toml++ (toml_guard.h): it finds every non-ASCII byte that toml++
// would classify (outside strings and comments, in keys and headers, after a backslash in a
// multi-line basic string) at the position toml++ would report, and lets non-ASCII text through
// in string values and comments, following TOML 1.0's four string forms to their true ends.
#include "toml_guard.h"

#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace blkfence::daemon {
namespace {

std::optional<std::string> unsafe(const std::string& text) {
  return find_unsafe_toml_text(text, "blkfence.toml");
}

const std::string kOutside =
    ": a non-ASCII character outside a string value or comment (keys and bare values are ASCII)";
const std::string kInKey = ": a non-ASCII character in a key (keys are ASCII)";
const std::string kAfterBackslash =
    ": a non-ASCII character right after a backslash in a multi-line string (toml++ cannot parse "
    "it there; write it as \\uXXXX)";

TEST(TomlGuard, NonAsciiTextInStringValuesAndCommentsPasses) {
  EXPECT_EQ(unsafe("# Zürich, \xe3\x81\x82\ncluster = \"é\"  # ü\n"), std::nullopt);
  EXPECT_EQ(
      unsafe("x = [\"/bin/é\", '\xe3\x81\x82', \"\"\"\xc2\xa7\n\xc2\xa7\"\"\", '''\xc2\xa7''']\n"),
      std::nullopt);
  EXPECT_EQ(unsafe("x = {a = \"é\"}\n"), std::nullopt);
  EXPECT_EQ(unsafe("\xef\xbb\xbf"
                   "cluster = \"c\"\n"),
            std::nullopt);  // a byte order mark
  EXPECT_EQ(unsafe(""), std::nullopt);
}

TEST(TomlGuard, NonAsciiOutsideStringsIsFoundWhereTomlWouldReportIt) {
  EXPECT_EQ(unsafe("cluster = \"c\"\n\xc3\xa9 = 1\n"), "blkfence.toml:2:1" + kOutside);
  EXPECT_EQ(unsafe("cluster = é\n"), "blkfence.toml:1:11" + kOutside);
  // Columns count code points: the é inside the string is one column.
  EXPECT_EQ(unsafe("cluster = \"é\"é\n"), "blkfence.toml:1:14" + kOutside);
  EXPECT_EQ(unsafe("\xcc\xaa"), "blkfence.toml:1:1" + kOutside);  // tomlplusplus#295
  EXPECT_EQ(unsafe("x = true\xc2\xa7\n"), "blkfence.toml:1:9" + kOutside);
}

TEST(TomlGuard, NonAsciiInKeysAndTableHeadersIsFound) {
  EXPECT_EQ(unsafe("\"é\" = 1\n"), "blkfence.toml:1:2" + kInKey);
  EXPECT_EQ(unsafe("a.'é' = 1\n"), "blkfence.toml:1:4" + kInKey);
  EXPECT_EQ(unsafe("[\"é\"]\n"), "blkfence.toml:1:3" + kInKey);
  EXPECT_EQ(unsafe("[[ a . \"é\" ]]\n"), "blkfence.toml:1:9" + kInKey);
  EXPECT_EQ(unsafe("x = [{a = \"é\", \"é\" = 1}]\n"), "blkfence.toml:1:17" + kInKey);
}

// tomlplusplus#190: a line-ending backslash, then (after the whitespace it trims) a non-ASCII
// character; or a non-ASCII character escaped.
TEST(TomlGuard, NonAsciiRightAfterABackslashInAMultiLineStringIsFound) {
  EXPECT_EQ(unsafe("s = \"\"\"\\\n\xc2\xa7\"\"\"\n"), "blkfence.toml:2:1" + kAfterBackslash);
  EXPECT_EQ(unsafe("s = \"\"\"a\\  \n\n  \xc2\xa7\"\"\"\n"), "blkfence.toml:3:3" + kAfterBackslash);
  EXPECT_EQ(unsafe("s = \"\"\"\\\xc2\xa7\"\"\"\n"), "blkfence.toml:1:9" + kAfterBackslash);
  EXPECT_EQ(unsafe("s = \"\"\"\\\\\xc2\xa7\"\"\"\n"), std::nullopt);  // an escaped backslash
}

// Quotes inside strings, escaped or next to the delimiter, do not end them early; so what follows
// a string is judged as what it is.
TEST(TomlGuard, StringsEndWhereTomlEndsThem) {
  EXPECT_EQ(unsafe("s = \"\"\"a\"\"\"\" é\n"), "blkfence.toml:1:14" + kOutside);
  EXPECT_EQ(unsafe("s = \"\\\"é\"\ncluster = 1\n"), std::nullopt);
  EXPECT_EQ(unsafe("s = '''a''''' # é\ncluster = 1\n"), std::nullopt);
  EXPECT_EQ(unsafe("s = \"\"\"a\\\\\"\"\" # é\ncluster = 1\n"), std::nullopt);
}

// toml++ reads a bare value (a number, a date, true) up to a value terminator, through quotes and
// brackets: so does the scan.
TEST(TomlGuard, BareValuesRunToAValueTerminator) {
  EXPECT_EQ(unsafe(std::string("node_id = 1\0\"\xcb\x9a\"\n", 17)),
            "blkfence.toml:1:14" + kOutside);
  EXPECT_EQ(unsafe("x = 1[\"é\"]\n"), "blkfence.toml:1:8" + kOutside);
  EXPECT_EQ(unsafe("x = .\"é\"\n"), "blkfence.toml:1:7" + kOutside);
  EXPECT_EQ(unsafe("x = 1=\"é\"\n"), "blkfence.toml:1:8" + kOutside);
  EXPECT_EQ(unsafe("x = []\"é\"\n"), "blkfence.toml:1:8" + kOutside);
  EXPECT_EQ(unsafe("x = 1 # é\n"), std::nullopt);
}

}  // namespace
}  // namespace blkfence::daemon
