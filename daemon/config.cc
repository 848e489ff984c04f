// Parsing and validation of blkfence.toml (daemon layer). toml++ reads the text; everything after
// that is this file walking the tree with one precise message per problem. Pure but for
// load_config() reading the file; thread-safe.
#include "config.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <optional>
#include <span>
#include <utility>

#include <fcntl.h>
#include <tl/expected.hpp>

// Debian's libtomlplusplus.so is built with exceptions only (toml::v3::ex), and nothing here may
// throw: toml++ is compiled into this file, header-only and without exceptions, so parse() returns
// a parse_result. The fuzz build instruments the TOML parser this way too. The defines come first
// and the header is included by this file alone.
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 0
#define TOML_ENABLE_FORMATTERS 0
#include <toml++/toml.h>

#include "blkfence/control/duration.h"
#include "blkfence/control/text.h"
#include "blkfence/unique_fd.h"

#include "toml_guard.h"

namespace blkfence::daemon {
namespace {

using std::chrono::milliseconds;

// An internal result: the value or the complete message.
template <class T>
using Check = tl::expected<T, std::string>;
using Problem = tl::unexpected<std::string>;
using control::format_duration;
using control::is_valid_resource_name;
using control::kMaxNameSize;
using control::parse_duration;
using control::utf8_cut;

constexpr std::size_t kMaxResources = 256;
constexpr std::size_t kMaxDevices = 256;  // per resource
constexpr std::size_t kMaxUnits = 64;     // per resource
constexpr std::size_t kMaxCommandArgs = 64;
constexpr std::size_t kMaxPathSize = 4095;     // PATH_MAX less its NUL
constexpr std::size_t kMaxUnitNameSize = 255;  // systemd: UNIT_NAME_MAX less its NUL
constexpr std::size_t kMaxGroupNameSize = 32;  // useradd's limit
// sockaddr_un.sun_path is 108 bytes with its NUL; the daemon binds run_dir + "/control.sock".
constexpr std::size_t kMaxSocketPathSize = 107;
constexpr std::string_view kSocketName = "/control.sock";
constexpr std::size_t kMaxQuoted = 48;  // how much of a bad value a message repeats

constexpr milliseconds kCheckIntervalMin{10};
constexpr milliseconds kCheckIntervalMax{60'000};
constexpr milliseconds kLeaseMax{600'000};
constexpr milliseconds kCommandTimeoutMin{100};
constexpr milliseconds kCommandTimeoutMax{600'000};
constexpr int kKeysEveryMax = 1000;

// One value of an enum-like key, as the file spells it.
template <class T>
struct Choice {
  std::string_view name;
  T value;
};

constexpr std::array<Choice<codec::PrType>, 6> kPrTypes{{
    {"write-exclusive", codec::PrType::kWriteExclusive},
    {"exclusive-access", codec::PrType::kExclusiveAccess},
    {"write-exclusive-registrants-only", codec::PrType::kWriteExclusiveRegistrantsOnly},
    {"exclusive-access-registrants-only", codec::PrType::kExclusiveAccessRegistrantsOnly},
    {"write-exclusive-all-registrants", codec::PrType::kWriteExclusiveAllRegistrants},
    {"exclusive-access-all-registrants", codec::PrType::kExclusiveAccessAllRegistrants},
}};

constexpr std::array<Choice<Mode>, 3> kModes{{
    {"exclusive", Mode::kExclusive},
    {"shared", Mode::kShared},
    {"primary", Mode::kPrimary},
}};
// preempt: whether a takeover uses PREEMPT AND ABORT (the default, config.h).
constexpr std::array<Choice<bool>, 2> kPreempts{{
    {"preempt", false},
    {"preempt-and-abort", true},
}};
constexpr std::array<Choice<std::string_view>, 3> kTransports{{
    {"auto", "auto"},
    {"uring", "uring"},
    {"sgio", "sgio"},
}};

constexpr std::array<std::string_view, 11> kUnitSuffixes{
    ".service", ".socket", ".device", ".mount", ".automount", ".swap",
    ".target",  ".path",   ".timer",  ".slice", ".scope"};

constexpr std::array<std::string_view, 7> kTopKeys{
    "cluster", "node_id", "control_group", "state_dir", "run_dir", "transport", "resource"};
constexpr std::array<std::string_view, 15> kResourceKeys{"name",
                                                         "devices",
                                                         "mode",
                                                         "type",
                                                         "preempt",
                                                         "check_interval",
                                                         "check_interval_ms",
                                                         "lease",
                                                         "lease_ms",
                                                         "keys_every",
                                                         "command_timeout",
                                                         "command_timeout_ms",
                                                         "on_fenced",
                                                         "allow_reboot",
                                                         "units"};

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool is_printable_ascii(char c) {
  return c >= 0x20 && c <= 0x7e;
}
bool is_alnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
char to_lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

// A TOML basic string: what format_config() writes and what messages quote. toml++ hands over
// valid UTF-8, so only quotes, backslashes and control characters need escapes.
std::string toml_quote(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (byte < 0x20 || byte == 0x7f) {
          constexpr std::string_view kHex = "0123456789ABCDEF";
          out += "\\u00";
          out += kHex[byte >> 4U];
          out += kHex[byte & 0x0fU];
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

// A value as a message repeats it: strings quoted (and cut), numbers as written, else the kind.
std::string describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: {
      const std::string& text = node.as_string()->get();
      const std::size_t cut = utf8_cut(text, kMaxQuoted);
      std::string quoted = toml_quote(std::string_view(text).substr(0, cut));
      if (cut < text.size()) {
        quoted += "...";
      }
      return quoted;
    }
    case toml::node_type::integer: return std::to_string(node.as_integer()->get());
    case toml::node_type::floating_point: {
      char text[32];  // %g of a double is at most 13 characters: snprintf cannot truncate
      (void)std::snprintf(text, sizeof text, "%g", node.as_floating_point()->get());
      return text;
    }
    case toml::node_type::boolean: return node.as_boolean()->get() ? "true" : "false";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

// "source:line:column", or the parts of it that are known.
std::string position(std::string_view source, const toml::source_position& at,
                     bool with_column = true) {
  std::string text(source);
  if (at.line > 0) {
    text += ':';
    text += std::to_string(at.line);
    if (with_column && at.column > 0) {
      text += ':';
      text += std::to_string(at.column);
    }
  }
  return text;
}

// One table being read: the top level, or one [[resource]] with its label for messages.
class TableReader {
 public:
  TableReader(std::string_view source, const toml::table& table, std::string label)
      : source_(source), table_(table), label_(std::move(label)) {}

  void set_label(std::string label) { label_ = std::move(label); }
  const toml::node* find(std::string_view key) const { return table_.get(key); }

  // `source:L:C: resource "x": key: what`, pointing at node.
  std::string at(const toml::node& node, std::string_view key, std::string_view what) const {
    return prefix(position(source_, node.source().begin)) + std::string(key) + ": " +
           std::string(what);
  }
  // A problem that is not one key's alone (a relation between two), pointing at node.
  std::string at(const toml::node& node, std::string_view what) const {
    return prefix(position(source_, node.source().begin)) + std::string(what);
  }
  // A key that is not there: points at the table's header, or only at the file at the top level.
  std::string missing(std::string_view key, std::string_view what) const {
    const std::string where =
        label_.empty() ? std::string(source_) : position(source_, table_.source().begin, false);
    return prefix(where) + std::string(key) + ": missing (" + std::string(what) + ")";
  }
  // A problem of the table as a whole, pointing at its header.
  std::string whole(std::string_view what) const {
    return prefix(position(source_, table_.source().begin, false)) + std::string(what);
  }

  // The first key (in document order) that is not one of known.
  std::optional<std::string> unknown_key(std::span<const std::string_view> known) const {
    const toml::key* first = nullptr;
    for (const auto& [key, node] : table_) {
      if (std::find(known.begin(), known.end(), key.str()) != known.end()) {
        continue;
      }
      const auto& begin = key.source().begin;
      if (first == nullptr || begin.line < first->source().begin.line ||
          (begin.line == first->source().begin.line &&
           begin.column < first->source().begin.column)) {
        first = &key;
      }
    }
    if (first == nullptr) {
      return std::nullopt;
    }
    std::string known_list;
    for (const std::string_view name : known) {
      known_list += known_list.empty() ? "" : ", ";
      known_list += name;
    }
    const std::size_t cut = utf8_cut(first->str(), kMaxQuoted);
    return prefix(position(source_, first->source().begin)) + "unknown key " +
           toml_quote(first->str().substr(0, cut)) + (cut < first->str().size() ? "..." : "") +
           " (expected one of: " + known_list + ")";
  }

 private:
  std::string prefix(std::string where) const {
    where += ": ";
    if (!label_.empty()) {
      where += label_;
      where += ": ";
    }
    return where;
  }

  std::string_view source_;
  const toml::table& table_;
  std::string label_;
};

// The node at key when it has the type, nullptr when absent, an error otherwise.
Check<const toml::node*> typed(const TableReader& reader, std::string_view key,
                               toml::node_type type, std::string_view expected) {
  const toml::node* node = reader.find(key);
  if (node == nullptr || node->type() == type) {
    return node;
  }
  return Problem(
      reader.at(*node, key, "expected " + std::string(expected) + ", got " + describe(*node)));
}

// An optional string. `expected` says what a valid value looks like.
Check<std::optional<std::string>> optional_string(const TableReader& reader, std::string_view key,
                                                  std::string_view expected) {
  auto node = typed(reader, key, toml::node_type::string, expected);
  if (!node) {
    return Problem(std::move(node.error()));
  }
  if (*node == nullptr) {
    return std::optional<std::string>();
  }
  return std::optional<std::string>((*node)->as_string()->get());
}

// An enum-like key: a string that must be one of choices. Sets value when the key is present and
// yields its node (nullptr when absent, value untouched); the message lists every choice.
template <class T, std::size_t N>
Check<const toml::node*> read_choice(const TableReader& reader, std::string_view key,
                                     const std::array<Choice<T>, N>& choices, T& value) {
  std::string expected;
  for (std::size_t i = 0; i < N; ++i) {
    expected += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + toml_quote(choices[i].name);
  }
  auto node = typed(reader, key, toml::node_type::string, expected);
  if (!node || *node == nullptr) {
    return node;
  }
  const std::string& text = (*node)->as_string()->get();
  const auto* found = std::find_if(choices.begin(), choices.end(),
                                   [&](const Choice<T>& choice) { return choice.name == text; });
  if (found == choices.end()) {
    return Problem(reader.at(**node, key, "expected " + expected + ", got " + describe(**node)));
  }
  value = found->value;
  return node;
}

bool has_control_character(std::string_view text) {
  return std::any_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

bool is_valid_cluster_name(std::string_view name) {
  return !name.empty() && name.size() <= kMaxNameSize && name.front() != ' ' &&
         name.back() != ' ' && std::all_of(name.begin(), name.end(), is_printable_ascii);
}

bool is_valid_group_name(std::string_view name) {
  return !name.empty() && name.size() <= kMaxGroupNameSize && name.front() != '-' &&
         std::all_of(name.begin(), name.end(),
                     [](char c) { return is_alnum(c) || c == '_' || c == '.' || c == '-'; });
}

bool is_valid_dir(std::string_view path) {
  return !path.empty() && path.front() == '/' && path.size() <= kMaxPathSize &&
         !has_control_character(path);
}

// Whether the path has a ".." component: configuration names devices directly.
bool has_dot_dot(std::string_view path) {
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t end = std::min(path.find('/', start), path.size());
    if (path.substr(start, end - start) == "..") {
      return true;
    }
    start = end + 1;
  }
  return false;
}

// A device as the configuration names it: a WWN in the form discovery reports (lower-case prefix
// and hex, inquiry.h: designator_string()), or an absolute /dev path. nullopt when neither.
std::optional<std::string> normalize_device(std::string_view text) {
  if (text.starts_with("/dev/")) {
    if (text.size() == 5 || text.size() > kMaxPathSize || has_control_character(text) ||
        text.back() == '/' || has_dot_dot(text)) {
      return std::nullopt;
    }
    return std::string(text);
  }
  if (text.size() < 4) {
    return std::nullopt;
  }
  std::string prefix;
  for (const char c : text.substr(0, 4)) {
    prefix += to_lower(c);
  }
  const std::string_view body = text.substr(4);
  if (prefix == "naa." || prefix == "eui.") {
    // NAA designators are 8 or 16 bytes (SPC-4 7.8.6.6), EUI-64 ones 8, 12 or 16 (7.8.6.5).
    const bool size_ok = prefix == "naa."
                             ? (body.size() == 16 || body.size() == 32)
                             : (body.size() == 16 || body.size() == 24 || body.size() == 32);
    if (!size_ok || !std::all_of(body.begin(), body.end(), is_hex)) {
      return std::nullopt;
    }
    std::string wwn = prefix;
    for (const char c : body) {
      wwn += to_lower(c);
    }
    return wwn;
  }
  if (prefix == "t10.") {
    // SPC-4 7.8.6.4: an ASCII vendor id and identifier, spaces included, in a 252-byte designator.
    if (body.empty() || body.size() > 252 ||
        !std::all_of(body.begin(), body.end(), is_printable_ascii)) {
      return std::nullopt;
    }
    return prefix + std::string(body);
  }
  return std::nullopt;
}

// systemd's unit name rules (unit-name.c): [A-Za-z0-9:_.\@-], at most 255 bytes, a unit type
// suffix.
bool is_valid_unit_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxUnitNameSize) {
    return false;
  }
  const bool chars_ok = std::all_of(name.begin(), name.end(), [](char c) {
    return is_alnum(c) || c == ':' || c == '_' || c == '.' || c == '\\' || c == '@' || c == '-';
  });
  const std::size_t dot = name.rfind('.');
  return chars_ok && dot != std::string_view::npos && dot > 0 &&
         std::find(kUnitSuffixes.begin(), kUnitSuffixes.end(), name.substr(dot)) !=
             kUnitSuffixes.end();
}

// A duration key: `key = "1s"` (canonical) or `key_ms = 1000`. Yields the value and the node
// that set it (nullptr for the default), so later checks can point at it.
struct Duration {
  milliseconds value;
  const toml::node* node;
};

Check<Duration> read_duration(const TableReader& reader, std::string_view key,
                              milliseconds fallback, milliseconds min, milliseconds max) {
  const std::string ms_key = std::string(key) + "_ms";
  const toml::node* text_node = reader.find(key);
  const toml::node* ms_node = reader.find(ms_key);
  const std::string range = format_duration(min) + ".." + format_duration(max);
  if (text_node != nullptr && ms_node != nullptr) {
    const toml::node& later =
        ms_node->source().begin.line >= text_node->source().begin.line ? *ms_node : *text_node;
    const std::string_view later_key = &later == ms_node ? std::string_view(ms_key) : key;
    return Problem(reader.at(later, later_key,
                             "set either " + std::string(key) + " or " + ms_key + ", not both"));
  }
  if (ms_node != nullptr) {
    const std::string expected = "an integer number of milliseconds " +
                                 std::to_string(min.count()) + ".." + std::to_string(max.count());
    if (!ms_node->is_integer()) {
      return Problem(
          reader.at(*ms_node, ms_key, "expected " + expected + ", got " + describe(*ms_node)));
    }
    const std::int64_t value = ms_node->as_integer()->get();
    if (value < min.count() || value > max.count()) {
      return Problem(
          reader.at(*ms_node, ms_key, "expected " + expected + ", got " + describe(*ms_node)));
    }
    return Duration{milliseconds(value), ms_node};
  }
  if (text_node == nullptr) {
    return Duration{fallback, nullptr};
  }
  const std::string expected = std::string(control::kDurationSyntax) + ", in " + range;
  if (text_node->is_integer()) {
    return Problem(reader.at(*text_node, key,
                             "expected " + expected + ", got " + describe(*text_node) +
                                 " (without a unit; or write " + ms_key + " = " +
                                 describe(*text_node) + ")"));
  }
  if (!text_node->is_string()) {
    return Problem(
        reader.at(*text_node, key, "expected " + expected + ", got " + describe(*text_node)));
  }
  const auto value = parse_duration(text_node->as_string()->get());
  if (!value) {
    return Problem(
        reader.at(*text_node, key, "expected " + expected + ", got " + describe(*text_node)));
  }
  if (*value < min || *value > max) {
    return Problem(
        reader.at(*text_node, key, format_duration(*value) + " is out of range (" + range + ")"));
  }
  return Duration{*value, text_node};
}

// The node to blame for a relation between two durations: the one the file set, preferring
// `first`; else the table's header.
std::string relation_problem(const TableReader& reader, const Duration& first,
                             const Duration& second, std::string_view what) {
  if (first.node != nullptr) {
    return reader.at(*first.node, what);
  }
  if (second.node != nullptr) {
    return reader.at(*second.node, what);
  }
  return reader.whole(what);
}

std::string with_default(const Duration& duration) {
  return format_duration(duration.value) + (duration.node == nullptr ? ", the default" : "");
}

// An array of strings at key, each element checked by `accept` (which returns the value to keep
// or nullopt); duplicates refused. An absent key is an empty vector.
template <class Accept>
Check<std::vector<std::string>> read_string_list(const TableReader& reader, std::string_view key,
                                                 std::size_t max_count, std::string_view expected,
                                                 const Accept& accept) {
  const std::string expected_array = "an array of " + std::string(expected);
  auto node = typed(reader, key, toml::node_type::array, expected_array);
  if (!node) {
    return Problem(std::move(node.error()));
  }
  std::vector<std::string> values;
  if (*node == nullptr) {
    return values;
  }
  const toml::array& array = *(*node)->as_array();
  if (array.size() > max_count) {
    return Problem(reader.at(
        **node, key,
        "at most " + std::to_string(max_count) + " entries, got " + std::to_string(array.size())));
  }
  for (const toml::node& element : array) {
    const std::optional<std::string> value =
        element.is_string() ? accept(element.as_string()->get()) : std::nullopt;
    if (!value) {
      return Problem(reader.at(element, key,
                               "expected " + std::string(expected) + ", got " + describe(element)));
    }
    if (std::find(values.begin(), values.end(), *value) != values.end()) {
      return Problem(reader.at(element, key, toml_quote(*value) + " is listed twice"));
    }
    values.push_back(*value);
  }
  return values;
}

Check<OnFenced> read_on_fenced(const TableReader& reader, bool units_given) {
  constexpr std::string_view kKey = "on_fenced";
  constexpr std::string_view kExpected =
      "\"none\", \"stop-units\", \"kill-units\", \"reboot\" or a command as an array "
      "[\"/path/to/program\", \"arg\", ...]";
  auto allow_reboot = typed(reader, "allow_reboot", toml::node_type::boolean, "true or false");
  if (!allow_reboot) {
    return Problem(std::move(allow_reboot.error()));
  }
  OnFenced on_fenced;
  const toml::node* node = reader.find(kKey);
  if (node == nullptr) {
    return on_fenced;
  }
  if (const toml::array* argv = node->as_array()) {
    if (argv->empty() || argv->size() > kMaxCommandArgs) {
      return Problem(reader.at(*node, kKey,
                               "a command needs its program and at most " +
                                   std::to_string(kMaxCommandArgs - 1) + " arguments, got " +
                                   std::to_string(argv->size()) + " entries"));
    }
    on_fenced.action = OnFencedAction::kCommand;
    for (const toml::node& element : *argv) {
      const bool first = on_fenced.command.empty();
      if (!element.is_string() || element.as_string()->get().find('\0') != std::string::npos ||
          (first && !element.as_string()->get().starts_with('/'))) {
        return Problem(reader.at(element, kKey,
                                 std::string(first ? "the program: expected an absolute path"
                                                   : "an argument: expected a string") +
                                     " without NUL characters, got " + describe(element)));
      }
      on_fenced.command.push_back(element.as_string()->get());
    }
    return on_fenced;
  }
  if (!node->is_string()) {
    return Problem(
        reader.at(*node, kKey, "expected " + std::string(kExpected) + ", got " + describe(*node)));
  }
  const std::string& name = node->as_string()->get();
  if (name == "none") {
    on_fenced.action = OnFencedAction::kNone;
  } else if (name == "stop-units" || name == "kill-units") {
    on_fenced.action =
        name == "stop-units" ? OnFencedAction::kStopUnits : OnFencedAction::kKillUnits;
    if (!units_given) {
      return Problem(reader.at(*node, kKey,
                               "\"" + name +
                                   "\" needs the units to act on: set units = "
                                   "[\"name.service\", ...] in this [[resource]]"));
    }
  } else if (name == "reboot") {
    const bool allowed = *allow_reboot != nullptr && (*allow_reboot)->as_boolean()->get();
    if (!allowed) {
      return Problem(reader.at(*node, kKey,
                               "\"reboot\" reboots this node when the resource is fenced; it "
                               "needs allow_reboot = true in the same [[resource]] as an explicit "
                               "opt-in"));
    }
    on_fenced.action = OnFencedAction::kReboot;
  } else if (name == "command") {
    return Problem(reader.at(*node, kKey,
                             "give the command itself as an array: on_fenced = "
                             "[\"/path/to/program\", \"arg\", ...]"));
  } else {
    return Problem(
        reader.at(*node, kKey, "expected " + std::string(kExpected) + ", got " + describe(*node)));
  }
  return on_fenced;
}

Check<ResourceConfig> read_resource(std::string_view source, const toml::table& table,
                                    std::size_t index) {
  // Messages name the resource by its name as soon as it has a valid one, else by its position.
  const toml::node* name_node = table.get("name");
  const bool has_name = name_node != nullptr && name_node->is_string() &&
                        is_valid_resource_name(name_node->as_string()->get());
  TableReader reader(source, table,
                     has_name ? "resource \"" + name_node->as_string()->get() + "\""
                              : "resource #" + std::to_string(index + 1));
  if (auto unknown = reader.unknown_key(kResourceKeys)) {
    return Problem(std::move(*unknown));
  }
  ResourceConfig resource;

  constexpr std::string_view kNameExpected = "a name of 1..64 characters A-Z a-z 0-9 _ . -";
  auto name = optional_string(reader, "name", kNameExpected);
  if (!name) {
    return Problem(std::move(name.error()));
  }
  if (!*name) {
    return Problem(reader.missing("name", "the resource's name, as blkfencectl calls it"));
  }
  if (!is_valid_resource_name(**name)) {
    return Problem(reader.at(
        *reader.find("name"), "name",
        "expected " + std::string(kNameExpected) + ", got " + describe(*reader.find("name"))));
  }
  resource.name = std::move(**name);
  reader.set_label("resource \"" + resource.name + "\"");

  auto devices = read_string_list(
      reader, "devices", kMaxDevices,
      "a WWN (\"naa.\", \"eui.\" or \"t10.\" as the kernel's wwid shows it) or an absolute /dev/ "
      "path",
      normalize_device);
  if (!devices) {
    return Problem(std::move(devices.error()));
  }
  if (devices->empty()) {
    return Problem(reader.find("devices") == nullptr
                       ? reader.missing("devices", "the LUs of this resource, by WWN or /dev path")
                       : reader.at(*reader.find("devices"), "devices", "at least one device"));
  }
  resource.devices = std::move(*devices);

  if (auto mode = read_choice(reader, "mode", kModes, resource.mode); !mode) {
    return Problem(std::move(mode.error()));
  }

  auto type = read_choice(reader, "type", kPrTypes, resource.type);
  if (!type) {
    return Problem(std::move(type.error()));
  }
  if (*type == nullptr && resource.mode == Mode::kShared) {
    resource.type = codec::PrType::kWriteExclusiveAllRegistrants;
  }
  if (*type != nullptr) {
    // Shared mode: under any other type the reservation goes with the one nexus that holds it,
    // and a holding member's release or fence leaves the LUs unreserved, open to every nexus, a
    // fenced member's included (docs/protocol.md, "Shared mode").
    if (resource.mode == Mode::kShared && !codec::is_all_registrants(resource.type)) {
      return Problem(reader.at(
          *reader.find("type"), "type",
          "mode = \"shared\" needs an all-registrants type: under \"" +
              std::string(pr_type_name(resource.type)) +
              "\" the reservation leaves with the member that holds it, and the LUs are open to "
              "every nexus, a fenced member's included, until another member reserves them; use "
              "\"write-exclusive-all-registrants\" (the default)"));
    }
    // SPC-4 5.13.10: under an all-registrants type READ RESERVATION reports key 0 as the holder,
    // so "our key holds" (docs/protocol.md, S2) could never be verified.
    if (resource.mode != Mode::kShared && codec::is_all_registrants(resource.type)) {
      return Problem(reader.at(*reader.find("type"), "type",
                               "an all-registrants type cannot be used with mode = \"" +
                                   std::string(to_string(resource.mode)) +
                                   "\": every registrant holds it, so no single holder "
                                   "can be verified; use \"write-exclusive-registrants-only\""));
    }
  }

  if (auto preempt = read_choice(reader, "preempt", kPreempts, resource.preempt_abort); !preempt) {
    return Problem(std::move(preempt.error()));
  }

  const auto interval = read_duration(reader, "check_interval", resource.check_interval,
                                      kCheckIntervalMin, kCheckIntervalMax);
  if (!interval) {
    return Problem(interval.error());
  }
  const auto lease = read_duration(reader, "lease", resource.lease,
                                   kCheckIntervalMin + milliseconds(1), kLeaseMax);
  if (!lease) {
    return Problem(lease.error());
  }
  const auto timeout = read_duration(reader, "command_timeout", resource.command_timeout,
                                     kCommandTimeoutMin, kCommandTimeoutMax);
  if (!timeout) {
    return Problem(timeout.error());
  }
  if (lease->value <= interval->value) {
    return Problem(relation_problem(reader, *lease, *interval,
                                    "lease (" + with_default(*lease) +
                                        ") must be longer than check_interval (" +
                                        with_default(*interval) + ")"));
  }
  if (timeout->value >= lease->value) {
    return Problem(relation_problem(reader, *timeout, *lease,
                                    "command_timeout (" + with_default(*timeout) +
                                        ") must be shorter than lease (" + with_default(*lease) +
                                        ")"));
  }
  resource.check_interval = interval->value;
  resource.lease = lease->value;
  resource.command_timeout = timeout->value;

  const std::string keys_expected = "an integer 1.." + std::to_string(kKeysEveryMax);
  auto keys_every = typed(reader, "keys_every", toml::node_type::integer, keys_expected);
  if (!keys_every) {
    return Problem(std::move(keys_every.error()));
  }
  if (*keys_every != nullptr) {
    const std::int64_t value = (*keys_every)->as_integer()->get();
    if (value < 1 || value > kKeysEveryMax) {
      return Problem(reader.at(**keys_every, "keys_every",
                               "expected " + keys_expected + ", got " + describe(**keys_every)));
    }
    resource.keys_every = static_cast<int>(value);
  }

  auto units = read_string_list(reader, "units", kMaxUnits,
                                "a systemd unit name such as \"postgresql.service\"",
                                [](std::string_view unit) -> std::optional<std::string> {
                                  if (!is_valid_unit_name(unit)) {
                                    return std::nullopt;
                                  }
                                  return std::string(unit);
                                });
  if (!units) {
    return Problem(std::move(units.error()));
  }
  resource.units = std::move(*units);

  auto on_fenced = read_on_fenced(reader, !resource.units.empty());
  if (!on_fenced) {
    return Problem(std::move(on_fenced.error()));
  }
  resource.on_fenced = std::move(*on_fenced);
  return resource;
}

// A device named by two resources would be reserved twice, by different keys: the second acquire
// would fence the first resource. Only the spelling can be compared here; the daemon compares the
// LUs' WWNs once it has resolved the devices (shared_lu() in daemon.cc), which catches a LU named
// once by WWN and once by path.
std::optional<std::string> shared_device(const std::vector<ResourceConfig>& resources,
                                         const ResourceConfig& resource) {
  for (const ResourceConfig& other : resources) {
    for (const std::string& device : resource.devices) {
      if (std::find(other.devices.begin(), other.devices.end(), device) != other.devices.end()) {
        return toml_quote(device) + " is already a device of resource \"" + other.name +
               "\": a LU belongs to one resource";
      }
    }
  }
  return std::nullopt;
}

Check<std::vector<ResourceConfig>> read_resources(std::string_view source, const TableReader& top) {
  constexpr std::string_view kExpected = "[[resource]] tables (an array of tables)";
  const toml::node* node = top.find("resource");
  if (node == nullptr) {
    return Problem(top.missing("resource", "at least one [[resource]] table"));
  }
  const toml::array* array = node->as_array();
  if (array == nullptr) {
    return Problem(top.at(*node, "resource",
                          "expected " + std::string(kExpected) + ", got " + describe(*node) +
                              (node->is_table() ? "; write [[resource]], not [resource]" : "")));
  }
  if (array->empty()) {
    return Problem(top.at(*node, "resource", "at least one [[resource]] table"));
  }
  if (array->size() > kMaxResources) {
    return Problem(top.at(*node, "resource",
                          "at most " + std::to_string(kMaxResources) + " resources, got " +
                              std::to_string(array->size())));
  }
  std::vector<ResourceConfig> resources;
  for (std::size_t i = 0; i < array->size(); ++i) {
    const toml::node& element = *array->get(i);
    const toml::table* table = element.as_table();
    if (table == nullptr) {
      return Problem(top.at(element, "resource",
                            "expected " + std::string(kExpected) + ", got " + describe(element)));
    }
    auto resource = read_resource(source, *table, i);
    if (!resource) {
      return Problem(std::move(resource.error()));
    }
    const TableReader reader(source, *table, "resource \"" + resource->name + "\"");
    const auto same_name = [&](const ResourceConfig& other) {
      return other.name == resource->name;
    };
    if (std::any_of(resources.begin(), resources.end(), same_name)) {
      return Problem(reader.at(*table->get("name"), "name",
                               "another [[resource]] has this name already; names are unique"));
    }
    if (auto shared = shared_device(resources, *resource)) {
      return Problem(reader.at(*table->get("devices"), "devices", *shared));
    }
    resources.push_back(std::move(*resource));
  }
  return resources;
}

Check<Config> read_config(std::string_view source, const toml::table& root) {
  const TableReader top(source, root, "");
  if (auto unknown = top.unknown_key(kTopKeys)) {
    return Problem(std::move(*unknown));
  }
  Config config;

  constexpr std::string_view kClusterExpected = "1..64 printable ASCII characters";
  auto cluster = optional_string(top, "cluster", kClusterExpected);
  if (!cluster) {
    return Problem(std::move(cluster.error()));
  }
  if (!*cluster) {
    return Problem(top.missing("cluster", "the cluster's name, the same on every node"));
  }
  if (!is_valid_cluster_name(**cluster)) {
    return Problem(top.at(*top.find("cluster"), "cluster",
                          "expected " + std::string(kClusterExpected) +
                              " (no space at either end), got " + describe(*top.find("cluster"))));
  }
  config.cluster = std::move(**cluster);

  constexpr std::string_view kNodeExpected = "an integer 1..65535";
  const toml::node* node_id = top.find("node_id");
  if (node_id == nullptr) {
    return Problem(top.missing("node_id", "this node's id, 1..65535, unique in the cluster"));
  }
  if (!node_id->is_integer() || node_id->as_integer()->get() < 1 ||
      node_id->as_integer()->get() > 65535) {
    return Problem(
        top.at(*node_id, "node_id",
               "expected " + std::string(kNodeExpected) + ", got " + describe(*node_id)));
  }
  config.node_id = static_cast<std::uint16_t>(node_id->as_integer()->get());

  constexpr std::string_view kGroupExpected =
      "a unix group name (1..32 characters A-Z a-z 0-9 _ . -, not starting with -)";
  auto group = optional_string(top, "control_group", kGroupExpected);
  if (!group) {
    return Problem(std::move(group.error()));
  }
  if (*group) {
    if (!is_valid_group_name(**group)) {
      return Problem(
          top.at(*top.find("control_group"), "control_group",
                 "expected " + std::string(kGroupExpected) + ", got " +
                     describe(*top.find("control_group")) +
                     ((*group)->empty() ? "; leave the key out to allow root only" : "")));
    }
    config.control_group = std::move(**group);
  }

  constexpr std::string_view kDirExpected = "an absolute path";
  for (const auto& [key, target] :
       {std::pair<std::string_view, std::string*>{"state_dir", &config.state_dir},
        {"run_dir", &config.run_dir}}) {
    auto dir = optional_string(top, key, kDirExpected);
    if (!dir) {
      return Problem(std::move(dir.error()));
    }
    if (*dir) {
      if (!is_valid_dir(**dir)) {
        return Problem(
            top.at(*top.find(key), key,
                   "expected " + std::string(kDirExpected) + ", got " + describe(*top.find(key))));
      }
      *target = std::move(**dir);
    }
  }
  if (const toml::node* run_dir = top.find("run_dir");
      run_dir != nullptr && config.run_dir.size() + kSocketName.size() > kMaxSocketPathSize) {
    return Problem(top.at(*run_dir, "run_dir",
                          "too long: the control socket, run_dir + \"" + std::string(kSocketName) +
                              "\", must fit in " + std::to_string(kMaxSocketPathSize) +
                              " bytes (sockaddr_un)"));
  }

  std::string_view transport = config.transport;
  if (auto set = read_choice(top, "transport", kTransports, transport); !set) {
    return Problem(std::move(set.error()));
  }
  config.transport = std::string(transport);

  auto resources = read_resources(source, top);
  if (!resources) {
    return Problem(std::move(resources.error()));
  }
  config.resources = std::move(*resources);
  return config;
}

void append_key(std::string& out, std::string_view key, std::string_view value) {
  out += key;
  out += " = ";
  out += value;
  out += '\n';
}

std::string toml_array(const std::vector<std::string>& values) {
  std::string out = "[";
  for (const std::string& value : values) {
    out += out.size() > 1 ? ", " : "";
    out += toml_quote(value);
  }
  out += ']';
  return out;
}

}  // namespace

std::string_view to_string(Mode mode) {
  switch (mode) {
    case Mode::kExclusive: return "exclusive";
    case Mode::kShared: return "shared";
    case Mode::kPrimary: return "primary";
  }
  return "unknown";
}

std::string_view to_string(OnFencedAction action) {
  switch (action) {
    case OnFencedAction::kNone: return "none";
    case OnFencedAction::kStopUnits: return "stop-units";
    case OnFencedAction::kKillUnits: return "kill-units";
    case OnFencedAction::kCommand: return "command";
    case OnFencedAction::kReboot: return "reboot";
  }
  return "unknown";
}

std::string_view pr_type_name(codec::PrType type) {
  const auto* found =
      std::find_if(kPrTypes.begin(), kPrTypes.end(),
                   [&](const Choice<codec::PrType>& named) { return named.value == type; });
  return found == kPrTypes.end() ? "unknown" : found->name;
}

Result<Config> parse_config(std::string_view text, std::string_view source_name) {
  const std::string source(source_name);
  if (auto unsafe = find_unsafe_toml_text(text, source)) {
    return fail(ErrorCode::kInvalidArgument, std::move(*unsafe));
  }
  toml::parse_result parsed = toml::parse(text, std::string_view(source));
  if (!parsed) {
    const toml::parse_error& error = parsed.error();
    return fail(ErrorCode::kInvalidArgument,
                position(source, error.source().begin) + ": " + std::string(error.description()));
  }
  auto config = read_config(source, parsed.table());
  if (!config) {
    return fail(ErrorCode::kInvalidArgument, std::move(config.error()));
  }
  return std::move(*config);
}

Result<Config> load_config(const std::string& path) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) {
    return tl::unexpected(Error::os(errno, "cannot open " + path));
  }
  std::string text;
  std::array<char, 16384> buffer{};
  while (true) {
    const ssize_t got = ::read(fd.get(), buffer.data(), buffer.size());
    if (got < 0) {
      if (errno == EINTR) {
        continue;
      }
      return tl::unexpected(Error::os(errno, "cannot read " + path));
    }
    if (got == 0) {
      break;
    }
    text.append(buffer.data(), static_cast<std::size_t>(got));
    if (text.size() > kMaxConfigSize) {
      return fail(ErrorCode::kInvalidArgument, path + ": larger than " +
                                                   std::to_string(kMaxConfigSize / 1024) +
                                                   " KiB; not a blkfence configuration");
    }
  }
  return parse_config(text, path);
}

std::string format_config(const Config& config) {
  std::string out;
  append_key(out, "cluster", toml_quote(config.cluster));
  append_key(out, "node_id", std::to_string(config.node_id));
  if (!config.control_group.empty()) {
    append_key(out, "control_group", toml_quote(config.control_group));
  }
  append_key(out, "state_dir", toml_quote(config.state_dir));
  append_key(out, "run_dir", toml_quote(config.run_dir));
  append_key(out, "transport", toml_quote(config.transport));
  for (const ResourceConfig& resource : config.resources) {
    out += "\n[[resource]]\n";
    append_key(out, "name", toml_quote(resource.name));
    append_key(out, "devices", toml_array(resource.devices));
    append_key(out, "mode", toml_quote(to_string(resource.mode)));
    append_key(out, "type", toml_quote(pr_type_name(resource.type)));
    append_key(out, "preempt", resource.preempt_abort ? "\"preempt-and-abort\"" : "\"preempt\"");
    append_key(out, "check_interval", toml_quote(format_duration(resource.check_interval)));
    append_key(out, "lease", toml_quote(format_duration(resource.lease)));
    append_key(out, "keys_every", std::to_string(resource.keys_every));
    append_key(out, "command_timeout", toml_quote(format_duration(resource.command_timeout)));
    // "stop-units" without units is the default only: spelled out, parse_config() refuses it.
    const OnFencedAction action = resource.on_fenced.action;
    if (action == OnFencedAction::kCommand) {
      append_key(out, "on_fenced", toml_array(resource.on_fenced.command));
    } else if (action != OnFencedAction::kStopUnits || !resource.units.empty()) {
      append_key(out, "on_fenced", toml_quote(to_string(action)));
    }
    if (action == OnFencedAction::kReboot) {
      append_key(out, "allow_reboot", "true");
    }
    if (!resource.units.empty()) {
      append_key(out, "units", toml_array(resource.units));
    }
  }
  return out;
}

}  // namespace blkfence::daemon
