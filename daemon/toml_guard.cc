// The guard in front of toml++ (daemon layer). See toml_guard.h.
//
// The defect: toml++ reaches __builtin_unreachable(), that is undefined behaviour, when it asks
// whether certain non-ASCII code points (U+00A1..U+0499, U+2C7E..U+3077, U+FB86..U+FEFE) are
// whitespace (marzer/tomlplusplus#190 and #295; a two-byte file, "\xcc\xaa", is enough). It asks
// for characters outside strings and comments, inside quoted keys and table headers, and after a
// backslash in a multi-line basic string; everywhere else (string values, comments) non-ASCII text
// is safe. None of those places can hold non-ASCII text in a valid blkfence.toml, so the scan below
// finds the first such byte. It follows TOML 1.0's comments and four string forms; where the text
// is not TOML, toml++ stops at the same place or earlier. tests/fuzz/config_fuzz.cc checks under
// UBSan that nothing gets through.
//
// When to delete this file: the defect is fixed upstream by marzer/tomlplusplus#305 (merged in
// July 2026), which is in no release yet: 3.4.0 is the latest, and Debian 12 ships 3.3.0. Once
// the toml++ that builds blkfence is a release that contains #305 (the first after 3.4.0), remove
// the guard and its call in parse_config(), and run config_fuzz under UBSan over its corpus and
// the inputs of toml_guard_test.cc to confirm.
#include "toml_guard.h"

#include <algorithm>
#include <vector>

namespace blkfence::daemon {
namespace {

class UnsafeTextScan {
 public:
  explicit UnsafeTextScan(std::string_view text) : text_(text) {}

  // The message for the first unsafe byte, with its position, or nullopt.
  std::optional<std::string> run(std::string_view source) {
    if (text_.starts_with("\xef\xbb\xbf")) {
      i_ = 3;  // a byte order mark, which toml++ skips
    }
    while (i_ < text_.size()) {
      const char c = text_[i_];
      if (is_non_ascii(c)) {
        return problem(source, kOutside);
      }
      const bool in_key = key_ || header_;
      if (c == '#') {
        skip_comment();
        continue;
      }
      if ((c == '"' || c == '\'') && token_start_) {
        if (auto found = skip_string(source, in_key)) {
          return found;
        }
        token_start_ = false;
        continue;
      }
      if (!in_key && !token_start_ && !is_terminator(c)) {
        // toml++ reads a bare value (a number, a date, true) up to a value terminator and asks
        // of every character whether it is one, quotes included.
        while (i_ < text_.size() && !is_terminator(text_[i_])) {
          if (is_non_ascii(text_[i_])) {
            return problem(source, kOutside);
          }
          ++i_;
        }
        continue;
      }
      step(c, in_key);
      ++i_;
    }
    return std::nullopt;
  }

 private:
  static constexpr std::string_view kOutside =
      "a non-ASCII character outside a string value or comment (keys and bare values are ASCII)";

  static bool is_non_ascii(char c) { return (static_cast<unsigned char>(c) & 0x80U) != 0; }
  // toml++'s is_value_terminator() for ASCII: whitespace (\n to \r are vertical), ",]}#".
  static bool is_terminator(char c) {
    return c == ' ' || c == '\t' || (c >= '\n' && c <= '\r') || c == ',' || c == ']' || c == '}' ||
           c == '#';
  }

  // One ASCII byte outside strings and comments: where keys, values, arrays and tables begin.
  void step(char c, bool in_key) {
    const bool was_token_start = token_start_;
    token_start_ = false;
    switch (c) {
      case '\n':
        if (stack_.empty()) {
          key_ = true;
          header_ = false;
        }
        token_start_ = true;
        break;
      case ' ':
      case '\t':
      case '\r': token_start_ = true; break;
      case '.': token_start_ = in_key; break;  // a dotted key; in a value, part of a number
      case '=':
        if (key_ && !header_) {
          key_ = false;
          token_start_ = true;
        }
        break;
      case '[':
        if (stack_.empty() && key_ && !header_ && was_token_start) {
          header_ = true;
          token_start_ = true;
        } else if (header_) {
          token_start_ = true;  // "[["
        } else if (!in_key && was_token_start) {
          stack_.push_back('[');
          token_start_ = true;
        }
        break;
      case ']':
        if (!header_ && !stack_.empty() && stack_.back() == '[') {
          stack_.pop_back();
        }
        break;
      case '{':
        if (!in_key && was_token_start) {
          stack_.push_back('{');
          key_ = true;
          token_start_ = true;
        }
        break;
      case '}':
        if (!header_ && !stack_.empty() && stack_.back() == '{') {
          stack_.pop_back();
          key_ = false;
        }
        break;
      case ',':
        if (!stack_.empty() && stack_.back() == '{') {
          key_ = true;
        }
        token_start_ = true;
        break;
      default: break;
    }
  }

  char at(std::size_t i) const { return i < text_.size() ? text_[i] : '\0'; }

  std::string problem(std::string_view source, std::string_view what) const {
    const std::size_t line_start = text_.rfind('\n', i_ == 0 ? 0 : i_ - 1);
    const std::size_t from = line_start == std::string_view::npos || i_ == 0 ? 0 : line_start + 1;
    const auto line =
        1 + std::count(text_.begin(), text_.begin() + static_cast<std::ptrdiff_t>(from), '\n');
    // Columns count code points, as toml++'s do: every byte but UTF-8 continuation bytes.
    const auto column =
        1 + std::count_if(text_.begin() + static_cast<std::ptrdiff_t>(from),
                          text_.begin() + static_cast<std::ptrdiff_t>(i_),
                          [](char c) { return (static_cast<unsigned char>(c) & 0xc0U) != 0x80U; });
    return std::string(source) + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " +
           std::string(what);
  }

  void skip_comment() {
    while (i_ < text_.size() && text_[i_] != '\n') {
      ++i_;
    }
  }

  // From the opening quote to after the closing one (or to the end of a single-line string's
  // line, or of the text, where toml++ reports the error).
  std::optional<std::string> skip_string(std::string_view source, bool in_key) {
    const char quote = text_[i_];
    const bool basic = quote == '"';
    const bool multi_line = at(i_ + 1) == quote && at(i_ + 2) == quote;
    i_ += multi_line ? 3 : 1;
    while (i_ < text_.size()) {
      const char c = text_[i_];
      if (is_non_ascii(c) && in_key) {
        return problem(source, "a non-ASCII character in a key (keys are ASCII)");
      }
      if (!multi_line && c == '\n') {
        return std::nullopt;
      }
      if (c == quote && !multi_line) {
        ++i_;
        return std::nullopt;
      }
      if (c == quote && at(i_ + 1) == quote && at(i_ + 2) == quote) {
        i_ += 3;
        // TOML 1.0: one or two quotes right before the delimiter belong to the string.
        for (int extra = 0; extra < 2 && at(i_) == quote; ++extra) {
          ++i_;
        }
        return std::nullopt;
      }
      if (basic && c == '\\') {
        ++i_;
        if (multi_line && i_ < text_.size()) {
          // A line-ending backslash: toml++ classifies the first character after the whitespace
          // and line breaks it trims; an escape: it classifies the escaped character.
          const bool trims =
              text_[i_] == ' ' || text_[i_] == '\t' || text_[i_] == '\r' || text_[i_] == '\n';
          while (
              trims && i_ < text_.size() &&
              (text_[i_] == ' ' || text_[i_] == '\t' || text_[i_] == '\r' || text_[i_] == '\n')) {
            ++i_;
          }
          if (i_ < text_.size() && is_non_ascii(text_[i_])) {
            return problem(source,
                           "a non-ASCII character right after a backslash in a multi-line "
                           "string (toml++ cannot parse it there; write it as \\uXXXX)");
          }
          if (trims) {
            continue;
          }
        }
        if (i_ < text_.size() && text_[i_] != '\n') {
          ++i_;  // the escaped character, a quote or a backslash included
        }
        continue;
      }
      ++i_;
    }
    return std::nullopt;
  }

  std::string_view text_;
  std::size_t i_ = 0;
  std::vector<char> stack_;  // '[' arrays and '{' inline tables open in a value
  bool key_ = true;          // the next string would be (part of) a key
  bool header_ = false;      // inside a [table] or [[array]] header
  bool token_start_ = true;  // after a separator: a quote here opens a string
};

}  // namespace

std::optional<std::string> find_unsafe_toml_text(std::string_view text, std::string_view source) {
  return UnsafeTextScan(text).run(source);
}

}  // namespace blkfence::daemon
