// The world of one seed of blkfence_sim (tests/sim, world.h): the configuration drawn from the
// seed, the scenario planned from it and acted out, the quiet phase with its final acquire, the
// event loop that advances the simulated clock, and the record handed to the checker.
// Single-threaded.
#include "world.h"

#include <algorithm>
#include <string>
#include <vector>

#include <poll.h>

#include "blkfence/assert.h"
#include "blkfence/key.h"

namespace blkfence::sim {

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
  c.preempt_abort = cli.preempt_abort.value_or(c.preempt_abort);
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
  // Writes are held in the target's task set under either preempt: PREEMPT AND ABORT aborts them,
  // while under a plain PREEMPT a write held across the preempt lands after it (SPC-4
  // 5.13.11.2.4), the hazard the configuration choice is about, which no protocol can prevent:
  // the checker reports those landings apart from S1 (checker.h, held_across_plain_preempt).
  c.writer_faults =
      transport::RandomFaults{.drop_request = rng.rate(10),
                              .drop_response = rng.rate(10),
                              .delay_response = rng.rate(20),
                              .execute_late = rng.rate(50),
                              .duplicate = 0.0,
                              .unit_attention = rng.rate(10),
                              .delay_max = rng.time_between(milliseconds(1), c.check_interval)};
  c.write_interval_min = milliseconds(rng.between(50, 200));
  c.write_interval_max = c.write_interval_min + milliseconds(rng.between(0, 300));
  c.horizon = seconds(rng.between(30, 120));
  c.register_pause_percent = rng.between(10, 40);
  return c;
}

// --- World ---------------------------------------------------------------------------------------

World::World(const Cli& cli, std::uint64_t seed)
    : cli_(cli),
      seed_(seed),
      plan_rng_(mix(seed, 0, 0, 0x50)),
      runtime_rng_(mix(seed, 0, 0, 0x52)),
      hotplug_rng_(mix(seed, 0, 0, 0x48)),
      power_rng_(mix(seed, 0, 0, 0x5043)),
      shared_rng_(mix(seed, 0, 0, 0x53)),
      primary_rng_(mix(seed, 0, 0, 0x70)),
      cancel_rng_(mix(seed, 0, 0, 0x43)),
      crash_rng_(mix(seed, 0, 0, 0x4b)),
      recovery_rng_(mix(seed, 0, 0, 0x5245)),
      config_(draw_config(plan_rng_, cli)) {
  // Shared mode (with --shared, in half the seeds), from its own stream so that the rest of the
  // scenario is the same with or without it. LIO's PREEMPT AND ABORT aborts the commands that were
  // accepted under the preempted key as the holder's (docs/reference/lio.md §4), and a shared
  // member's writes pass under whichever member holds: a fenced member's write held in the task set
  // lands after the preempt whatever the protocol does, the hazard that plain PREEMPT is in
  // exclusive mode (draw_config). So in shared mode no write is held.
  config_.shared = cli.shared && shared_rng_.chance(1, 2);
  if (config_.shared) {
    config_.writer_faults.execute_late = 0.0;
  }
  // Primary mode (with --primary, in half the seeds not in shared mode), from its own stream too.
  // Writes stay held under PREEMPT AND ABORT as in exclusive mode: a promote preempts the old
  // primary, the holder, whose queued commands LIO aborts; a member's queued writes, marked with
  // the holder's key, are aborted with them (refused, never landed).
  const bool primary_drawn = primary_rng_.chance(1, 2);
  config_.primary = cli.primary && !config_.shared && primary_drawn;
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
  record_.strict_s1 = cli.strict_s1;
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
  record_.mode = config_.shared || config_.primary ? fence::Mode::kShared : fence::Mode::kExclusive;
  record_.primary = config_.primary;
  // Exclusive mode: every stray registration goes within this bound of the later of its
  // registration and the holder's gate opening (docs/protocol.md, "Stray registrations"). The
  // checker judges it in the quiet phase (checker.cc, R1).
  if (!config_.shared && !config_.primary) {
    record_.stray_bound = fence::stray_bound(nodes_.front()->options(), config_.command_timeout);
  }
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
  // An acquire armed before the quiet phase may send its REGISTERs after it began (waiting for the
  // monitor's PR OUTs, or for a late REGISTER of its own): the quiet phase pauses and kills
  // nobody, or the final acquire could find a node without a daemon.
  if (!faults_on_) {
    return;
  }
  pause_requests_.push_back(&node);
}

// The scenario: what the cluster manager and the environment do, and when.
template <typename Plan>
void World::every(Rng& rng, Time least, Time most, bool on, Plan plan) {
  for (Time at = rng.time_between(least, most); on && at < config_.horizon;
       at += rng.time_between(least, most)) {
    Action action;
    action.at = at;
    action.node = rng.below(config_.nodes);
    plan(action);
  }
}

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
  // Paths that come and go (with --hotplug, in half the seeds), from their own stream so that the
  // rest of the scenario is the same with or without them.
  Rng& paths = hotplug_rng_;
  const bool drawn = paths.chance(1, 2);
  config_.hotplug = cli_.hotplug && drawn;
  every(paths, seconds(1), seconds(10), config_.hotplug, [&](Action& action) {
    action.kind = Action::Kind::kPaths;
    action.lus.push_back(static_cast<LuId>(paths.below(config_.lus)));
    action.add = paths.chance(1, 2);
    actions_.push_back(action);
    // A third of the new paths race another node's acquire, at the same instant or within a round
    // trip: its PREEMPT meets the new path's REGISTER AND IGNORE EXISTING KEY (docs/protocol.md,
    // "Paths that come and go").
    if (action.add && paths.chance(1, 3)) {
      Action other = action;
      other.kind = Action::Kind::kAcquire;
      other.lus.clear();
      other.node = (action.node + 1 + paths.below(n - 1)) % n;
      other.at += paths.time_between(Time{0}, 2 * config_.latency_max);
      actions_.push_back(other);
    }
  });
  // A LU's power cycle, in one seed of five, once, from its own stream so that the rest of the
  // scenario is the same with or without it. The target keeps the PR state where APTPL is active
  // (docs/protocol.md, "Power loss and APTPL"), and otherwise forgets it; in half those seeds no LU
  // reports PTPL_C, so the nodes never set APTPL and the power cycle forgets. S3 must hold across
  // both.
  if (power_rng_.chance(1, 5)) {
    Action action;
    action.at = power_rng_.time_between(seconds(1), config_.horizon);
    action.kind = Action::Kind::kPowerCycle;
    action.lus.push_back(static_cast<LuId>(power_rng_.below(config_.lus)));
    actions_.push_back(action);
    if (power_rng_.chance(1, 2)) {
      for (std::size_t lu = 0; lu < config_.lus; ++lu) {
        target_.set_ptpl_capable(static_cast<LuId>(lu), false);
      }
    }
  }
  // Paths in recovery (with --recovery, in half the seeds), from their own stream so that the rest
  // of the scenario is the same with or without them: every 1-8 s a path of a node to a LU holds
  // its commands in the host for 0.1-10 s (docs/protocol.md, "Writes queued in the initiator"),
  // then sends them, or in one case of four is torn down and fails them unsent.
  Rng& recovery = recovery_rng_;
  const bool recovery_drawn = recovery.chance(1, 2);
  config_.recovery = cli_.recovery && recovery_drawn;
  every(recovery, seconds(1), seconds(8), config_.recovery, [&](Action& action) {
    action.kind = Action::Kind::kRecovery;
    action.lus.push_back(static_cast<LuId>(recovery.below(config_.lus)));
    action.duration = recovery.time_between(milliseconds(100), seconds(10));
    action.add = recovery.chance(3, 4);
    actions_.push_back(action);
  });
  // Shared mode (drawn in the constructor): every planned acquire is an unfence, and every 1-6 s a
  // node fences another (refused unless it is unfenced), drawn from the shared stream.
  Rng& shared = shared_rng_;
  every(shared, seconds(1), seconds(6), config_.shared, [&](Action& action) {
    action.kind = Action::Kind::kFence;
    action.victim = (action.node + 1 + shared.below(n - 1)) % n;
    actions_.push_back(action);
  });
  // Primary mode: every planned acquire is an unfence (a member joins), and every 1-6 s a node
  // promotes; a third of the time a second node promotes at the same instant or within a round
  // trip (the leader lock of the cluster manager normally prevents it; the protocol must not rely
  // on it).
  Rng& primary = primary_rng_;
  every(primary, seconds(1), seconds(6), config_.primary, [&](Action& action) {
    action.kind = Action::Kind::kPromote;
    actions_.push_back(action);
    if (primary.chance(1, 3)) {
      Action other = action;
      other.node = (action.node + 1 + primary.below(n - 1)) % n;
      if (primary.chance(1, 2)) {
        other.at += primary.time_between(Time{0}, 2 * config_.latency_max);
      }
      actions_.push_back(other);
    }
  });
  // Cancels (every mode, from their own stream): a quarter of the acquires (exclusive) and promotes
  // are cancelled by their caller at a random moment, within a few round trips (in the middle of
  // a batch) or within two command timeouts (a command that timed out, a pause).
  std::vector<Action> cancels;
  for (const Action& action : actions_) {
    const bool cancellable =
        action.kind == Action::Kind::kPromote ||
        (action.kind == Action::Kind::kAcquire && !config_.shared && !config_.primary);
    if (!cancellable || !cancel_rng_.chance(1, 4)) {
      continue;
    }
    Action cancel = action;
    cancel.kind = Action::Kind::kCancel;
    cancel.at += cancel_rng_.chance(1, 2)
                     ? cancel_rng_.time_between(Time{0}, 4 * config_.latency_max)
                     : cancel_rng_.time_between(Time{0}, 2 * Time(config_.command_timeout));
    cancels.push_back(cancel);
  }
  actions_.insert(actions_.end(), cancels.begin(), cancels.end());
  std::stable_sort(actions_.begin(), actions_.end(),
                   [](const Action& a, const Action& b) { return a.at < b.at; });
}

void World::act(const Action& action) {
  Node& node = *nodes_[action.node];
  switch (action.kind) {
    case Action::Kind::kAcquire:
      node.acquire(config_.shared || config_.primary ? "unfence" : "acquire");
      break;
    case Action::Kind::kPromote: node.promote("promote"); break;
    case Action::Kind::kCancel: node.cancel(); break;
    case Action::Kind::kRelease: node.release(); break;
    case Action::Kind::kFence: node.fence(nodes_[action.victim]->id()); break;
    case Action::Kind::kPause:
      if (node.running()) {
        node.pause(now() + action.duration, action.writer_too);
      }
      break;
    case Action::Kind::kOutage:
      node.set_links(action.lus, action.link, now() + action.duration);
      break;
    case Action::Kind::kPaths: node.hotplug(action.lus.front(), action.add, hotplug_rng_); break;
    case Action::Kind::kRecovery:
      node.recover(action.lus.front(), recovery_rng_, now() + action.duration, action.add);
      break;
    case Action::Kind::kPowerCycle: {
      const bool kept = target_.power_cycle(action.lus.front());
      ++power_cycles_;
      power_cycles_kept_ += kept ? 1 : 0;
      trace(0, EntryKind::kPowerCycle).detail = "LU " + std::to_string(action.lus.front()) +
                                                " power cycle: PR state " +
                                                (kept ? "kept (APTPL)" : "forgotten");
      break;
    }
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
  trace(0, EntryKind::kQuiet).detail =
      "faults off, links up, paths recovered, every daemon running";
  for (auto& node : nodes_) {
    node->links_up();
    node->recoveries_end(true);
    if (node->paused()) {
      node->resume();
    }
    if (!node->alive()) {
      node->boot();
    }
  }
  // In exclusive mode the final acquire waits until the holder had the time to remove every stray
  // (stray_bound), so that the checker's R1 judges the monitor's removals, not the acquire's.
  final_acquire_at_ =
      now() + std::max<Time>(config_.lease, record_.stray_bound) + config_.check_interval;
}

void World::final_acquire() {
  // Once no operation of the scenario runs any more, by a node whose gate is closed (the drawn
  // one, or the next): a takeover, or a fresh acquire, after the chaos; in shared mode an unfence,
  // which must succeed beside the members already unfenced.
  for (const auto& node : nodes_) {
    if (node->resource() && node->resource()->busy()) {
      final_acquire_at_ = now() + config_.check_interval;
      return;
    }
  }
  std::size_t pick = final_node_;
  bool closed = false;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const std::size_t candidate = (final_node_ + i) % nodes_.size();
    if (!nodes_[candidate]->resource()->gate_open()) {
      pick = candidate;
      closed = true;
      break;
    }
  }
  // Primary mode: the final promote is by a node that is not the primary (every gate may be open,
  // the members' too).
  for (std::size_t i = 0; config_.primary && !closed && i < nodes_.size(); ++i) {
    const std::size_t candidate = (final_node_ + i) % nodes_.size();
    if (nodes_[candidate]->resource()->state() != fence::State::kHeld) {
      pick = candidate;
      break;
    }
  }
  // Registrations the protocol leaves beside a holder (a node that died or failed in the middle
  // of an acquire, a REGISTER that executed after its acquire gave up): allowed by the design
  // (docs/protocol.md, monitor), reported as notes. The final acquire removes them. In shared mode
  // every member is registered beside the holder: nothing to note.
  const std::vector<LuState> lus = snapshot();
  for (const auto& node : nodes_) {
    const fence::Resource* resource = node->resource();
    if (config_.shared || config_.primary || !resource->gate_open() || !resource->key()) {
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
  if (config_.primary) {
    nodes_[pick]->promote("final promote");
  } else {
    nodes_[pick]->acquire(config_.shared ? "final unfence" : "final acquire");
  }
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
      if (!node->running()) {
        continue;
      }
      // A quarter of them die there instead, between their REGISTERs and their take (drawn from
      // a stream of its own): the new key stays registered beside the holder's, a stray that
      // outranks it, until the holder removes it (docs/protocol.md, "Stray registrations").
      if (crash_rng_.chance(1, 4)) {
        node->crash();
        node->schedule_boot(now() + crash_rng_.time_between(Time{0}, seconds(2)));
        continue;
      }
      node->pause(now() + runtime_rng_.time_between(config_.lease / 2, 3 * config_.lease),
                  runtime_rng_.chance(1, 2));
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
  for (const Violation& held : held_across_plain_preempt(record_)) {
    record_.notes.push_back("held across a plain PREEMPT (S1 holds only with PREEMPT AND ABORT): " +
                            held.what);
    for (const std::string& line : held.lines) {
      record_.notes.push_back("    " + line);
    }
  }
  return violations;
}

Stats World::stats() const {
  Stats s;
  s.seeds = 1;
  s.simulated = record_.end;
  s.commands = record_.commands.size();
  // Shared mode: an unfence is an acquisition, and a fence is a fence_node that removed its
  // victim's keys (the victim's own Fenced event follows only when its monitor runs to see it).
  const fence::EventKind fence_kind =
      config_.shared ? fence::EventKind::kFencedNode : fence::EventKind::kFenced;
  for (const Entry& entry : record_.trace) {
    if (entry.kind == EntryKind::kEvent) {
      s.acquisitions +=
          entry.event == fence::EventKind::kAcquired || entry.event == fence::EventKind::kUnfenced
              ? 1
              : 0;
      s.fences += entry.event == fence_kind ? 1 : 0;
      s.lost_contacts += entry.event == fence::EventKind::kLostContact ? 1 : 0;
    }
  }
  s.power_cycles = power_cycles_;
  s.power_cycles_kept = power_cycles_kept_;
  s.stray_registrations = static_cast<std::uint64_t>(
      std::count_if(record_.notes.begin(), record_.notes.end(), [](const std::string& note) {
        return note.find("stray registration") != std::string::npos;
      }));
  s.held_landings = static_cast<std::uint64_t>(std::count_if(
      record_.notes.begin(), record_.notes.end(),
      [](const std::string& note) { return note.starts_with("held across a plain PREEMPT"); }));
  for (const auto& node : nodes_) {
    s.writes_landed += node->writes_landed;
    s.writes_refused += node->writes_refused;
  }
  return s;
}

}  // namespace blkfence::sim
