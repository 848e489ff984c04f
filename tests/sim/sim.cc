// blkfence_sim: the deterministic multi-node simulation of the exclusive protocol, and with
// --shared of the shared mode too (tests/sim).
//
// One seed is one world (world.h): a SimClock, a SimTarget with 1-4 LUs, and 2-3 nodes (node.cc),
// each with 1-2 nexuses per LU (in half the seeds paths come and go), its own SimTransport (seeded
// faults: lost, late and duplicated answers, late execution, unit attentions) behind a recording
// decorator, its own pr::Engine and fence::Resource and its epoch store (its disk, which survives
// daemon restarts), and a writer that writes stamped blocks to every LU while its gate is open. A
// scenario drawn from the seed (world.cc) acquires (often two nodes at once), releases, pauses
// daemons (with or without their writer), cuts links and restarts daemons over 30-120 s of
// simulated time (in shared mode it unfences instead of acquiring, and nodes fence one another); a
// quiet phase follows (no faults, links up, nothing paused), with one last acquire (or unfence), by
// a node whose gate is closed, that must succeed; it ends once everything settled. The checker
// (checker.cc) then judges S1-S5 and L1 on the record (README.md says what each means).
// Everything is driven from the seed through std::mt19937_64's raw output, so a seed replays
// exactly, on any standard library; nothing sleeps and no wall clock is read (--random-seeds only
// draws where a sweep starts). This file is the command line and the sweep. Proves that the
// protocol keeps S1-S5 under these faults, and, linked against the mutant libraries, that each
// property's check catches the protocol bug made to break it.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "checker.h"
#include "history.h"
#include "world.h"

namespace blkfence::sim {
namespace {

std::string replay_command(const Cli& cli, std::uint64_t seed) {
  std::string text = cli.program + " --seed " + std::to_string(seed);
  if (cli.nodes != 0) {
    text += " --nodes " + std::to_string(cli.nodes);
  }
  if (cli.lus != 0) {
    text += " --lus " + std::to_string(cli.lus);
  }
  if (cli.strict_epochs) {
    text += " --strict-epochs";
  }
  if (cli.hotplug) {
    text += " --hotplug";
  }
  if (cli.recovery) {
    text += " --recovery";
  }
  if (cli.shared) {
    text += " --shared";
  }
  if (cli.primary) {
    text += " --primary";
  }
  if (cli.preempt_abort) {
    text += *cli.preempt_abort ? " --preempt abort" : " --preempt plain";
  }
  if (cli.strict_s1) {
    text += " --strict-s1";
  }
  return text + " --verbose";
}

void print_config(const World& world) {
  const Config& c = world.config();
  std::printf("seed %" PRIu64
              ": %zu nodes, %zu LUs, %s, check_interval %s, lease %s, timeout %s,"
              " horizon %s%s%s%s%s\n",
              world.record().seed, c.nodes, c.lus,
              c.preempt_abort ? "PREEMPT AND ABORT" : "PREEMPT",
              format_time(c.check_interval).c_str(), format_time(c.lease).c_str(),
              format_time(c.command_timeout).c_str(), format_time(c.horizon).c_str(),
              c.hotplug ? ", paths come and go" : "", c.recovery ? ", paths in recovery" : "",
              c.shared ? ", shared mode" : "", c.primary ? ", primary mode" : "");
  for (std::size_t n = 0; n < c.nodes; ++n) {
    std::printf("  node %zu: nexuses", n + 1);
    for (std::size_t lu = 0; lu < c.lus; ++lu) {
      for (std::size_t p = 0; p < c.paths[n][lu]; ++p) {
        std::printf(" %u", nexus_of(static_cast<std::uint16_t>(n + 1), lu, p));
      }
    }
    std::printf("\n");
  }
}

bool parse_number(const char* text, std::uint64_t& out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') {
    return false;
  }
  out = value;
  return true;
}

// "S2" or "S1,S5": the properties a mutant is expected to break. The checker's own "checker"
// verdict (an inconsistent record) is never one of them.
bool parse_properties(const char* text, std::set<std::string>& out) {
  static const std::set<std::string> kProperties{"S1", "S2", "S3", "S4", "S5", "C1", "L1", "R1"};
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string name(rest.substr(0, comma));
    if (!kProperties.contains(name)) {
      return false;
    }
    out.insert(name);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return !out.empty();
}

// What a sweep must at least have done, per seed, for "no violation" to mean something: every
// property is about fences, writes that landed and writes the target refused. A seed averages
// about 14 acquisitions, 10 fences, 750 landed and 45 refused writes (seeds 1-120); these floors
// are far below, and far above an empty history.
struct MinPerSeed {
  std::uint64_t acquisitions = 5;
  std::uint64_t fences = 2;
  std::uint64_t writes_landed = 100;
  std::uint64_t writes_refused = 5;
};
constexpr MinPerSeed kMinPerSeed;

// Which counts of the sweep fall below kMinPerSeed, or empty.
std::string quiet_sweep(const Stats& total) {
  std::string below;
  const auto floor = [&](const char* what, std::uint64_t got, std::uint64_t per_seed) {
    if (got < per_seed * total.seeds) {
      below += (below.empty() ? "" : ", ") + std::string(what) + " " + std::to_string(got) + " < " +
               std::to_string(per_seed * total.seeds);
    }
  };
  floor("acquisitions", total.acquisitions, kMinPerSeed.acquisitions);
  floor("fences", total.fences, kMinPerSeed.fences);
  floor("writes landed", total.writes_landed, kMinPerSeed.writes_landed);
  floor("writes refused", total.writes_refused, kMinPerSeed.writes_refused);
  return below;
}

int usage(const char* program) {
  (void)std::fprintf(
      stderr,
      "usage: %s [--seed N | --seeds COUNT [--first S]] [--nodes 2|3] [--lus 1..4]\n"
      "          [--verbose] [--expect-violation S1|...|S5|C1|L1|R1[,...]] [--strict-epochs]\n"
      "          [--min-activity] [--random-seeds COUNT] [--hotplug] [--recovery] [--shared]\n"
      "          [--primary] [--waive S3[,...]] [--preempt plain|abort] [--strict-s1]\n",
      program);
  return 2;
}

int run_main(int argc, char** argv) {
  Cli cli;
  cli.program = argc > 0 ? argv[0] : "blkfence_sim";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::uint64_t value = 0;
    const bool has_value = i + 1 < argc;
    if (arg == "--verbose") {
      cli.verbose = true;
    } else if (arg == "--expect-violation" && has_value &&
               parse_properties(argv[++i], cli.expected)) {
    } else if (arg == "--waive" && has_value && parse_properties(argv[++i], cli.waived)) {
    } else if (arg == "--min-activity") {
      cli.min_activity = true;
    } else if (arg == "--strict-epochs") {
      cli.strict_epochs = true;
    } else if (arg == "--seed" && has_value && parse_number(argv[++i], value)) {
      cli.seed = value;
    } else if (arg == "--seeds" && has_value && parse_number(argv[++i], value) && value > 0) {
      cli.seeds = value;
    } else if (arg == "--hotplug") {
      cli.hotplug = true;
    } else if (arg == "--recovery") {
      cli.recovery = true;
    } else if (arg == "--shared") {
      cli.shared = true;
    } else if (arg == "--primary") {
      cli.primary = true;
    } else if (arg == "--preempt" && has_value &&
               (std::string_view(argv[i + 1]) == "plain" ||
                std::string_view(argv[i + 1]) == "abort")) {
      cli.preempt_abort = std::string_view(argv[++i]) == "abort";
    } else if (arg == "--strict-s1") {
      cli.strict_s1 = true;
    } else if (arg == "--random-seeds" && has_value && parse_number(argv[++i], value)) {
      cli.random_seeds = value;
    } else if (arg == "--first" && has_value && parse_number(argv[++i], value)) {
      cli.first = value;
    } else if (arg == "--nodes" && has_value && parse_number(argv[++i], value) && value >= 2 &&
               value <= 3) {
      cli.nodes = value;
    } else if (arg == "--lus" && has_value && parse_number(argv[++i], value) && value >= 1 &&
               value <= 4) {
      cli.lus = value;
    } else {
      return usage(cli.program.c_str());
    }
  }
  const std::uint64_t first = cli.seed.value_or(cli.first);
  const std::uint64_t count = cli.seed ? 1 : cli.seeds;
  // The fixed seeds, then --random-seeds more from a start drawn afresh each run, far above any
  // fixed range; printed first, so that a failure replays (every violation prints its seed too).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges{{first, count}};
  if (cli.random_seeds > 0) {
    std::random_device entropy;
    const std::uint64_t start =
        (std::uint64_t{1} << 32U) +
        ((std::uint64_t{entropy()} << 16U) ^ entropy()) % (std::uint64_t{1} << 40U);
    ranges.emplace_back(start, cli.random_seeds);
    std::printf("blkfence_sim: random seeds %" PRIu64 " to %" PRIu64 " (replay: --seeds %" PRIu64
                " --first %" PRIu64 ")\n",
                start, start + cli.random_seeds - 1, cli.random_seeds, start);
    (void)std::fflush(stdout);
  }
  Stats total;
  std::uint64_t waived_seeds = 0;
  std::optional<std::uint64_t> first_violation;
  std::optional<std::uint64_t> caught_at;  // the first seed that broke an expected property
  bool record_inconsistent = false;
  std::vector<std::uint64_t> seeds;
  for (const auto& [from, how_many] : ranges) {
    for (std::uint64_t seed = from; seed < from + how_many; ++seed) {
      seeds.push_back(seed);
    }
  }
  for (const std::uint64_t seed : seeds) {
    World world(cli, seed);
    if (cli.verbose) {
      print_config(world);
    }
    std::vector<Violation> violations = world.run();
    Stats stats = world.stats();
    if (world.config().primary && !cli.waived.empty()) {
      const auto waived = [&cli](const Violation& v) { return cli.waived.contains(v.property); };
      std::map<std::string, std::size_t> by_property;
      for (const Violation& violation : violations) {
        if (waived(violation)) {
          ++by_property[violation.property];
        }
      }
      for (const auto& [property, times] : by_property) {
        std::printf("waived seed %" PRIu64 " %s x%zu (a known defect of primary mode)\n", seed,
                    property.c_str(), times);
      }
      waived_seeds += by_property.empty() ? 0U : 1U;
      std::erase_if(violations, waived);
    }
    if (cli.verbose) {
      for (const std::string& line : timeline(world.record())) {
        std::printf("%s\n", line.c_str());
      }
      for (const std::string& note : world.record().notes) {
        std::printf("note: %s\n", note.c_str());
      }
    }
    if (!violations.empty()) {
      stats.violating_seeds = 1;
      first_violation = first_violation.value_or(seed);
      const std::size_t shown = std::min<std::size_t>(violations.size(), 5);
      for (std::size_t v = 0; v < shown; ++v) {
        std::printf("VIOLATION seed %" PRIu64 " %s: %s\n", seed, violations[v].property.c_str(),
                    violations[v].what.c_str());
        for (const std::string& line : violations[v].lines) {
          std::printf("    %s\n", line.c_str());
        }
      }
      std::map<std::string, std::size_t> by_property;
      for (const Violation& violation : violations) {
        ++by_property[violation.property];
      }
      std::string counts;
      for (const auto& [property, times] : by_property) {
        counts += " " + property + " x" + std::to_string(times);
      }
      std::printf("seed %" PRIu64 ": %zu violations:%s%s\n", seed, violations.size(),
                  counts.c_str(), violations.size() > shown ? " (the first 5 shown)" : "");
      std::printf("replay: %s\n", replay_command(cli, seed).c_str());
    }
    total.add(stats);
    const bool inconsistent =
        std::any_of(violations.begin(), violations.end(),
                    [](const Violation& v) { return v.property == "checker"; });
    if (inconsistent) {
      record_inconsistent = true;
    }
    const bool caught = std::any_of(violations.begin(), violations.end(), [&](const Violation& v) {
      return cli.expected.contains(v.property);
    });
    if (caught && !inconsistent) {
      caught_at = seed;
      break;  // found what we came for
    }
  }
  std::printf(
      "blkfence_sim: seeds %" PRIu64 " (from %" PRIu64 "), simulated %.1f s, commands %" PRIu64
      ", acquisitions %" PRIu64 ", fences %" PRIu64 ", lost contact %" PRIu64
      ", writes landed %" PRIu64 " refused %" PRIu64 ", stray registrations %" PRIu64
      ", held writes landed after a plain PREEMPT %" PRIu64 ", violating seeds %" PRIu64 "\n",
      total.seeds, first, static_cast<double>(total.simulated.count()) / 1e9, total.commands,
      total.acquisitions, total.fences, total.lost_contacts, total.writes_landed,
      total.writes_refused, total.stray_registrations, total.held_landings, total.violating_seeds);
  if (total.power_cycles > 0) {
    std::printf("blkfence_sim: LU power cycles %" PRIu64 ", PR state kept by APTPL in %" PRIu64
                "\n",
                total.power_cycles, total.power_cycles_kept);
  }
  if (waived_seeds > 0) {
    std::printf("blkfence_sim: %" PRIu64 " primary-mode seeds broke a waived property\n",
                waived_seeds);
  }
  if (const std::string below = cli.min_activity ? quiet_sweep(total) : ""; !below.empty()) {
    std::printf("blkfence_sim: the sweep was too quiet for its verdict to mean anything: %s\n",
                below.c_str());
    return 1;
  }
  if (!cli.expected.empty()) {
    std::string names;
    for (const std::string& name : cli.expected) {
      names += (names.empty() ? "" : " or ") + name;
    }
    if (record_inconsistent) {
      std::printf(
          "blkfence_sim: the checker found its record inconsistent; a mutant's catch cannot "
          "rest on it\n");
      return 1;
    }
    if (caught_at) {
      std::printf("blkfence_sim: expected a violation of %s and found one at seed %" PRIu64
                  " (after %" PRIu64 " seeds)\n",
                  names.c_str(), *caught_at, total.seeds);
      return 0;
    }
    std::printf("blkfence_sim: expected a violation of %s, found none in %" PRIu64 " seeds%s\n",
                names.c_str(), total.seeds,
                first_violation ? " (other properties were violated: see above)" : "");
    return 1;
  }
  return total.violating_seeds == 0 ? 0 : 1;
}

}  // namespace
}  // namespace blkfence::sim

int main(int argc, char** argv) {
  return blkfence::sim::run_main(argc, argv);
}
