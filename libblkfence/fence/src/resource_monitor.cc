// The monitor of a resource: periodic checks, the lease, strays and leftovers, the fence
// (docs/protocol.md, "Monitor"; fence layer). See resource.h.
#include <algorithm>
#include <set>

#include "blkfence/assert.h"
#include "blkfence/codec/prin.h"
#include "blkfence/codec/prout.h"
#include "blkfence/fence/resource.h"
#include "blkfence/pr/client.h"

#include "mutants.h"
#include "resource_reads.h"

namespace blkfence::fence {

void Resource::on_time(Time now) {
  end_waits_for_returned_commands(now);
  if (gate_open_ && last_success_ && now - *last_success_ >= options_.lease && !mutant::kNoLease) {
    // Fail closed: the storage may have moved on without us being able to see it.
    ++counters_.lost_contact;
    set_gate(false, now);
    set_state(State::kLostContact, "no successful check for the lease (" +
                                       std::to_string(options_.lease.count() / 1'000'000) +
                                       " ms): gate closed");
    emit(EventKind::kLostContact, detail_);
    keys_next_ = true;
  }
  if (op_ == Op::kNone && !check_in_flight_ && state_known() && next_check_ &&
      *next_check_ <= now) {
    check(now);
  }
  if (settling_ && settling_->first <= now) {
    auto step = std::move(settling_->second);
    settling_.reset();
    step(now);
  }
  if (draining_ && draining_->first <= now) {
    auto step = std::move(draining_->second);
    draining_.reset();
    step(now);
  }
}

bool Resource::gate_open_at(Time now) const {
  if (mutant::kNoLease) {
    return gate_open_;
  }
  return gate_open_ && last_success_ && now - *last_success_ < options_.lease;
}

std::optional<Time> Resource::next_wake() const {
  std::optional<Time> wake;
  if (op_ == Op::kNone && !check_in_flight_ && next_check_) {
    wake = next_check_;
  }
  if (gate_open_ && last_success_ && !mutant::kNoLease) {
    const Time expiry = *last_success_ + options_.lease;
    wake = wake ? std::min(*wake, expiry) : expiry;
  }
  if (settling_) {
    // Until its horizon, and every check_interval, to see whether the transport got every command
    // back (end_waits_for_returned_commands).
    const Time look = std::min(settling_->first, settle_look_);
    wake = wake ? std::min(*wake, look) : look;
  }
  if (draining_) {
    wake = wake ? std::min(*wake, draining_->first) : draining_->first;
  }
  return wake;
}

// A command of ours that timed out may still execute at the target until the kernel gives it back
// (answered, or aborted by the midlayer's error handling). The waits for that moment (a failed
// acquire's leftover key, the next acquire, unfence or promote after a REGISTER that timed out) run
// to the fixed horizon, late_execution_horizon(), only where the transport cannot tell; where it
// can, they end at the first look (an operation's start, a monitor round, or every check_interval
// while an operation waits) after it holds nothing it reported indeterminate
// (Transport::unreturned()).
void Resource::end_waits_for_returned_commands(Time now) {
  if (settling_ && settle_look_ <= now) {
    settle_look_ = now + options_.check_interval;
  }
  if (engine_.transport().unreturned() != std::optional<std::size_t>(0)) {
    return;
  }
  if (leftover_) {
    leftover_->after = std::min(leftover_->after, now);
  }
  if (registers_settle_) {
    registers_settle_ = std::min(*registers_settle_, now);
  }
  if (settling_) {
    // The previous run's REGISTERs are not this transport's: their wait runs to its horizon.
    settling_->first =
        std::max(std::min(settling_->first, now), previous_run_settles_.value_or(Time::min()));
  }
}

void Resource::check(Time now) {
  const bool with_keys = keys_next_ || leftover_ || options_.mode == Mode::kShared ||
                         state_ == State::kLostContact || state_ == State::kUnknown ||
                         round_ % options_.keys_every == 0;
  ++round_;
  keys_next_ = false;
  check_in_flight_ = true;
  next_check_ = now + options_.check_interval;
  const std::uint64_t generation = generation_;
  // While the state is unknown the round may decide it as a start does (probe_read): the ports too.
  const Keys keys = state_ == State::kUnknown ? Keys::kKeysAndPorts
                    : with_keys               ? Keys::kKeys
                                              : Keys::kNone;
  read_all(keys, now, [this, generation, now](const Reads& reads, Time at) {
    if (generation != generation_) {
      return;  // an operation started meanwhile; its own reads decide
    }
    check_in_flight_ = false;
    check_done(reads, now, at);
  });
}

void Resource::check_done(const Reads& reads, Time started, Time now) {
  count_check(started, now);
  if (reads.unit_attention) {
    // Reservations preempted or released, registrations preempted, a reset: look again now,
    // keys included (docs/protocol.md, Monitor).
    keys_next_ = true;
    next_check_ = now;
  }
  if (!reads.ok()) {
    ++counters_.check_failures;
    if (state_ == State::kUnknown) {
      detail_ = "cannot read the LUs: " + reads.errors(options_.lus);
    }
    // S3: what did come back counts. A node in lost contact may see the new holder's key on the
    // one LU it can read, just before a target that forgets its PR state loses it.
    note_epochs_of_failed_read(reads);
    // A read that failed proves nothing, but one that came back and shows our key gone does,
    // whatever became of the others: the gate closes at this round, not at the lease's end.
    if ((state_ == State::kHeld || state_ == State::kUnfenced || state_ == State::kLostContact) &&
        key_) {
      fenced_if_lost(reads, now);
    }
    return;  // otherwise the lease decides (on_time)
  }
  last_read_ok_ = started;
  if (state_ == State::kUnknown) {
    // The first read failed at start; decide now, exactly as start() would have.
    begin(Op::kProbe, nullptr);
    probe_read(reads, now);
    return;
  }
  note_epochs(reads);  // S3: a key of the cluster above the stored epochs is stored
  store_registers_settled(now);
  const bool has_keys = std::all_of(reads.lus.begin(), reads.lus.end(),
                                    [](const Reads::Lu& lu) { return lu.keys.has_value(); });
  if (leftover_ && has_keys && started >= leftover_->after) {
    take_back_leftover(reads, now);
  }
  const bool lost = state_ == State::kLostContact;
  if (options_.mode == Mode::kShared && !primary_ && (state_ == State::kUnfenced || lost)) {
    check_unfenced(reads, has_keys, started, now);
  } else if (state_ == State::kHeld || lost) {
    check_held(reads, has_keys, started, now);
  }
  register_paths_after_a_round(reads, now);
}

void Resource::count_check(Time started, Time now) {
  ++counters_.checks;
  const auto latency = now - started;
  counters_.check_latency_last = latency;
  counters_.check_latency_sum += latency;
  counters_.check_latency_max = std::max(counters_.check_latency_max, latency);
}

// Exclusive: our key must still hold every LU and be registered there (keys, when read).
void Resource::check_held(const Reads& reads, bool has_keys, Time started, Time now) {
  BLKFENCE_ASSERT(key_.has_value());
  if (fenced_if_lost(reads, now)) {
    return;
  }
  last_success_ = started;
  if (has_keys && !primary_) {
    preempt_strays(reads, started, now);  // in primary mode the other keys are the members
  }
  if (state_ == State::kLostContact) {
    reopen_after_lost_contact(reads, has_keys, started, now);
  }
}

// The fence, declared on the first LU whose answers show our key lost: not registered (READ
// KEYS), or, in exclusive mode and for the primary of primary mode, not the holder (another holder
// or none: READ RESERVATION; in shared mode another member's reservation, or none, is no loss).
// Only the answers that came back count, so a round with a failed read still proves what its other
// reads show.
bool Resource::fenced_if_lost(const Reads& reads, Time now) {
  BLKFENCE_ASSERT(key_.has_value());
  const bool shared = options_.mode == Mode::kShared;
  if (shared && mutant::kSharedIgnoresFence) {
    return false;
  }
  // The primary of primary mode is a holder as in exclusive mode.
  const bool holds = !shared || primary_;
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    const bool holder_read = holds && reads.lus[i].reservation.has_value();
    const auto holder = reads.holder(i);
    const bool not_holder = holder_read && holder != key_->value();
    const bool key_gone = reads.lus[i].keys.has_value() && !reads.registered(i, key_->value());
    if (not_holder || key_gone) {
      // READ RESERVATION may have run before the preempt and READ KEYS after it: the holder
      // read is then our own key, and the one that fenced us is the key registered instead. An
      // All Registrants reservation (shared mode) names no holder: READ RESERVATION says key 0,
      // and which member fenced us is not on the LU.
      std::optional<std::uint64_t> by = holder == std::uint64_t{0} ? std::nullopt : holder;
      if (by == key_->value()) {
        const auto others = reads.others(i, key_->value());
        by = others.empty() ? std::nullopt : std::optional(others.front());
      }
      fenced(by, options_.lus[i].name,
             not_holder ? (holder ? "the reservation is held by " + Key::format(*holder)
                                  : std::string("no reservation"))
                        : "our key is no longer registered",
             now);
      return true;
    }
  }
  return false;
}

// Lost contact ends when a check sees our key as the holder again; the gate reopens only while it
// is still the only registrant (keys read), as after a verified acquire, and only on a check
// younger than the lease (a round slower than the lease would open the gate with its lease over:
// S2; the next round decides).
void Resource::reopen_after_lost_contact(const Reads& reads, bool has_keys, Time started,
                                         Time now) {
  if (now - started >= options_.lease) {
    keys_next_ = true;
    detail_ = "contact is back, but the check took longer than the lease; the gate stays closed";
    return;
  }
  bool sole = has_keys;
  for (std::size_t i = 0; sole && i < reads.lus.size() && !primary_; ++i) {
    sole = reads.others(i, key_->value()).empty();  // the primary's members stay registered
  }
  if (!sole) {
    keys_next_ = true;
    detail_ = "contact is back but other keys are registered; the gate stays closed";
    return;
  }
  set_state(State::kHeld, "contact is back and " + key_->to_string() +
                              " is still the only holder: gate reopened");
  set_gate(true, started);
  emit(EventKind::kContactRestored, detail_);
}

// Shared: our key must stay registered on every LU, and a reservation must protect each. Lost
// contact ends when a check younger than the lease shows both again: the gate reopens in the
// shared state (never as an exclusive holder, which would preempt the other members as strays).
void Resource::check_unfenced(const Reads& reads, bool has_keys, Time started, Time now) {
  BLKFENCE_ASSERT(key_.has_value());
  if (fenced_if_lost(reads, now)) {
    return;
  }
  std::vector<pr::Request> reserves;
  for (std::size_t i = 0; i < reads.lus.size() && !options_.primary; ++i) {
    if (!reads.lus[i].reservation->reservation) {
      // Without a reservation any nexus may write; putting one back registers nothing (S5).
      reserves.push_back(pr::prout_first_path(
          options_.lus[i], codec::prout_reserve(key_->value(), options_.type), "RESERVE"));
    }
  }
  last_success_ = started;
  const bool reserved = reserves.empty();
  if (!round_after_monitor_prouts(started)) {
    reserves.clear();
  }
  if (state_ == State::kLostContact) {
    if (has_keys && reserved && now - started < options_.lease) {
      set_state(State::kUnfenced, "contact is back and " + key_->to_string() +
                                      " is still registered everywhere: gate reopened");
      set_gate(true, started);
      emit(EventKind::kContactRestored, detail_);
    } else {
      keys_next_ = true;
      detail_ =
          "contact is back; the gate reopens once a check within the lease shows our key "
          "registered under a reservation on every LU";
    }
  }
  if (!reserves.empty()) {
    monitor_send(std::move(reserves), now);
  }
}

// The key of a failed acquire, still registered where another node holds, once no PREEMPT of that
// acquire can execute any more (see acquire_failed): unregistered there. Where it became the
// holder after all, it keeps the reservation with the gate closed, as after a release.
void Resource::take_back_leftover(const Reads& reads, Time now) {
  const Key key = leftover_->key;
  leftover_.reset();
  std::vector<pr::Request> requests;
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    const auto holder = reads.holder(i);
    if (holder && *holder != key.value() && reads.registered(i, key.value())) {
      for (auto& request : pr::prout_every_path(
               options_.lus[i], codec::prout_register(key.value(), 0, register_options()),
               "REGISTER (unregister)")) {
        requests.push_back(std::move(request));
      }
    }
  }
  if (!requests.empty()) {
    monitor_send(std::move(requests), now);
  }
}

// Registrations of this cluster beside our reservation: under type 5 every registered nexus may
// write, so no key of ours but the holder's may stay. A key that ranks below ours is an acquire
// that failed, or one that will fail at its verify (it reads our key above its own), or a
// REGISTER that executed late. A key that outranks ours is an acquire in progress that is about to
// take over, or one that died or failed between its REGISTERs and its take (a crash, a lost
// contact). Both are preempted (the reservation stays ours); the one above ours only once it has
// been seen for acquire_window(), the time a live acquire may take from its REGISTERs to its end,
// so that a racing acquire is not cut short. Foreign clusters' keys are not ours to judge: they
// are left and shown in the status.
//
// When, per node: a stray is preempted at the first keys round at least one check_interval after
// it was first seen (acquire_window() for a key above ours), so that the PR OUTs of an acquire
// still running on its node are over; and a node whose stray comes back after a preempt (it
// re-registers: S5 broken, or acquires that keep failing) waits twice as long each time, up to 64
// intervals, but never past acquire_window() after the key was first seen: every stray goes
// within stray_bound(). Two nodes' PR OUTs that meet in the target, one removing the other's
// registration while the other re-keys, reserves, preempts or unregisters through it, can
// deadlock LIO (docs/operations.md): the holder must not run that cycle at the monitor's rate.
void Resource::preempt_strays(const Reads& reads, Time started, Time now) {
  if (!round_after_monitor_prouts(started)) {
    keys_next_ = true;  // the next round reads what our last PR OUT did
    return;
  }
  const Key key = *key_;
  const Time window = acquire_window(options_, engine_.policy().command_timeout);
  std::vector<pr::Request> requests;
  std::set<std::uint16_t> seen;
  std::set<std::uint64_t> seen_keys;
  std::set<std::uint16_t> preempting;
  std::set<std::uint64_t> preempted_keys;
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    for (const std::uint64_t other : reads.others(i, key.value())) {
      if (Key::cluster_of(other) != options_.cluster_id ||
          (mutant::kStraysAboveLeft && outranks(other, key))) {
        continue;
      }
      const auto node = Key::node_of(other);
      seen.insert(node);
      seen_keys.insert(other);
      const Time first_seen = stray_seen_.try_emplace(other, now).first->second;
      const Time grace = outranks(other, key) ? window : Time(options_.check_interval);
      const Stray& stray = strays_.try_emplace(node).first->second;
      const Time due =
          std::max(first_seen + grace, std::min(stray.next_preempt, first_seen + window));
      if (now < due) {
        keys_next_ = true;  // look again when it is due
        continue;
      }
      preempting.insert(node);
      preempted_keys.insert(other);
      requests.push_back(pr::prout_first_path(options_.lus[i], take_command(key, other),
                                              "PREEMPT (stray registration)"));
    }
  }
  // A node that stayed away for its whole window is forgotten: its next stray starts afresh.
  std::erase_if(strays_, [&](const auto& entry) {
    return !seen.contains(entry.first) && now >= entry.second.next_preempt;
  });
  // A key seen again after its preempt was registered again: its time runs from that sighting (and
  // the node's back-off), not from its first registration.
  std::erase_if(stray_seen_, [&](const auto& entry) {
    return !seen_keys.contains(entry.first) || preempted_keys.contains(entry.first);
  });
  for (const std::uint16_t node : preempting) {
    Stray& stray = strays_[node];
    stray.preempts = std::min(stray.preempts + 1, kStrayBackoffShift);
    stray.next_preempt = now + options_.check_interval * (1 << stray.preempts);
  }
  if (requests.empty()) {
    return;
  }
  keys_next_ = true;  // see whether they went
  ++counters_.strays_preempted;
  monitor_send(std::move(requests), now);
}

// S4: a PR OUT of the monitor's that is still out, or was answered (perhaps failed) after the round
// that began at `started` was issued, is not followed by another on that round's word: a later
// round reads what it did. (A round whose read timed out and was sent again on another path can end
// long after its other reads came back.)
bool Resource::round_after_monitor_prouts(Time started) const {
  return monitor_prouts_ == 0 &&
         (!monitor_prouts_answered_ || started >= *monitor_prouts_answered_);
}

// The monitor's PR OUTs decide nothing (the next round reads what they did), but an operation that
// starts meanwhile waits for their answers (after_monitor_prouts) so that its first read comes
// after them (S4: a failed or indeterminate PR OUT is followed by a read before the next PR OUT).
void Resource::monitor_send(std::vector<pr::Request> requests, Time now) {
  ++monitor_prouts_;
  std::weak_ptr<bool> alive = alive_;
  engine_.start(std::move(requests), now, [this, alive](const std::vector<pr::Response>&, Time at) {
    if (alive.expired()) {
      return;
    }
    monitor_prouts_answered_ = at;
    if (--monitor_prouts_ == 0 && waiting_) {
      auto step = std::move(waiting_);
      waiting_ = nullptr;
      step(at);
    }
  });
}

void Resource::after_monitor_prouts(Time now, std::function<void(Time)> step) {
  if (monitor_prouts_ == 0) {
    step(now);
    return;
  }
  BLKFENCE_ASSERT(!waiting_);
  waiting_ = std::move(step);
}

// Exclusive mode draws a new key for every acquire, primary mode for every unfence and promote. A
// REGISTER AND IGNORE EXISTING KEY of an earlier key that timed out (an acquire's, a new path's, a
// promote's) may still execute after the next one registered its key, and move a nexus back to
// the older key after the verify read showed the new one (S2). So the next one starts its reads
// only once such a command can no longer execute. (Shared mode's members register one key, epoch
// 0, every time: a late REGISTER of it changes nothing. A release's move to the departed key that
// timed out does: executed after the next unfence, it would move a nexus off the member's key.)
void Resource::after_registers_settle(Time now, std::function<void(Time)> step) {
  end_waits_for_returned_commands(now);
  const bool member_keys = options_.mode == Mode::kShared && !options_.primary;
  const Time ours = registers_settle_.value_or(Time::min());
  const Time previous_run = previous_run_settles_.value_or(Time::min());
  if ((member_keys && !departure_unsettled_) || std::max(ours, previous_run) <= now) {
    registers_settle_.reset();
    departure_unsettled_ = false;
    step(now);
    return;
  }
  BLKFENCE_ASSERT(!settling_);
  detail_ = ours > now ? "waiting until a REGISTER of ours that timed out can no longer execute"
                       : "waiting until a REGISTER the daemon sent before it restarted, whose "
                         "outcome it did not learn, can no longer execute";
  settling_.emplace(std::max(ours, previous_run), std::move(step));
  settle_look_ = now + options_.check_interval;
}

bool Resource::note_late_registers(const std::vector<pr::Response>& responses, Time at) {
  bool late = false;
  for (const pr::Response& response : responses) {
    if (!response.data && response.data.error().code() == ErrorCode::kIndeterminate) {
      const Time settles = late_execution_end(at);
      registers_settle_ = registers_settle_ ? std::max(*registers_settle_, settles) : settles;
      late = true;
    }
  }
  return late;
}

void Resource::fenced(std::optional<std::uint64_t> by, const std::string& lu,
                      const std::string& why, Time now) {
  ++counters_.fenced;
  fenced_by_ = by;
  primary_ = false;
  set_gate(false, now);
  // S5: from here on nothing registers our key again until an explicit acquire or unfence.
  set_state(State::kFenced, "fenced on " + lu + ": " + why);
  emit(EventKind::kFenced, detail_, by, lu);
  if constexpr (mutant::kReregister) {
    mutant_reregister(now);
  }
}

}  // namespace blkfence::fence
