// One fenced resource of one node: the acquire/release/fence/monitor protocol of docs/protocol.md
// as a state machine, and the gate it decides (fence layer).
//
// The machine never waits and never reads a clock. It starts batches of PR commands on a
// pr::Engine and advances when their responses come back; its owner calls on_time() when
// next_wake() is due. blkfenced drives it from sd-event on the steady clock and real devices, the
// simulation (tests/sim) from a simulated clock and target: the same code decides in both.
//
// Safety (docs/protocol.md, "Safety properties"): S2 the gate opens only after a verify read,
// issued after all of our own PR OUTs, showed our key as the holder and only registrant on every
// LU, and closes when a check shows otherwise or none succeeds for `lease`; S3 the epoch is
// max(keys of this cluster on any LU, the persisted high-water) + 1, and is made durable before the
// key is registered; S4 after any failed or indeterminate PR OUT the state is read again before
// anything is decided; S5 after our key was preempted the machine sends no PR OUT until an explicit
// acquire or unfence.
//
// One operation (acquire, release, unfence, fence) runs at a time; while it runs the monitor
// pauses. The registration of a new path is one too, the resource's own: an acquire or release
// asked for meanwhile waits for it instead of failing as busy. Every callback runs from the
// engine's callbacks or on_time(). One thread; the engine, the store and the observer must outlive
// the resource.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "blkfence/codec/cdb.h"
#include "blkfence/codec/prout.h"
#include "blkfence/error.h"
#include "blkfence/fence/epoch_store.h"
#include "blkfence/key.h"
#include "blkfence/pr/discovery.h"
#include "blkfence/pr/engine.h"

namespace blkfence::fence {

using pr::Time;

enum class Mode : std::uint8_t {
  kExclusive,  // one holder, the only registrant (type 5 by default)
  kShared,     // fence_scsi style: every member registered, fence removes one
};
// Shared mode with ResourceOptions::primary: the members register and never reserve; the primary
// holds the reservation, and promote makes this node the primary by preempting the old one.

enum class State : std::uint8_t {
  kUnknown,      // the first read has not succeeded yet
  kReleased,     // exclusive: not the holder; shared: not registered
  kAcquiring,    // exclusive acquire in progress
  kHeld,         // exclusive: our key is the verified holder and only registrant on every LU;
                 // primary: our key is the verified holder and registered on every LU
  kUnfencing,    // shared: registering
  kUnfenced,     // shared: our key is registered on every LU and a reservation protects them
  kReleasing,    // giving the reservation and the registration back
  kFenced,       // our key was preempted or removed; never re-registered by ourselves (S5)
  kLostContact,  // no successful check for `lease` while the gate was open: fail closed
};
std::string_view to_string(State state);
std::string_view to_string(Mode mode);

struct ResourceOptions;
// "exclusive", "shared" or "primary" (shared with ResourceOptions::primary), as configured.
std::string_view mode_name(const ResourceOptions& options);

struct ResourceOptions {
  std::string name;
  std::vector<pr::LogicalUnit> lus;
  Mode mode = Mode::kExclusive;
  // An All Registrants type in shared mode, another in exclusive and primary mode.
  codec::PrType type = codec::PrType::kWriteExclusiveRegistrantsOnly;
  bool preempt_abort = false;  // PREEMPT AND ABORT instead of PREEMPT to take over
  bool primary = false;        // shared mode: members never reserve; promote takes the holder's
  std::uint16_t cluster_id = 0;
  std::uint16_t node_id = 0;
  std::chrono::nanoseconds check_interval{std::chrono::seconds(1)};
  std::chrono::nanoseconds lease{std::chrono::seconds(5)};
  int keys_every = 4;         // READ KEYS every this many monitor rounds
  int verify_rounds_max = 3;  // preempt-others/verify rounds before an acquire gives up
  // The writes this node has in flight on a LU (with its current paths): issued through any of
  // its paths, or any block device stacked on them, and not yet completed; an error when they
  // cannot be counted (a path holding commands back). Before a REGISTER while the gate is closed,
  // and before one that re-keys a nexus holding with an older key of ours, they must be none
  // (docs/protocol.md, "Writes queued in the initiator", "Re-keying a holding nexus"). Unset: the
  // node cannot tell, and such a REGISTER waits drain_wait, then fails.
  std::function<Result<std::uint64_t>(const pr::LogicalUnit& lu)> writes_in_flight;
  // How long that REGISTER waits for them before its operation fails with what is still in flight.
  std::chrono::nanoseconds drain_wait{std::chrono::seconds(60)};
  // The host's queues that hold writes while a LU has no usable path and send them once one is
  // back (dm-multipath maps with queue_if_no_path): host_queueing(lu, false) stops every such
  // queue of the LU, failing what it holds; host_queueing(lu, true) lets those it stopped queue
  // again. While the gate is closed none of them queues: a write held there across a fence would
  // land once the node registered again (docs/protocol.md, "Writes queued in the initiator").
  // Called when the gate closes, before the REGISTER of an acquire, promote or unfence while it
  // is closed (a failure there fails the operation), and with true when it opens. Unset: the host
  // has no such queue.
  std::function<Result<void>(const pr::LogicalUnit& lu, bool queue)> host_queueing;
};

enum class EventKind : std::uint8_t {
  kStateKnown,       // the first read finished (READY once every resource has one)
  kAcquired,         // the gate opened after an acquire (or adopting our key at start)
  kReleased,         // released on request
  kFenced,           // our key was preempted: gate closed
  kLostContact,      // no successful check for `lease`: gate closed
  kContactRestored,  // a check verified our key again after lost contact: gate reopened
  kUnfenced,         // shared: registered
  kFencedNode,       // shared: we removed another node's key
  kOperationFailed,  // an acquire/release/unfence/fence failed; detail says where
  kPathsChanged,     // a LU's paths changed (hot-plug); detail says which and what was registered
};
std::string_view to_string(EventKind kind);

struct Event {
  EventKind kind = EventKind::kStateKnown;
  std::optional<Key> key;                  // ours
  std::optional<std::uint64_t> other_key;  // who fenced us, or whom we fenced
  std::string device;                      // the LU where it was seen (its name), when one
  std::string detail;                      // one sentence for logs and status
};

// How long an exclusive acquire may legitimately run after its REGISTERs went out: their answers,
// then up to verify_rounds_max rounds of take, preempt of the others and verify, then a failed
// acquire's read-back and unregister, one command_timeout each (docs/protocol.md, "Stray
// registrations"). A key of our cluster that outranks the holder's is left to its acquire this
// long.
Time acquire_window(const ResourceOptions& options, Time command_timeout);
// Within how long of its registration (or of the holder's gate opening, if later) the holder's
// monitor removes a registration of its cluster other than its own key, while it runs and its
// commands are answered: the acquire window, a READ KEYS round (keys_every checks), the check
// after it is due and three round trips (docs/protocol.md, "Stray registrations").
Time stray_bound(const ResourceOptions& options, Time command_timeout);

class Resource;

class Observer {
 public:
  virtual ~Observer() = default;
  // The gate opened (verified_since: when the verify read that justified it was issued) or
  // closed. The observer acts on it at once (token file, writers, units).
  virtual void on_gate(const Resource& resource, bool open, Time verified_since) = 0;
  virtual void on_event(const Resource& resource, const Event& event) = 0;
};

// What the last successful read of a LU showed.
struct LuView {
  std::string name;
  std::string wwn;
  std::optional<std::uint64_t> holder;  // nullopt: no reservation
  std::optional<codec::PrType> type;
  std::vector<std::uint64_t> keys;  // from the last READ KEYS
  std::string error;                // the last read's error; empty when it succeeded
};

struct Counters {
  std::uint64_t acquisitions = 0;
  std::uint64_t acquire_failures = 0;
  std::uint64_t fenced = 0;
  std::uint64_t lost_contact = 0;
  std::uint64_t checks = 0;
  std::uint64_t check_failures = 0;
  std::uint64_t unit_attentions = 0;
  std::uint64_t strays_preempted = 0;  // monitor rounds that preempted other keys of the cluster
  std::chrono::nanoseconds check_latency_last{0};
  std::chrono::nanoseconds check_latency_max{0};
  std::chrono::nanoseconds check_latency_sum{0};
};

class Resource {
 public:
  // The key of an operation that succeeded (acquire, unfence), or what went wrong.
  using Done = std::function<void(Result<Key>, Time now)>;

  Resource(ResourceOptions options, pr::Engine& engine, EpochStore& epochs, Observer& observer);
  ~Resource();
  Resource(const Resource&) = delete;
  Resource& operator=(const Resource&) = delete;

  // Reads every LU once and decides the initial state: our own key, verified as the holder and
  // only registrant (exclusive) or registered everywhere (shared), is adopted and the gate opens;
  // anything else leaves it closed and touches nothing (S5).
  void start(Time now);

  void acquire(Time now, Done done);                            // exclusive
  void release(Time now, Done done);                            // both modes: gate closed first
  void unfence(Time now, Done done);                            // shared
  void fence_node(std::uint16_t node_id, Time now, Done done);  // shared
  void promote(Time now, Done done);                            // shared, primary
  // The caller of the running acquire or promote went away or ran out of time: the operation
  // sends no further PR OUT that could take a LU (it reads back and fails instead). Nothing
  // happens when no operation runs.
  void cancel();

  // Path hot-plug: the paths of LU `lu` (an index into options().lus) are now `paths`. New paths
  // of a LU this node holds (exclusive, verified) or is unfenced on (shared) are registered with
  // the current key, after a read shows the key still current, and the key is verified again
  // afterwards; a new path of a fenced, released or lost-contact node is not (S5). An empty list
  // is ignored: a LU keeps its last paths rather than none (its reads fail and the lease decides).
  // A path is its H:C:T:L with its device nodes: one that went away, or whose H:C:T:L came back
  // under other nodes, is gone, and the engine closes its fd (pr::Engine::forget()).
  void update_paths(std::size_t lu, std::vector<pr::Path> paths, Time now);

  void on_time(Time now);
  std::optional<Time> next_wake() const;

  const ResourceOptions& options() const { return options_; }
  const std::string& name() const { return options_.name; }
  State state() const { return state_; }
  bool gate_open() const { return gate_open_; }
  // What a caller may be told at `now`: the gate is open and its last successful check is
  // younger than the lease. Between a resume from suspend (or a stalled loop) and the next
  // on_time(), gate_open() still says open; this does not.
  bool gate_open_at(Time now) const;
  std::optional<Key> key() const { return key_; }
  std::uint32_t epoch_high_water() const { return high_water_; }
  const std::vector<LuView>& lus() const { return views_; }
  std::optional<std::uint64_t> fenced_by() const { return fenced_by_; }
  std::optional<Time> last_success() const { return last_success_; }
  // When the last check that read every LU was issued, whatever it showed.
  std::optional<Time> last_read_ok() const { return last_read_ok_; }
  const std::string& detail() const { return detail_; }
  bool busy() const { return op_ != Op::kNone; }
  bool state_known() const { return state_ != State::kUnknown || probe_done_; }
  const Counters& counters() const { return counters_; }

 private:
  enum class Op : std::uint8_t {
    kNone,
    kProbe,
    kAcquire,
    kRelease,
    kUnfence,
    kFence,
    kPromote,
    kPaths
  };
  struct Reads;
  using ReadsDone = std::function<void(Reads, Time)>;

  // resource.cc: what every operation shares, and the start.
  void run(std::vector<pr::Request> requests, Time now,
           std::function<void(std::vector<pr::Response>, Time)> then);
  void read_all(bool with_keys, Time now, ReadsDone then);
  // What a read asks besides READ RESERVATION: READ KEYS, and READ FULL STATUS where the initiator
  // ports of this node are known (a start's and an operation's first read: "Identical keys").
  enum class Keys : std::uint8_t { kNone, kKeys, kKeysAndPorts };
  void read_all(Keys keys, Time now, ReadsDone then);
  // Before a REGISTER of key: unless the gate is open and the reads show the key it opened with on
  // every LU, stops the host's queues on every LU (host_queueing). Unless the reads show that key
  // on every LU (the node was not fenced) and no older key of ours holds a LU, waits until this
  // node has no write in flight and no path holding writes back on any LU (at most drain_wait).
  // then(error) with an empty error once that is done, else with what failed or is still in
  // flight.
  void drain_before_register(const Reads& reads, Key key, Time now,
                             std::function<void(const std::string&, Time)> then);
  // host_queueing(lu, queue) on every LU: what failed, "" when nothing did.
  std::string set_host_queueing(bool queue);
  struct Draining {
    std::vector<bool> watched;  // the LUs the wait looks at, by index
    std::vector<bool> busy;     // the last look found writes on the LU, or could not count them
  };
  void drain_look(const Draining& drain, Time deadline, Time now,
                  std::function<void(const std::string&, Time)> then);
  bool refuse(Mode mode, Time now, Done& done);
  void begin(Op op, Done done);
  void end(Result<Key> result, Time now);
  bool queue_behind_paths(std::function<void(Time)> op);
  void set_gate(bool open, Time verified_since);
  void set_state(State state, std::string detail);
  void emit(EventKind kind, std::string detail, std::optional<std::uint64_t> other = {},
            std::string device = {});
  Key key_for(std::uint32_t epoch) const;
  bool ours(std::uint64_t key) const;
  bool drawn_by_us(std::uint64_t key) const;
  // docs/protocol.md, "Identical keys": this node's initiator ports as its paths name them; empty
  // unless every path's is known.
  std::vector<codec::TransportId> own_ports() const;
  // A key of this node that reads show registered through an initiator port none of own_ports()
  // is: what, where and why it matters; "" when they show none.
  std::string key_used_elsewhere(const Reads& reads) const;
  std::uint32_t highest_epoch(const Reads& reads) const;
  std::vector<std::string> stray_keys(const Reads& reads) const;
  [[nodiscard]] Result<std::uint32_t> draw_epoch(const Reads& reads, const std::string& what) const;
  bool outranks(std::uint64_t other, Key key) const;
  void probe_read(const Reads& reads, Time now);
  void read_capabilities(Time now, std::function<void(Time)> then);
  void with_capabilities(Time now, std::function<void(Time)> then);
  codec::RegisterOptions register_options() const;
  // REGISTER AND IGNORE EXISTING KEY of key on every path of every LU.
  std::vector<pr::Request> register_everywhere(Key key) const;
  std::optional<Key> adoptable(const Reads& reads, std::uint32_t stored) const;
  [[nodiscard]] Result<void> load_epochs(Time now);
  [[nodiscard]] Result<void> store_epochs(StoredEpochs epochs);
  [[nodiscard]] Result<void> store_drawn(std::uint32_t epoch);
  [[nodiscard]] Result<void> remember_epochs(const Reads& reads, std::uint32_t used_floor = 0);
  std::uint32_t seen_epoch(const Reads& reads) const;
  void note_epochs(const Reads& reads);
  void note_epochs_of_failed_read(const Reads& reads);
  [[nodiscard]] Result<void> mark_registering();
  void store_registers_settled(Time now);
  std::string not_held(const Reads& reads, std::uint32_t stored) const;

  // resource_acquire.cc: acquire and release (exclusive).
  void acquire_draw(Reads reads, int round, Time at);
  void acquire_register(Key key, Reads reads, int round, Time now);
  // registered: the reads were taken after our REGISTERs executed (the verify's), not before.
  void acquire_take(Key key, Reads reads, bool registered, int round, Time now);
  void acquire_preempt_others(Key key, const Reads& reads, int round, Time now);
  void acquire_verify(Key key, int round, Time now);
  void acquire_succeeded(Key key, Time verified_since, Time now);
  void acquire_failed(Key key, std::string why, Time now);
  void acquire_not_registered(Key key, const std::string& why, Time now);
  void release_keeping(Key key, bool held, Time now);
  Result<void> give_up(Key key);
  void note_uncertain(const std::vector<pr::Response>& responses,
                      const std::vector<std::size_t>& lu_of);
  Time late_execution_horizon() const;
  Time late_execution_end(Time at) const;
  codec::PrOutCommand take_command(Key key, std::uint64_t victim) const;

  // resource_shared.cc: shared mode.
  void release_shared(Key key, Time now);
  void release_registering(Key key, std::optional<Key> then, Time now);
  void unfence_register(Time now);
  void unfence_reserve(Key key, Time now);
  void unfence_verify(Key key, Time now);
  void fence_preempt(std::uint16_t victim, const Reads& reads, Time now);

  // resource_promote.cc: primary mode's promote.
  void promote_draw(const Reads& reads, Time now);
  void promote_take(Key key, const Reads& reads, std::set<std::uint64_t> victims, int round,
                    Time now);
  void promote_verify(Key key, std::set<std::uint64_t> victims, int round, Time now);
  void promote_failed(Key key, std::string why, Time now,
                      ErrorCode failure = ErrorCode::kIndeterminate);
  bool of_old_primary(const std::set<std::uint64_t>& victims, std::uint64_t key, Key ours) const;

  // resource_paths.cc: path hot-plug.
  bool holding() const;
  bool lost_contact_with_key() const;
  void retry_paths_after_a_round(const std::vector<std::pair<std::size_t, pr::Path>>& paths);
  void register_paths_after_a_round(const Reads& reads, Time now);
  bool key_current(const Reads& reads, Key key) const;
  // A path of the LU holds commands back unsent (writes_in_flight fails with EBUSY).
  bool holds_commands_back(std::size_t lu) const;
  void register_new_paths(Time now);
  // again: the paths whose REGISTER was stopped by a sign of a preempt (not registered).
  void new_paths_registered(Key key, std::vector<std::pair<std::size_t, pr::Path>> paths,
                            std::vector<std::pair<std::size_t, pr::Path>> again, Time now);

  // resource_monitor.cc: the checks, the lease, strays and leftovers, the fence.
  void check(Time now);
  void check_done(const Reads& reads, Time started, Time now);
  void count_check(Time started, Time now);
  void check_held(const Reads& reads, bool has_keys, Time started, Time now);
  bool fenced_if_lost(const Reads& reads, Time now);
  void reopen_after_lost_contact(const Reads& reads, bool has_keys, Time started, Time now);
  void check_unfenced(const Reads& reads, bool has_keys, Time started, Time now);
  void take_back_leftover(const Reads& reads, Time now);
  void preempt_strays(const Reads& reads, Time started, Time now);
  bool round_after_monitor_prouts(Time started) const;
  void monitor_send(std::vector<pr::Request> requests, Time now);
  // Runs step once no PR OUT the monitor sent is in flight (at once when none is).
  void after_monitor_prouts(Time now, std::function<void(Time)> step);
  void after_registers_settle(Time now, std::function<void(Time)> step);
  void end_waits_for_returned_commands(Time now);
  // Whether one of them timed out (it may still execute).
  bool note_late_registers(const std::vector<pr::Response>& responses, Time at);
  void fenced(std::optional<std::uint64_t> by, const std::string& lu, const std::string& why,
              Time now);

  // resource_mutants.cc: deliberate protocol bugs for the tests to catch (fence/src/mutants.h); the
  // product never calls them.
  void mutant_reregister(Time now);
  void mutant_unregister_unread(Key key, std::string why, Time now);
  void mutant_release(Key key, Time now);

  ResourceOptions options_;
  pr::Engine& engine_;
  EpochStore& epochs_;
  Observer& observer_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);

  State state_ = State::kUnknown;
  Op op_ = Op::kNone;
  bool probe_done_ = false;
  bool gate_open_ = false;
  std::optional<std::uint64_t> gate_key_;  // the key the gate last opened with (or stayed open)
  bool cancelled_ = false;  // cancel(): the running operation sends no further taking PR OUT
  bool primary_ = false;    // primary mode: our key is the verified holder (promote, or adopted)
  bool promoting_member_ = false;  // a promote started with the member gate open
  bool check_in_flight_ = false;
  bool keys_next_ = true;  // the next check reads keys too
  std::optional<Key> key_;
  std::uint32_t high_water_ = 0;  // no new key at or below it (S3): stored, or seen since
  // Every LU reported PTPL_C: REGISTER with APTPL=1. nullopt while a LU has not answered.
  std::optional<bool> aptpl_;
  std::optional<StoredEpochs> stored_;  // what the node's disk holds; nullopt while it has no file
  StoredEpochs attempted_;              // the highest of every store tried, whatever it reported
  bool epochs_loaded_ = false;          // the last load of the epoch file succeeded
  bool registering_stored_ = false;     // the disk surely says a REGISTER is under way
  std::uint32_t epoch_store_failed_ = 0;  // the highest seen epoch the monitor failed to store
  std::optional<std::uint64_t> fenced_by_;
  std::string detail_;
  std::vector<LuView> views_;

  Done done_;
  std::uint64_t generation_ = 0;  // bumped when an operation starts: stale check answers drop

  std::optional<Time> next_check_;
  std::optional<Time> last_success_;
  std::optional<Time> last_read_ok_;
  int round_ = 0;
  std::vector<bool> uncertain_;  // per LU: a take of the running acquire timed out there
  // A failed acquire's key left registered beside a winner, taken back by the monitor after
  // `after`.
  struct Leftover {
    Key key;
    Time after{0};
  };
  std::optional<Leftover> leftover_;
  // Stray registrations beside our reservation, by node (preempt_strays): when its keys may next
  // be preempted, and how many times they were (the backoff doubles with each, up to
  // 2^kStrayBackoffShift check intervals, and never past a key's deadline); and when each stray
  // key was first seen.
  struct Stray {
    Time next_preempt{0};
    int preempts = 0;
  };
  static constexpr int kStrayBackoffShift = 6;
  std::map<std::uint16_t, Stray> strays_;
  std::map<std::uint64_t, Time> stray_seen_;
  // New paths (LU index, path) waiting to be registered once the resource is idle.
  std::vector<std::pair<std::size_t, pr::Path>> new_paths_;
  // New paths whose registration ended on a failed read, for the next round that reads every LU.
  std::vector<std::pair<std::size_t, pr::Path>> paths_after_a_round_;
  std::function<void(Time)> queued_;  // an acquire or release waiting for a new-path registration
  int monitor_prouts_ = 0;            // batches of PR OUTs the monitor sent, not answered yet
  std::optional<Time> monitor_prouts_answered_;  // when the last of them was answered
  std::function<void(Time)> waiting_;            // an operation's first step, waiting for them
  // Until when a REGISTER of ours that timed out may still execute, and the first step of an
  // acquire, unfence or promote waiting for that moment (after_registers_settle).
  std::optional<Time> registers_settle_;
  // Until when a REGISTER of the daemon's run before this one may still execute: its epoch file
  // said one's outcome was not known (StoredEpochs::registering). Set by the first load.
  std::optional<Time> previous_run_settles_;
  bool previous_run_read_ = false;               // a load succeeded in this run
  bool registers_settled_store_failed_ = false;  // said once, tried again at every round
  // Shared mode: a release's REGISTER to the departed key timed out, and registers_settle_ counts
  // it (the member key's own late REGISTERs are not waited for).
  bool departure_unsettled_ = false;
  std::optional<std::pair<Time, std::function<void(Time)>>> settling_;
  std::optional<std::pair<Time, std::function<void(Time)>>> draining_;  // drain_look's next look
  Time settle_look_{0};  // while settling_: when to look again whether the transport got them back
  Counters counters_;
};

}  // namespace blkfence::fence
