// blkfence_sim: the deterministic multi-node simulation of the exclusive protocol (tests/sim).
//
// One seed is one world: a SimClock, a SimTarget with 1-4 LUs, and 2-3 nodes, each with 1-2
// nexuses per LU, its own SimTransport (seeded faults: lost, late and duplicated answers, late
// execution, unit attentions) behind a recording decorator, its own pr::Engine and fence::Resource
// and its epoch store (its disk, which survives daemon restarts), and a writer that writes
// stamped blocks to every LU while its gate is open. A scenario drawn from the seed acquires
// (often two nodes at once), releases, pauses daemons (with or without their writer), cuts links
// and restarts daemons over 30-120 s of simulated time; a quiet phase follows (no faults, links
// up, nothing paused), with one last acquire, by a node whose gate is closed, that must succeed;
// it ends once everything settled. The checker (checker.cc) then judges S1-S5 and L1 on the
// record (README.md says what each means). Everything is driven from the seed through
// std::mt19937_64's raw output, so a seed replays exactly, on any standard library; nothing
// sleeps and no wall clock is read. Proves that the protocol keeps S1-S5 under these faults, and,
// linked against the mutant libraries, that the checks catch a protocol that skips its verify or
// re-registers after a fence.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <poll.h>

#include "blkfence/assert.h"
#include "blkfence/endian.h"
#include "blkfence/fence/epoch_store.h"
#include "blkfence/fence/resource.h"
#include "blkfence/key.h"
#include "blkfence/pr/engine.h"
#include "blkfence/testing/sim_clock.h"
#include "blkfence/testing/sim_target.h"
#include "blkfence/testing/sim_transport.h"

#include "checker.h"
#include "history.h"

namespace blkfence::sim {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;
using transport::LinkState;
using transport::LuId;
using transport::NexusId;
using transport::PathId;

constexpr std::uint32_t kBlockSize = 16;  // node:16 | pad:16 | epoch:32 | write id:64
constexpr std::uint64_t kBlockCount = std::uint64_t{1} << 40U;
constexpr const char* kResourceName = "pgdata";
// Nexuses a node may have to one LU over the run: its configured 1-2, and the ones hot-plug adds.
constexpr std::size_t kMaxPaths = 4;

struct Cli {
  std::optional<std::uint64_t> seed;
  std::uint64_t seeds = 1;
  std::uint64_t first = 1;
  std::size_t nodes = 0;  // 0: drawn from the seed
  std::size_t lus = 0;
  bool verbose = false;
  // --expect-violation: the properties a mutant must break ("S2", "S5", ...); empty when none.
  std::set<std::string> expected;
  bool strict_epochs = false;
  // --min-activity: the sweep fails when it fenced, wrote or refused too little for its verdict to
  // mean anything (kMinPerSeed).
  bool min_activity = false;
  // --random-seeds: this many seeds more, from a start that changes from run to run (printed).
  std::uint64_t random_seeds = 0;
  std::string program = "blkfence_sim";
};

// splitmix64: independent seeds for the many generators of one world.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30U)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27U)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31U);
}

std::uint64_t mix(std::uint64_t seed, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  return mix(mix(mix(seed ^ mix(a)) ^ b) ^ c);
}

// Draws from std::mt19937_64's raw output only: its sequence is fixed by the standard, the
// distributions' are not.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : engine_() % n; }
  std::uint64_t between(std::uint64_t lo, std::uint64_t hi) { return lo + below(hi - lo + 1); }
  bool chance(std::uint64_t num, std::uint64_t den) { return below(den) < num; }
  Time time_between(Time lo, Time hi) {
    return Time(static_cast<std::int64_t>(
        between(static_cast<std::uint64_t>(lo.count()), static_cast<std::uint64_t>(hi.count()))));
  }
  double rate(std::uint64_t permille_max) {
    return static_cast<double>(below(permille_max + 1)) / 1000.0;
  }

 private:
  std::mt19937_64 engine_;
};

// Everything of one world drawn from its seed before it starts.
struct Config {
  std::size_t nodes = 2;
  std::size_t lus = 1;
  std::vector<std::vector<std::size_t>> paths;  // [node][lu]: nexuses of the node on the LU
  bool preempt_abort = false;
  Time check_interval{0};
  Time lease{0};
  milliseconds command_timeout{0};
  int keys_every = 1;
  Time latency_min{0};
  Time latency_max{0};
  transport::RandomFaults daemon_faults;
  transport::RandomFaults writer_faults;
  Time write_interval_min{0};
  Time write_interval_max{0};
  Time horizon{0};
  std::uint64_t register_pause_percent = 0;  // acquires that pause right after registering
  bool hotplug = false;  // paths come and go (update_paths), drawn from their own stream
};

Config draw_config(Rng& rng, const Cli& cli) {
  Config c;
  c.nodes = cli.nodes != 0 ? cli.nodes : 2 + rng.below(2);
  c.lus = cli.lus != 0 ? cli.lus : 1 + rng.below(4);
  c.paths.assign(c.nodes, std::vector<std::size_t>(c.lus, 1));
  for (auto& node : c.paths) {
    for (auto& count : node) {
      count = 1 + rng.below(2);
    }
  }
  c.preempt_abort = rng.chance(1, 2);
  const std::uint64_t check_ms = rng.between(100, 500);
  c.check_interval = milliseconds(check_ms);
  c.lease = c.check_interval * static_cast<std::int64_t>(rng.between(3, 5));
  c.command_timeout = milliseconds(std::chrono::duration_cast<milliseconds>(c.lease).count() *
                                   static_cast<std::int64_t>(rng.between(25, 60)) / 100);
  c.keys_every = static_cast<int>(rng.between(1, 4));
  c.latency_min = microseconds(50);
  c.latency_max = microseconds(rng.between(200, 3000));
  // Late execution may outlast the command's timeout (an indeterminate command still executes),
  // up to 1.5 times it; duplicates arrive while the first copy's answer is on its way back.
  c.daemon_faults = transport::RandomFaults{.drop_request = rng.rate(10),
                                            .drop_response = rng.rate(10),
                                            .delay_response = rng.rate(10),
                                            .execute_late = rng.rate(10),
                                            .duplicate = rng.rate(10),
                                            .unit_attention = rng.rate(20),
                                            .delay_max = c.command_timeout * 3 / 2};
  // Writes may be held in the target's task set only where PREEMPT AND ABORT clears it: under a
  // plain PREEMPT a write held across the preempt lands after it (SPC-4 5.13.11.2.4, the hazard
  // of S1 (docs/protocol.md) that the configuration choice is about), and no protocol can prevent
  // it.
  c.writer_faults =
      transport::RandomFaults{.drop_request = rng.rate(10),
                              .drop_response = rng.rate(10),
                              .delay_response = rng.rate(20),
                              .execute_late = c.preempt_abort ? rng.rate(50) : 0.0,
                              .duplicate = 0.0,
                              .unit_attention = rng.rate(10),
                              .delay_max = rng.time_between(milliseconds(1), c.check_interval)};
  c.write_interval_min = milliseconds(rng.between(50, 200));
  c.write_interval_max = c.write_interval_min + milliseconds(rng.between(0, 300));
  c.horizon = seconds(rng.between(30, 120));
  c.register_pause_percent = rng.between(10, 40);
  return c;
}

class World;
class Node;

// The node's daemon transport, recording every command it submits and every completion the
// daemon reaps into the run's history (history.h), and telling its node when a REGISTER goes out.
class RecordingTransport final : public transport::Transport {
 public:
  RecordingTransport(World& world, Node& node, std::unique_ptr<transport::SimTransport> inner)
      : world_(world), node_(node), inner_(std::move(inner)) {}

  Result<PathId> open_path(const std::string& device) override;
  void close_path(PathId path) override { inner_->close_path(path); }
  Result<void> submit(PathId path, transport::Command command) override;
  Result<std::size_t> reap(milliseconds wait, std::vector<transport::Completion>& out) override;
  std::size_t in_flight() const override { return inner_->in_flight(); }
  int poll_fd() const override { return inner_->poll_fd(); }
  std::string_view name() const override { return "recording sim"; }

  void set_link(LuId lu, LinkState state) { inner_->set_link(lu, state); }

 private:
  World& world_;
  Node& node_;
  std::unique_ptr<transport::SimTransport> inner_;
  std::map<PathId, transport::SimPath> paths_;
  std::map<std::uint64_t, std::size_t> tags_;  // a command in flight: its index in the record
};

struct Stats {
  std::uint64_t seeds = 0;
  Time simulated{0};
  std::uint64_t commands = 0;
  std::uint64_t acquisitions = 0;
  std::uint64_t fences = 0;
  std::uint64_t lost_contacts = 0;
  std::uint64_t writes_landed = 0;
  std::uint64_t writes_refused = 0;
  std::uint64_t stray_registrations = 0;
  std::uint64_t violating_seeds = 0;

  void add(const Stats& other) {
    seeds += other.seeds;
    simulated += other.simulated;
    commands += other.commands;
    acquisitions += other.acquisitions;
    fences += other.fences;
    lost_contacts += other.lost_contacts;
    writes_landed += other.writes_landed;
    writes_refused += other.writes_refused;
    stray_registrations += other.stray_registrations;
    violating_seeds += other.violating_seeds;
  }
};

class World {
 public:
  World(const Cli& cli, std::uint64_t seed);
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  ~World();

  // Runs the scenario and the quiet phase, then checks the record.
  std::vector<Violation> run();
  const Run& record() const { return record_; }
  const Config& config() const { return config_; }
  Stats stats() const;

  // For the nodes.
  Time now() const { return clock_.now(); }
  transport::SimTarget& target() { return target_; }
  std::uint64_t seed() const { return seed_; }
  bool faults_on() const { return faults_on_; }
  std::uint64_t next_seq() { return seq_++; }
  std::uint64_t next_write_id() { return next_write_id_++; }
  Entry& trace(std::uint16_t node, EntryKind kind) {
    record_.trace.push_back(Entry{});
    Entry& entry = record_.trace.back();
    entry.seq = next_seq();
    entry.at = now();
    entry.node = node;
    entry.kind = kind;
    return entry;
  }
  std::size_t add_command(Command command) {
    command.submitted = now();
    command.submitted_seq = next_seq();
    record_.commands.push_back(command);
    return record_.commands.size() - 1;
  }
  Command& command(std::size_t index) { return record_.commands[index]; }
  void add_write(const WriteIssue& write) { record_.writes.emplace(write.id, write); }
  std::vector<LuState> snapshot() const;
  // Whether this acquire should pause its node right after it sends its REGISTERs.
  bool arm_register_pause() {
    return faults_on_ && runtime_rng_.chance(config_.register_pause_percent, 100);
  }
  void request_pause(Node& node);

 private:
  struct Action {
    enum class Kind : std::uint8_t { kAcquire, kRelease, kPause, kOutage, kRestart, kPaths };
    Time at{0};
    Kind kind = Kind::kAcquire;
    std::size_t node = 0;
    Time duration{0};
    bool writer_too = false;
    std::vector<LuId> lus;
    LinkState link = LinkState::kNoAnswer;
    bool add = false;  // kPaths: a path appears (or goes away)
  };

  void plan();
  void act(const Action& action);
  void enter_quiet();
  void final_acquire();
  bool settled() const;
  Time next_time(Time limit) const;

  Cli cli_;
  std::uint64_t seed_;
  Rng plan_rng_;
  Rng runtime_rng_;
  Rng hotplug_rng_;
  Config config_;
  transport::SimClock clock_;
  transport::SimTarget target_{clock_};
  Run record_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<Action> actions_;
  std::size_t next_action_ = 0;
  std::vector<Node*> pause_requests_;
  bool faults_on_ = true;
  bool quiet_ = false;
  std::optional<Time> final_acquire_at_;
  std::size_t final_node_ = 0;
  bool final_started_ = false;
  std::uint64_t seq_ = 1;
  std::uint64_t next_write_id_ = 1;
};

class Node final : public fence::Observer {
 public:
  Node(World& world, std::uint16_t id, const std::vector<std::size_t>& paths);
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  ~Node() override;

  std::uint16_t id() const { return id_; }
  bool alive() const { return resource_ != nullptr; }
  bool paused() const { return paused_until_.has_value(); }
  bool running() const { return alive() && !paused(); }
  const fence::Resource* resource() const { return resource_.get(); }

  void boot();
  void crash();
  // Runs the daemon's event loop once: reaps when its transport polled readable, then whatever
  // is due. The fds to poll (-1: nothing in flight, nothing to reap).
  void pump(bool readable);
  int daemon_fd() const {
    return running() && transport_->in_flight() > 0 ? transport_->poll_fd() : -1;
  }
  int writer_fd() const {
    return writer_transport_->in_flight() > 0 ? writer_transport_->poll_fd() : -1;
  }
  std::optional<Time> wake() const;
  void acquire(const std::string& why);
  void release();
  void pause(Time until, bool writer_too);
  void resume();
  void set_links(const std::vector<LuId>& lus, LinkState state, Time until);
  // A path of the node to the LU appears (add) or goes away, and the daemon is told the LU's
  // current paths, as blkfenced does after a udev event. The node keeps at least one path.
  void hotplug(std::size_t lu, bool add, Rng& rng);
  void links_up();
  void timers();  // resume, boot and links that are due
  std::optional<Time> timer_wake() const;
  void schedule_boot(Time at) { boot_at_ = at; }

  // The writer.
  std::optional<Time> writer_wake() const;
  void writer_step(bool readable);

  void submitted(const Command& command);  // from the recording transport
  bool pause_armed() const { return register_pause_armed_; }

  void on_gate(const fence::Resource& resource, bool open, Time verified_since) override;
  void on_event(const fence::Resource& resource, const fence::Event& event) override;

  std::uint32_t boots() const { return boots_; }
  // Records when the resource's operation begins or ends (kBusy), after anything that may start or
  // finish one.
  void note_busy();
  std::uint64_t writes_landed = 0;
  std::uint64_t writes_refused = 0;

 private:
  fence::ResourceOptions options() const;

  World& world_;
  std::uint16_t id_;
  std::vector<pr::LogicalUnit> lus_;                      // the paths the node has now
  std::vector<std::vector<std::size_t>> present_;         // [lu]: the path indices the node has now
  std::vector<std::vector<std::string>> writer_devices_;  // [lu][path index], every possible one
  std::vector<std::vector<NexusId>> nexuses_;
  fence::MemoryEpochStore store_;
  std::uint32_t boots_ = 0;
  std::unique_ptr<RecordingTransport> transport_;
  std::unique_ptr<pr::Engine> engine_;
  std::unique_ptr<fence::Resource> resource_;

  std::optional<Time> paused_until_;
  bool writer_frozen_ = false;
  std::optional<Time> boot_at_;
  std::map<LuId, LinkState> links_;
  std::optional<Time> links_until_;
  bool register_pause_armed_ = false;
  bool busy_ = false;

  std::unique_ptr<transport::SimTransport> writer_transport_;
  std::vector<std::vector<PathId>> writer_paths_;
  Rng writer_rng_;
  bool writer_gate_ = false;
  std::uint64_t writer_key_ = 0;
  std::optional<Time> writer_next_;
  std::vector<transport::Completion> scratch_;
};

// --- RecordingTransport --------------------------------------------------------------------------

Result<PathId> RecordingTransport::open_path(const std::string& device) {
  auto path = inner_->open_path(device);
  if (path) {
    const auto found = inner_->target().find_path(device);
    BLKFENCE_ASSERT(found.has_value());
    paths_[*path] = *found;
  }
  return path;
}

Result<void> RecordingTransport::submit(PathId path, transport::Command command) {
  const auto where = paths_.find(path);
  BLKFENCE_ASSERT(where != paths_.end());
  Command record;
  record.node = node_.id();
  record.boot = node_.boots();
  record.lu = where->second.lu;
  record.nexus = where->second.nexus;
  record.opcode = command.cdb[0];
  record.action = static_cast<std::uint8_t>(command.cdb[1] & 0x1fU);
  record.type = static_cast<std::uint8_t>(command.cdb[2] & 0x0fU);
  if (record.is_prout() && command.data_out.size() >= 16) {
    record.key = load_be64(command.data_out, 0);
    record.sa_key = load_be64(command.data_out, 8);
  }
  record.bytes.assign(reinterpret_cast<const char*>(command.cdb.data()), command.cdb_size);
  record.bytes.append(reinterpret_cast<const char*>(command.data_out.data()),
                      command.data_out.size());
  const std::uint64_t tag = command.tag;
  const std::size_t index = world_.add_command(std::move(record));
  auto submitted = inner_->submit(path, std::move(command));
  if (submitted) {
    tags_[tag] = index;
  } else {
    Command& failed = world_.command(index);
    failed.completed = true;
    failed.completed_at = world_.now();
    failed.completed_seq = world_.next_seq();
    failed.outcome = transport::Outcome::kOsError;
  }
  node_.submitted(world_.command(index));
  return submitted;
}

Result<std::size_t> RecordingTransport::reap(milliseconds wait,
                                             std::vector<transport::Completion>& out) {
  const std::size_t before = out.size();
  auto reaped = inner_->reap(wait, out);
  for (std::size_t i = before; i < out.size(); ++i) {
    const transport::Completion& completion = out[i];
    const auto found = tags_.find(completion.tag);
    if (found == tags_.end()) {
      continue;
    }
    Command& command = world_.command(found->second);
    command.completed = true;
    command.completed_at = world_.now();
    command.completed_seq = world_.next_seq();
    command.outcome = completion.outcome;
    command.status = completion.status;
    command.sense = completion.sense;
    command.data_in = completion.data_in;
    tags_.erase(found);
  }
  return reaped;
}

// --- Node ----------------------------------------------------------------------------------------

NexusId nexus_of(std::uint16_t node, std::size_t lu, std::size_t path) {
  return static_cast<NexusId>(std::size_t{node} * 100U + lu * 10U + path);
}

pr::Path path_of(const std::string& suffix) {
  return pr::Path{.sg = "/dev/sg-n" + suffix, .sd = {}, .hctl = suffix};
}

Node::Node(World& world, std::uint16_t id, const std::vector<std::size_t>& paths)
    : world_(world), id_(id), writer_rng_(mix(world.seed(), id, 0, 0x77)) {
  transport::SimTarget& target = world.target();
  for (std::size_t lu = 0; lu < paths.size(); ++lu) {
    pr::LogicalUnit unit{.wwn = "naa.60014050000000" + std::to_string(lu),
                         .name = "lu" + std::to_string(lu),
                         .paths = {}};
    std::vector<std::string> writers;
    std::vector<NexusId> nexuses;
    std::vector<std::size_t> present;
    for (std::size_t p = 0; p < kMaxPaths; ++p) {
      const std::string suffix =
          std::to_string(id) + "-lu" + std::to_string(lu) + "-p" + std::to_string(p);
      const NexusId nexus = nexus_of(id, lu, p);
      target.add_path("/dev/sg-n" + suffix, static_cast<LuId>(lu), nexus);
      // The writer reaches the same I_T nexus through its own name (its own block device).
      target.add_path("/dev/sd-n" + suffix, static_cast<LuId>(lu), nexus);
      if (p < paths[lu]) {
        unit.paths.push_back(path_of(suffix));
        present.push_back(p);
      }
      writers.push_back("/dev/sd-n" + suffix);
      nexuses.push_back(nexus);
    }
    lus_.push_back(std::move(unit));
    present_.push_back(std::move(present));
    writer_devices_.push_back(std::move(writers));
    nexuses_.push_back(std::move(nexuses));
  }
  const Config& config = world.config();
  transport::FaultHook writer_faults = transport::random_faults(config.writer_faults);
  auto made = transport::SimTransport::make(
      target, {.seed = mix(world.seed(), id, 0, 0x57),
               .latency_min = config.latency_min,
               .latency_max = config.latency_max,
               .deadline_grace = milliseconds(0),
               .fault = [&world, writer_faults](const transport::FaultContext& context) {
                 return world.faults_on() ? writer_faults(context) : transport::Fault{};
               }});
  BLKFENCE_ASSERT(made.has_value());
  writer_transport_ = std::move(*made);
  for (const auto& devices : writer_devices_) {
    std::vector<PathId> opened;
    for (const auto& device : devices) {
      auto path = writer_transport_->open_path(device);
      BLKFENCE_ASSERT(path.has_value());
      opened.push_back(*path);
    }
    writer_paths_.push_back(std::move(opened));
  }
}

Node::~Node() {
  resource_.reset();
  engine_.reset();
  transport_.reset();
}

fence::ResourceOptions Node::options() const {
  const Config& config = world_.config();
  fence::ResourceOptions o;
  o.name = kResourceName;
  o.lus = lus_;
  o.mode = fence::Mode::kExclusive;
  o.type = codec::PrType::kWriteExclusiveRegistrantsOnly;
  o.preempt_abort = config.preempt_abort;
  o.cluster_id = fence::cluster_id_from_name("sim");
  o.node_id = id_;
  o.check_interval = config.check_interval;
  o.lease = config.lease;
  o.keys_every = config.keys_every;
  return o;
}

void Node::boot() {
  BLKFENCE_ASSERT(!alive());
  ++boots_;
  boot_at_.reset();
  const Config& config = world_.config();
  transport::FaultHook faults = transport::random_faults(config.daemon_faults);
  const Time duplicate_interval_max = config.latency_min;
  World& world = world_;
  auto made = transport::SimTransport::make(
      world_.target(),
      {.seed = mix(world_.seed(), id_, boots_, 0x44),
       .latency_min = config.latency_min,
       .latency_max = config.latency_max,
       .deadline_grace = milliseconds(0),
       .fault = [&world, faults, duplicate_interval_max](const transport::FaultContext& context) {
         if (!world.faults_on()) {
           return transport::Fault{};
         }
         transport::Fault fault = faults(context);
         // A retransmitted copy arrives before the first copy's answer gets back: the command
         // executed twice before anyone heard of it (a copy arriving much later is a late
         // execution, which execute_late covers with the deadline semantics it needs).
         fault.duplicate_interval = std::min(fault.duplicate_interval, duplicate_interval_max);
         return fault;
       }});
  BLKFENCE_ASSERT(made.has_value());
  for (const auto& [lu, state] : links_) {
    (*made)->set_link(lu, state);
  }
  transport_ = std::make_unique<RecordingTransport>(world_, *this, std::move(*made));
  pr::RetryPolicy policy;
  policy.command_timeout = config.command_timeout;
  engine_ = std::make_unique<pr::Engine>(*transport_, policy);
  resource_ = std::make_unique<fence::Resource>(options(), *engine_, store_, *this);
  world_.trace(id_, EntryKind::kBoot);
  resource_->start(world_.now());
  note_busy();
}

void Node::crash() {
  BLKFENCE_ASSERT(alive());
  world_.trace(id_, EntryKind::kCrash);
  resource_.reset();
  engine_.reset();
  transport_.reset();
  note_busy();
  paused_until_.reset();
  writer_frozen_ = false;
  if (writer_gate_) {
    // The daemon's death stops the gated writer (systemd stops the units bound to it).
    Entry& entry = world_.trace(id_, EntryKind::kGate);
    entry.open = false;
    entry.key = writer_key_;
    entry.detail = "daemon died: the writer stops";
  }
  writer_gate_ = false;
  writer_next_.reset();
}

void Node::pump(bool readable) {
  // What blkfenced's event loop does when its fd polls readable or a timer fires: reap only then
  // (each reap costs two eventfd reads), on_time() only when something is due (otherwise it does
  // nothing).
  const Time now = world_.now();
  if (readable) {
    const auto pumped = engine_->pump(now);
    BLKFENCE_ASSERT(pumped.has_value());
  } else if (const auto due = engine_->next_wake(); due && *due <= now) {
    engine_->on_time(now);
  }
  if (const auto due = resource_->next_wake(); due && *due <= now) {
    resource_->on_time(now);
  }
  note_busy();
}

void Node::note_busy() {
  const bool busy = resource_ && resource_->busy();
  if (busy != busy_) {
    busy_ = busy;
    world_.trace(id_, EntryKind::kBusy).open = busy;
  }
}

std::optional<Time> Node::wake() const {
  if (!running()) {
    return std::nullopt;
  }
  std::optional<Time> wake = engine_->next_wake();
  if (const auto own = resource_->next_wake(); own && (!wake || *own < *wake)) {
    wake = own;
  }
  return wake;
}

void Node::acquire(const std::string& why) {
  if (!running()) {
    return;
  }
  if (resource_->busy()) {
    Entry& entry = world_.trace(id_, EntryKind::kRefused);
    entry.ok = false;
    entry.code = ErrorCode::kBusy;
    entry.detail = why + " refused: another operation is running";
    return;
  }
  register_pause_armed_ = world_.arm_register_pause();
  world_.trace(id_, EntryKind::kAcquireCalled).detail = why;
  resource_->acquire(world_.now(), [this, why](Result<fence::Key> result, Time) {
    register_pause_armed_ = false;
    Entry& entry = world_.trace(id_, EntryKind::kOpDone);
    entry.ok = result.has_value();
    if (result) {
      entry.key = result->value();
      entry.detail = why + ": acquired";
    } else {
      entry.code = result.error().code();
      entry.detail = why + ": " + result.error().message();
    }
  });
  note_busy();
}

void Node::release() {
  if (!running() || resource_->busy()) {
    return;
  }
  world_.trace(id_, EntryKind::kReleaseCalled);
  resource_->release(world_.now(), [this](Result<fence::Key> result, Time) {
    Entry& entry = world_.trace(id_, EntryKind::kOpDone);
    entry.ok = result.has_value();
    if (!result) {
      entry.code = result.error().code();
      entry.detail = "release: " + result.error().message();
    } else {
      entry.detail = "release: released";
    }
  });
  note_busy();
}

void Node::pause(Time until, bool writer_too) {
  paused_until_ = until;
  writer_frozen_ = writer_too;
  world_.trace(id_, EntryKind::kPause).detail =
      "until " + format_time(until) +
      (writer_too ? ", writer frozen too (VM freeze)" : ", writer keeps writing (daemon stall)");
}

void Node::resume() {
  paused_until_.reset();
  writer_frozen_ = false;
  world_.trace(id_, EntryKind::kResume);
  if (writer_gate_ && !writer_next_) {
    writer_next_ = world_.now();
  }
}

void Node::set_links(const std::vector<LuId>& lus, LinkState state, Time until) {
  std::string detail = state == LinkState::kNoAnswer ? "no answers from LU" : "no connection to LU";
  for (const LuId lu : lus) {
    links_[lu] = state;
    if (transport_) {
      transport_->set_link(lu, state);
    }
    writer_transport_->set_link(lu, state);
    detail += " " + std::to_string(lu);
  }
  links_until_ = links_until_ ? std::max(*links_until_, until) : until;
  world_.trace(id_, EntryKind::kLink).detail = detail + " until " + format_time(*links_until_);
}

void Node::links_up() {
  if (links_.empty()) {
    links_until_.reset();
    return;
  }
  for (const auto& [lu, state] : links_) {
    if (transport_) {
      transport_->set_link(lu, LinkState::kUp);
    }
    writer_transport_->set_link(lu, LinkState::kUp);
  }
  links_.clear();
  links_until_.reset();
  world_.trace(id_, EntryKind::kLink).detail = "every link up";
}

void Node::hotplug(std::size_t lu, bool add, Rng& rng) {
  std::vector<std::size_t>& present = present_[lu];
  if (add) {
    if (present.size() >= kMaxPaths) {
      return;
    }
    std::size_t p = 0;
    while (std::find(present.begin(), present.end(), p) != present.end()) {
      ++p;
    }
    present.push_back(p);
  } else {
    if (present.size() <= 1) {
      return;
    }
    present.erase(present.begin() + static_cast<std::ptrdiff_t>(rng.below(present.size())));
  }
  std::string detail =
      "LU " + std::to_string(lu) + (add ? " path added" : " path gone") + ", nexuses now";
  lus_[lu].paths.clear();
  for (const std::size_t p : present) {
    lus_[lu].paths.push_back(
        path_of(std::to_string(id_) + "-lu" + std::to_string(lu) + "-p" + std::to_string(p)));
    detail += " " + std::to_string(nexuses_[lu][p]);
  }
  world_.trace(id_, EntryKind::kPaths).detail = detail;
  if (running()) {
    resource_->update_paths(lu, lus_[lu].paths, world_.now());
    note_busy();
  }
}

void Node::timers() {
  const Time now = world_.now();
  if (paused_until_ && *paused_until_ <= now) {
    resume();
  }
  if (boot_at_ && *boot_at_ <= now) {
    boot();
  }
  if (links_until_ && *links_until_ <= now) {
    links_up();
  }
}

std::optional<Time> Node::timer_wake() const {
  std::optional<Time> wake;
  for (const auto& t : {paused_until_, boot_at_, links_until_}) {
    if (t && (!wake || *t < *wake)) {
      wake = t;
    }
  }
  return wake;
}

std::optional<Time> Node::writer_wake() const {
  if (!writer_gate_ || writer_frozen_) {
    return std::nullopt;
  }
  return writer_next_;
}

void Node::writer_step(bool readable) {
  scratch_.clear();
  if (readable) {
    (void)writer_transport_->reap(milliseconds(0), scratch_);
  }
  for (const auto& completion : scratch_) {
    if (completion.outcome == transport::Outcome::kGood) {
      ++writes_landed;
    } else {
      ++writes_refused;
    }
  }
  const Time now = world_.now();
  if (!writer_gate_ || writer_frozen_ || !writer_next_ || *writer_next_ > now) {
    return;
  }
  for (std::size_t lu = 0; lu < writer_paths_.size(); ++lu) {
    const std::size_t p = present_[lu][writer_rng_.below(present_[lu].size())];
    const std::uint64_t id = world_.next_write_id();
    std::vector<std::uint8_t> cdb(16, 0);
    cdb[0] = 0x8a;  // WRITE(16), SBC-3 5.40
    store_be64(cdb, 2, id);
    store_be32(cdb, 10, 1);
    transport::Command command = transport::Command::from_cdb(cdb);
    command.direction = transport::DataDirection::kToDevice;
    command.data_out.assign(kBlockSize, 0);
    store_be16(command.data_out, 0, id_);
    store_be32(command.data_out, 4, static_cast<std::uint32_t>(writer_key_));
    store_be64(command.data_out, 8, id);
    command.timeout = world_.config().command_timeout;
    command.tag = id;
    const auto submitted = writer_transport_->submit(writer_paths_[lu][p], std::move(command));
    BLKFENCE_ASSERT(submitted.has_value());
    world_.add_write(WriteIssue{.id = id,
                                .node = id_,
                                .key = writer_key_,
                                .lu = static_cast<LuId>(lu),
                                .nexus = nexuses_[lu][p],
                                .issued = now});
  }
  const Config& config = world_.config();
  writer_next_ =
      now + writer_rng_.time_between(config.write_interval_min, config.write_interval_max);
}

void Node::submitted(const Command& command) {
  if (register_pause_armed_ && command.is(codec::PrOutAction::kRegisterAndIgnoreExistingKey)) {
    // Freeze right after the REGISTERs go out, before their answers come back: others acquire
    // meanwhile, and this node's take finds the world moved on (or, without a verify, a racer's
    // registration slips in behind its read).
    register_pause_armed_ = false;
    world_.request_pause(*this);
  }
}

void Node::on_gate(const fence::Resource& resource, bool open, Time verified_since) {
  Entry& entry = world_.trace(id_, EntryKind::kGate);
  entry.open = open;
  entry.verified_since = verified_since;
  if (resource.key()) {
    entry.key = resource.key()->value();
  }
  entry.detail = std::string(fence::to_string(resource.state()));
  if (open) {
    entry.target = world_.snapshot();
  }
  writer_gate_ = open;
  writer_key_ = entry.key.value_or(0);
  if (open) {
    writer_next_ =
        world_.now() + writer_rng_.time_between(Time{0}, world_.config().write_interval_min);
  } else {
    writer_next_.reset();
  }
}

void Node::on_event(const fence::Resource& resource, const fence::Event& event) {
  (void)resource;
  Entry& entry = world_.trace(id_, EntryKind::kEvent);
  entry.event = event.kind;
  if (event.key) {
    entry.key = event.key->value();
  }
  entry.other_key = event.other_key;
  entry.detail = event.detail;
}

// --- World ---------------------------------------------------------------------------------------

World::World(const Cli& cli, std::uint64_t seed)
    : cli_(cli),
      seed_(seed),
      plan_rng_(mix(seed, 0, 0, 0x50)),
      runtime_rng_(mix(seed, 0, 0, 0x52)),
      hotplug_rng_(mix(seed, 0, 0, 0x48)),
      config_(draw_config(plan_rng_, cli)) {
  for (std::size_t lu = 0; lu < config_.lus; ++lu) {
    transport::LuConfig lu_config;
    lu_config.block_size = kBlockSize;
    lu_config.block_count = kBlockCount;
    target_.add_lu(lu_config);
  }
  record_.seed = seed;
  record_.cluster_id = fence::cluster_id_from_name("sim");
  record_.lus = config_.lus;
  record_.preempt_abort = config_.preempt_abort;
  record_.strict_epochs = cli.strict_epochs;
  record_.check_interval = config_.check_interval;
  record_.lease = config_.lease;
  record_.command_timeout = config_.command_timeout;
  record_.target = &target_.history();
  for (std::size_t n = 0; n < config_.nodes; ++n) {
    const auto id = static_cast<std::uint16_t>(n + 1);
    nodes_.push_back(std::make_unique<Node>(*this, id, config_.paths[n]));
    for (std::size_t lu = 0; lu < config_.lus; ++lu) {
      for (std::size_t p = 0; p < kMaxPaths; ++p) {
        record_.node_of_nexus[nexus_of(id, lu, p)] = id;
      }
    }
  }
  plan();
}

World::~World() {
  nodes_.clear();  // transports before the target and the clock
}

std::vector<LuState> World::snapshot() const {
  std::vector<LuState> lus;
  for (std::size_t lu = 0; lu < config_.lus; ++lu) {
    LuState state;
    const auto reservation = target_.reservation(static_cast<LuId>(lu));
    if (reservation) {
      state.holder = reservation->key;
    }
    state.registrations = target_.registrations(static_cast<LuId>(lu));
    lus.push_back(std::move(state));
  }
  return lus;
}

void World::request_pause(Node& node) {
  pause_requests_.push_back(&node);
}

// The scenario: what the cluster manager and the environment do, and when.
void World::plan() {
  Rng& rng = plan_rng_;
  const std::size_t n = config_.nodes;
  Time t = rng.time_between(milliseconds(100), seconds(1));
  Action start;
  start.at = t;
  start.kind = Action::Kind::kAcquire;
  start.node = rng.below(n);
  actions_.push_back(start);
  while (true) {
    t += rng.time_between(milliseconds(100), seconds(4));
    if (t >= config_.horizon) {
      break;
    }
    const std::uint64_t pick = rng.below(100);
    Action action;
    action.at = t;
    action.node = rng.below(n);
    if (pick < 28) {
      action.kind = Action::Kind::kAcquire;
      actions_.push_back(action);
    } else if (pick < 50) {
      // Two nodes acquire at once, or within a round trip of each other.
      action.kind = Action::Kind::kAcquire;
      actions_.push_back(action);
      Action other = action;
      other.node = (action.node + 1 + rng.below(n - 1)) % n;
      if (rng.chance(1, 2)) {
        other.at += rng.time_between(Time{0}, 2 * config_.latency_max);
      }
      actions_.push_back(other);
    } else if (pick < 58) {
      action.kind = Action::Kind::kRelease;
      actions_.push_back(action);
    } else if (pick < 72) {
      action.kind = Action::Kind::kPause;
      action.duration = rng.time_between(milliseconds(20), 3 * config_.lease);
      action.writer_too = rng.chance(1, 2);
      actions_.push_back(action);
    } else if (pick < 85) {
      action.kind = Action::Kind::kOutage;
      action.duration = rng.time_between(milliseconds(50), 3 * config_.lease);
      action.link = rng.chance(3, 4) ? LinkState::kNoAnswer : LinkState::kNoConnect;
      for (std::size_t lu = 0; lu < config_.lus; ++lu) {
        if (rng.chance(2, 3)) {
          action.lus.push_back(static_cast<LuId>(lu));
        }
      }
      if (action.lus.empty()) {
        action.lus.push_back(static_cast<LuId>(rng.below(config_.lus)));
      }
      actions_.push_back(action);
    } else {
      action.kind = Action::Kind::kRestart;
      action.duration = rng.time_between(Time{0}, seconds(2));
      actions_.push_back(action);
    }
  }
  final_node_ = rng.below(n);
  // Paths that come and go (half the seeds), from their own stream so that the rest of the
  // scenario is the same with or without them.
  Rng& paths = hotplug_rng_;
  config_.hotplug = paths.chance(1, 2);
  for (Time at = paths.time_between(seconds(1), seconds(10));
       config_.hotplug && at < config_.horizon; at += paths.time_between(seconds(1), seconds(10))) {
    Action action;
    action.at = at;
    action.kind = Action::Kind::kPaths;
    action.node = paths.below(n);
    action.lus.push_back(static_cast<LuId>(paths.below(config_.lus)));
    action.add = paths.chance(1, 2);
    actions_.push_back(action);
  }
  std::stable_sort(actions_.begin(), actions_.end(),
                   [](const Action& a, const Action& b) { return a.at < b.at; });
}

void World::act(const Action& action) {
  Node& node = *nodes_[action.node];
  switch (action.kind) {
    case Action::Kind::kAcquire: node.acquire("acquire"); break;
    case Action::Kind::kRelease: node.release(); break;
    case Action::Kind::kPause:
      if (node.running()) {
        node.pause(now() + action.duration, action.writer_too);
      }
      break;
    case Action::Kind::kOutage:
      node.set_links(action.lus, action.link, now() + action.duration);
      break;
    case Action::Kind::kPaths: node.hotplug(action.lus.front(), action.add, hotplug_rng_); break;
    case Action::Kind::kRestart:
      if (node.alive()) {
        node.crash();
        node.schedule_boot(now() + action.duration);
      }
      break;
  }
}

void World::enter_quiet() {
  quiet_ = true;
  faults_on_ = false;
  pause_requests_.clear();
  trace(0, EntryKind::kQuiet).detail = "faults off, links up, every daemon running";
  for (auto& node : nodes_) {
    node->links_up();
    if (node->paused()) {
      node->resume();
    }
    if (!node->alive()) {
      node->boot();
    }
  }
  final_acquire_at_ = now() + config_.lease + config_.check_interval;
}

void World::final_acquire() {
  // Once no operation of the scenario runs any more, by a node whose gate is closed (the drawn
  // one, or the next): a takeover, or a fresh acquire, after the chaos.
  for (const auto& node : nodes_) {
    if (node->resource() && node->resource()->busy()) {
      final_acquire_at_ = now() + config_.check_interval;
      return;
    }
  }
  std::size_t pick = final_node_;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const std::size_t candidate = (final_node_ + i) % nodes_.size();
    if (!nodes_[candidate]->resource()->gate_open()) {
      pick = candidate;
      break;
    }
  }
  // Registrations the protocol leaves beside a holder (a node that died or failed in the middle
  // of an acquire, a REGISTER that executed after its acquire gave up): allowed by the design
  // (docs/protocol.md, monitor), reported as notes. The final acquire removes them.
  const std::vector<LuState> lus = snapshot();
  for (const auto& node : nodes_) {
    const fence::Resource* resource = node->resource();
    if (!resource->gate_open() || !resource->key()) {
      continue;
    }
    for (std::size_t lu = 0; lu < lus.size(); ++lu) {
      for (const auto& registration : lus[lu].registrations) {
        if (registration.key != resource->key()->value()) {
          record_.notes.push_back(
              format_time(now()) + " stray registration on LU " + std::to_string(lu) +
              " beside holder node " + std::to_string(node->id()) + ": nexus " +
              std::to_string(registration.nexus) + " with " + format_key(registration.key));
        }
      }
    }
  }
  final_acquire_at_.reset();
  final_node_ = pick;
  final_started_ = true;
  nodes_[pick]->acquire("final acquire");
}

// The quiet phase ends once it has lasted 2 * lease + 2 * check_interval, the final acquire is
// done, no operation runs, and every node had two checks and a timeout since the last PR OUT
// executed (to notice a takeover).
bool World::settled() const {
  if (!quiet_ || !final_started_ ||
      now() < config_.horizon + 2 * config_.lease + 2 * config_.check_interval) {
    return false;
  }
  for (const auto& node : nodes_) {
    if (node->resource() && node->resource()->busy()) {
      return false;
    }
  }
  const auto& prouts = target_.history().prouts;
  return prouts.empty() ||
         now() >= prouts.back().at + 2 * config_.check_interval + config_.command_timeout;
}

Time World::next_time(Time limit) const {
  Time next = limit;
  const auto consider = [&next, this](std::optional<Time> t) {
    if (t) {
      next = std::min(next, std::max(*t, now()));
    }
  };
  consider(clock_.next_event());
  if (!quiet_ && next_action_ < actions_.size()) {
    consider(actions_[next_action_].at);
  }
  consider(final_acquire_at_);
  if (quiet_) {  // the moments settled() may turn true, if still ahead
    const auto ahead = [&consider, this](Time t) {
      if (t > now()) {
        consider(t);
      }
    };
    ahead(config_.horizon + 2 * config_.lease + 2 * config_.check_interval);
    if (const auto& prouts = target_.history().prouts; !prouts.empty()) {
      ahead(prouts.back().at + 2 * config_.check_interval + config_.command_timeout);
    }
  }
  for (const auto& node : nodes_) {
    consider(node->wake());
    consider(node->timer_wake());
    consider(node->writer_wake());
  }
  return next;
}

std::vector<Violation> World::run() {
  // A bound on the quiet phase, which ends when it settled().
  const Time end = config_.horizon + 20 * config_.lease;
  std::vector<Violation> violations;
  for (auto& node : nodes_) {
    node->boot();
  }
  Time last = now();
  std::uint64_t same = 0;
  std::vector<pollfd> polled;
  bool events_ran = true;
  while (true) {
    if (!quiet_ && now() >= config_.horizon) {
      enter_quiet();
      events_ran = true;  // it resumed every paused node
    }
    for (auto& node : nodes_) {
      const bool was_paused = node->paused();
      node->timers();
      // A node that resumes finds what completed while it was paused.
      events_ran = events_ran || (was_paused && !node->paused());
    }
    // One poll(2) over every transport with commands in flight tells which have completions.
    polled.clear();
    for (auto& node : nodes_) {
      polled.push_back(pollfd{.fd = node->daemon_fd(), .events = POLLIN, .revents = 0});
      polled.push_back(pollfd{.fd = node->writer_fd(), .events = POLLIN, .revents = 0});
    }
    // Completions are made by clock events only: after a step that ran none, nothing new is ready.
    if (events_ran &&
        std::any_of(polled.begin(), polled.end(), [](const pollfd& p) { return p.fd >= 0; })) {
      const int ready = ::poll(polled.data(), polled.size(), 0);
      BLKFENCE_ASSERT(ready >= 0);
    }
    for (std::size_t n = 0; n < nodes_.size(); ++n) {
      if (nodes_[n]->running()) {
        nodes_[n]->pump((polled[2 * n].revents & POLLIN) != 0);
      }
    }
    while (!quiet_ && next_action_ < actions_.size() && actions_[next_action_].at <= now()) {
      act(actions_[next_action_++]);
    }
    if (final_acquire_at_ && *final_acquire_at_ <= now()) {
      final_acquire();
    }
    for (std::size_t n = 0; n < nodes_.size(); ++n) {
      nodes_[n]->writer_step((polled[2 * n + 1].revents & POLLIN) != 0);
    }
    for (Node* node : pause_requests_) {
      if (node->running()) {
        node->pause(now() + runtime_rng_.time_between(config_.lease / 2, 3 * config_.lease),
                    runtime_rng_.chance(1, 2));
      }
    }
    pause_requests_.clear();
    if (settled()) {
      break;
    }
    if (now() >= end) {
      violations.push_back({"L1",
                            "the quiet phase did not settle by " + format_time(end) +
                                " (an operation still runs, or PR OUTs keep executing)",
                            {}});
      break;
    }
    const Time next = next_time(quiet_ ? end : config_.horizon);
    if (next == last) {
      if (++same > 100'000) {
        violations.push_back({"L1",
                              "livelock: the simulation made no progress in time at " +
                                  format_time(next) + " (a wake time that never passes)",
                              {}});
        break;
      }
    } else {
      same = 0;
      last = next;
    }
    const auto event = clock_.next_event();
    events_ran = event && *event <= next;
    clock_.advance_to(next);
  }
  record_.end = now();
  record_.final_lus = snapshot();
  for (const auto& node : nodes_) {
    NodeEnd end_state{.node = node->id(),
                      .alive = node->alive(),
                      .gate_open = node->resource() && node->resource()->gate_open(),
                      .key = {},
                      .state = node->resource()
                                   ? std::string(fence::to_string(node->resource()->state()))
                                   : "down"};
    if (node->resource() && node->resource()->key()) {
      end_state.key = node->resource()->key()->value();
    }
    record_.final_nodes.push_back(end_state);
  }
  auto checked = check(record_);
  violations.insert(violations.end(), checked.begin(), checked.end());
  return violations;
}

Stats World::stats() const {
  Stats s;
  s.seeds = 1;
  s.simulated = record_.end;
  s.commands = record_.commands.size();
  for (const Entry& entry : record_.trace) {
    if (entry.kind == EntryKind::kEvent) {
      s.acquisitions += entry.event == fence::EventKind::kAcquired ? 1 : 0;
      s.fences += entry.event == fence::EventKind::kFenced ? 1 : 0;
      s.lost_contacts += entry.event == fence::EventKind::kLostContact ? 1 : 0;
    }
  }
  s.stray_registrations = record_.notes.size();
  for (const auto& node : nodes_) {
    s.writes_landed += node->writes_landed;
    s.writes_refused += node->writes_refused;
  }
  return s;
}

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
  return text + " --verbose";
}

void print_config(const World& world) {
  const Config& c = world.config();
  std::printf("seed %" PRIu64
              ": %zu nodes, %zu LUs, %s, check_interval %s, lease %s, timeout %s,"
              " horizon %s%s\n",
              world.record().seed, c.nodes, c.lus,
              c.preempt_abort ? "PREEMPT AND ABORT" : "PREEMPT",
              format_time(c.check_interval).c_str(), format_time(c.lease).c_str(),
              format_time(c.command_timeout).c_str(), format_time(c.horizon).c_str(),
              c.hotplug ? ", paths come and go" : "");
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
  static const std::set<std::string> kProperties{"S1", "S2", "S3", "S4", "S5", "L1"};
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
      "          [--verbose] [--expect-violation S1|...|S5|L1[,...]] [--strict-epochs]\n"
      "          [--min-activity] [--random-seeds COUNT]\n",
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
    } else if (arg == "--min-activity") {
      cli.min_activity = true;
    } else if (arg == "--strict-epochs") {
      cli.strict_epochs = true;
    } else if (arg == "--seed" && has_value && parse_number(argv[++i], value)) {
      cli.seed = value;
    } else if (arg == "--seeds" && has_value && parse_number(argv[++i], value) && value > 0) {
      cli.seeds = value;
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
    const std::vector<Violation> violations = world.run();
    Stats stats = world.stats();
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
  std::printf("blkfence_sim: seeds %" PRIu64 " (from %" PRIu64
              "), simulated %.1f s, commands %" PRIu64 ", acquisitions %" PRIu64 ", fences %" PRIu64
              ", lost contact %" PRIu64 ", writes landed %" PRIu64 " refused %" PRIu64
              ", stray registrations %" PRIu64 ", violating seeds %" PRIu64 "\n",
              total.seeds, first, static_cast<double>(total.simulated.count()) / 1e9,
              total.commands, total.acquisitions, total.fences, total.lost_contacts,
              total.writes_landed, total.writes_refused, total.stray_registrations,
              total.violating_seeds);
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
