// The world of one seed of blkfence_sim (tests/sim): its command line, its random draws, and the
// classes that run it: World (the target, the clock, the scenario and the quiet phase, world.cc),
// Node (one node's daemon, writer and disk, node.cc) and the RecordingTransport that writes each
// daemon's commands into the run's record (history.h). Single-threaded, deterministic.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "blkfence/fence/epoch_store.h"
#include "blkfence/fence/resource.h"
#include "blkfence/pr/engine.h"
#include "blkfence/testing/sim_clock.h"
#include "blkfence/testing/sim_target.h"
#include "blkfence/testing/sim_transport.h"

#include "checker.h"
#include "history.h"

namespace blkfence::sim {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;
using transport::LinkState;
using transport::LuId;
using transport::NexusId;
using transport::PathId;

inline constexpr std::uint32_t kBlockSize = 16;  // node:16 | pad:16 | epoch:32 | write id:64
inline constexpr std::uint64_t kBlockCount = std::uint64_t{1} << 40U;
inline constexpr const char* kResourceName = "pgdata";
// Nexuses a node may have to one LU over the run: its configured 1-2, and the ones hot-plug adds.
inline constexpr std::size_t kMaxPaths = 4;

struct Cli {
  std::optional<std::uint64_t> seed;
  std::uint64_t seeds = 1;
  std::uint64_t first = 1;
  std::size_t nodes = 0;  // 0: drawn from the seed
  std::size_t lus = 0;
  bool verbose = false;
  // --expect-violation: the properties a mutant must break ("S2", "S5", ...); empty when none.
  std::set<std::string> expected;
  // --waive S3: violations of these properties by primary-mode seeds are printed (one line each)
  // and counted apart, but fail nothing: known library defects awaiting a fix (README.md, "Known
  // defects of primary mode"). Exclusive and shared seeds are judged in full.
  std::set<std::string> waived;
  bool strict_epochs = false;
  // --min-activity: the sweep fails when it fenced, wrote or refused too little for its verdict to
  // mean anything (kMinPerSeed).
  bool min_activity = false;
  // --random-seeds: this many seeds more, from a start that changes from run to run (printed).
  std::uint64_t random_seeds = 0;
  // --hotplug: paths come and go in half the seeds (README.md: the open S1 window it finds).
  bool hotplug = false;
  // --recovery: in half the seeds, paths go into recovery, their commands waiting in the host.
  bool recovery = false;
  // --shared: half the seeds run every node in shared mode (unfence, fence_node, release).
  bool shared = false;
  // --primary: half the seeds run every node in primary mode (unfence to join, promote, release).
  bool primary = false;
  // --preempt plain|abort: every seed takes over with PREEMPT, or with PREEMPT AND ABORT; nullopt:
  // drawn per seed (the draw is made either way, so the rest of a seed's scenario stays the same).
  std::optional<bool> preempt_abort;
  // --strict-s1: plain PREEMPT seeds are judged by S1 as stated (Run::strict_s1).
  bool strict_s1 = false;
  std::string program = "blkfence_sim";
};

// splitmix64: independent seeds for the many generators of one world.
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30U)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27U)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31U);
}

inline std::uint64_t mix(std::uint64_t seed, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
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
  bool hotplug = false;   // paths come and go (update_paths), drawn from their own stream
  bool shared = false;    // every node in shared mode (--shared), drawn from its own stream
  bool primary = false;   // shared mode with primary (--primary), drawn from its own stream
  bool recovery = false;  // paths go into recovery (--recovery), drawn from their own stream
};

// Everything of one world drawn from its seed before it starts (world.cc).
Config draw_config(Rng& rng, const Cli& cli);

// The I_T nexus of a node's path to a LU: node * 100 + LU * 10 + path.
inline NexusId nexus_of(std::uint16_t node, std::size_t lu, std::size_t path) {
  return static_cast<NexusId>(std::size_t{node} * 100U + lu * 10U + path);
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
  std::optional<std::size_t> unreturned() const override { return inner_->unreturned(); }
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
  std::uint64_t held_landings = 0;  // writes held across a plain PREEMPT that landed after it
  std::uint64_t violating_seeds = 0;
  std::uint64_t power_cycles = 0;
  std::uint64_t power_cycles_kept = 0;  // the PR state survived them (APTPL)

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
    held_landings += other.held_landings;
    violating_seeds += other.violating_seeds;
    power_cycles += other.power_cycles;
    power_cycles_kept += other.power_cycles_kept;
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
  void add_note(std::string note) { record_.notes.push_back(std::move(note)); }
  std::vector<LuState> snapshot() const;
  // Whether this acquire should pause its node right after it sends its REGISTERs.
  bool arm_register_pause() {
    return faults_on_ && runtime_rng_.chance(config_.register_pause_percent, 100);
  }
  void request_pause(Node& node);

 private:
  struct Action {
    enum class Kind : std::uint8_t {
      kAcquire,  // acquire(), or unfence() in shared mode
      kRelease,
      kFence,  // shared mode: node fences victim (fence_node)
      kPause,
      kOutage,
      kRestart,
      kPaths,
      kPromote,     // primary mode: promote()
      kCancel,      // cancel() of the node's running acquire or promote, if one runs
      kPowerCycle,  // the target: lus.front() loses power and comes back (SimTarget::power_cycle)
      kRecovery,    // a path of node to lus.front() in recovery for duration (Node::recover)
    };
    Time at{0};
    Kind kind = Kind::kAcquire;
    std::size_t node = 0;
    std::size_t victim = 0;  // kFence
    Time duration{0};
    bool writer_too = false;
    std::vector<LuId> lus;
    LinkState link = LinkState::kNoAnswer;
    bool add = false;  // kPaths: a path appears (or goes away); kRecovery: it comes back
  };

  void plan();
  // Every least-most, drawn from rng, until the horizon and while on: an action at that instant by
  // a node drawn from rng, which plan fills in (drawing from rng too) and keeps.
  template <typename Plan>
  void every(Rng& rng, Time least, Time most, bool on, Plan plan);
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
  Rng power_rng_;
  Rng shared_rng_;
  Rng primary_rng_;
  Rng cancel_rng_;
  Rng crash_rng_;
  Rng recovery_rng_;
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
  std::uint64_t power_cycles_ = 0;
  std::uint64_t power_cycles_kept_ = 0;
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
  // acquire(), or in shared mode unfence(): both recorded as kAcquireCalled.
  void acquire(const std::string& why);
  void release();
  // Shared mode: fence_node(victim); the resource refuses it unless this node is unfenced.
  void fence(std::uint16_t victim);
  // Primary mode: promote(), recorded as kAcquireCalled (detail "promote").
  void promote(const std::string& why);
  // The caller of the running acquire or promote went away: cancel(), recorded (kCancelCalled)
  // only when the acquire or promote this driver asked for still runs. A paused daemon takes it
  // when it resumes (it reads its control socket then).
  void cancel();
  void pause(Time until, bool writer_too);
  void resume();
  void set_links(const std::vector<LuId>& lus, LinkState state, Time until);
  // A path of the node to the LU appears (add) or goes away, and the daemon is told the LU's
  // current paths, as blkfenced does after a udev event. The node keeps at least one path.
  void hotplug(std::size_t lu, bool add, Rng& rng);
  void links_up();
  // One of the node's present paths to the LU, drawn, goes into recovery until then: commands for
  // it wait in the host (transport::SimHostQueues), then go out, or fail unsent when not
  // recovered. A path already in recovery stays as it is.
  void recover(std::size_t lu, Rng& rng, Time until, bool recovered);
  // Ends the recoveries due by now, or every one (the quiet phase: each comes back).
  void recoveries_end(bool all);
  void timers();  // resume, boot, links and recoveries that are due
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

  // The resource's options, as every daemon of this node builds them.
  fence::ResourceOptions options() const;

 private:
  struct Recovery {
    Time until{0};
    bool recovered = true;
  };

  bool refused_while_busy(const std::string& why);
  fence::Resource::Done op_done(const std::string& why, const std::string& done);

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
  // The host's queues in front of its paths, shared by its daemon's and its writer's transports,
  // and the paths in recovery now.
  std::shared_ptr<transport::SimHostQueues> host_queues_ =
      std::make_shared<transport::SimHostQueues>();
  std::map<NexusId, Recovery> recoveries_;
  bool register_pause_armed_ = false;
  bool busy_ = false;
  bool calling_ = false;  // inside a call to the resource: its answer came at once (a refusal)
  // The acquire or promote this driver asked for runs (its done has not been called), and a
  // cancel() for it waits for the paused daemon to resume.
  bool cancellable_ = false;
  bool cancel_pending_ = false;

  std::unique_ptr<transport::SimTransport> writer_transport_;
  std::vector<std::vector<PathId>> writer_paths_;
  Rng writer_rng_;
  bool writer_gate_ = false;
  std::uint64_t writer_key_ = 0;
  std::optional<Time> writer_next_;
  std::map<std::uint64_t, std::size_t> writer_lu_of_;  // a write not reaped yet: its LU
  std::vector<std::uint64_t> writer_unreaped_;         // [lu]: how many
  std::vector<transport::Completion> scratch_;
};

}  // namespace blkfence::sim
