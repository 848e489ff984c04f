// A guard in front of toml++ (daemon layer): finds the non-ASCII text that toml++ cannot classify
// without undefined behaviour, so that parse_config() refuses it before toml++ sees it. A stopgap
// for a defect of toml++ 3.3 and 3.4 (toml_guard.cc says which, and when to delete this). Pure,
// thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace blkfence::daemon {

// "SOURCE:LINE:COLUMN: what" for the first byte of text that toml++ must not see, or nullopt when
// toml++ may parse all of it. Columns count code points, as toml++'s messages do.
std::optional<std::string> find_unsafe_toml_text(std::string_view text, std::string_view source);

}  // namespace blkfence::daemon
