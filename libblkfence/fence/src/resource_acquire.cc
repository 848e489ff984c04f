// The exclusive protocol of a resource: acquire and release (docs/protocol.md, "Acquire" and
// "Release"; fence layer). See resource.h.
#include <algorithm>
#include <set>
#include <utility>

#include "blkfence/assert.h"
#include "blkfence/codec/prin.h"
#include "blkfence/codec/prout.h"
#include "blkfence/fence/resource.h"
#include "blkfence/pr/client.h"

#include "mutants.h"
#include "resource_reads.h"

namespace blkfence::fence {

void Resource::acquire(Time now, Done done) {
  if (options_.mode == Mode::kExclusive &&
      queue_behind_paths([this, done](Time at) mutable { acquire(at, std::move(done)); })) {
    return;
  }
  if (refuse(Mode::kExclusive, now, done)) {
    return;
  }
  if (state_ == State::kHeld && gate_open_) {
    done(*key_, now);  // the monitor keeps verifying it
    return;
  }
  begin(Op::kAcquire, std::move(done));
  uncertain_.assign(options_.lus.size(), false);
  leftover_.reset();   // the new key replaces it on every path
  new_paths_.clear();  // every path is registered
  paths_after_a_round_.clear();
  const State before = state_;
  set_gate(false, now);
  set_state(State::kAcquiring, "reading keys and reservations");
  // A missing file reads as nothing stored: the draw is above every key the read below shows,
  // which for a node whose file was lost includes its own (docs/protocol.md, S3).
  if (auto loaded = load_epochs(now); !loaded) {
    set_state(before, detail_);
    end(tl::unexpected(loaded.error()), now);
    return;
  }
  after_monitor_prouts(now, [this, before](Time monitor_done) {
    after_registers_settle(monitor_done, [this, before](Time settled) {
      with_capabilities(settled, [this, before](Time from) {
        read_all(Keys::kKeysAndPorts, from, [this, before](Reads reads, Time at) {
          if (!reads.ok()) {
            set_state(before == State::kFenced ? State::kFenced : State::kReleased,
                      "acquire failed: " + reads.errors(options_.lus));
            end(fail(ErrorCode::kIndeterminate,
                     "acquire of " + options_.name +
                         ": cannot read the LUs: " + reads.errors(options_.lus)),
                at);
            return;
          }
          if (const std::string elsewhere = key_used_elsewhere(reads); !elsewhere.empty()) {
            set_state(before == State::kFenced ? State::kFenced : State::kReleased,
                      "acquire refused: " + elsewhere);
            end(fail(ErrorCode::kKeyInUse, "acquire of " + options_.name + ": " + elsewhere), at);
            return;
          }
          acquire_draw(std::move(reads), 0, at);
        });
      });
    });
  });
}

// Draws the epoch from what reads showed (S3: above every key of this cluster seen and the stored
// high-water mark), stores it, and registers the new key on every path.
void Resource::acquire_draw(Reads reads, int round, Time at) {
  const Result<std::uint32_t> epoch = draw_epoch(reads, "acquire");
  if (!epoch && round > 0 && key_) {
    // A redraw over a racer: the key of the first draw is registered, maybe holding; take it back
    // as any failed acquire does.
    acquire_failed(*key_, epoch.error().message(), at);
    return;
  }
  if (!epoch) {
    set_state(State::kReleased, epoch.error().message());
    end(tl::unexpected(epoch.error()), at);
    return;
  }
  const Key key = key_for(mutant::kNoEpochBump && *epoch > 1 ? *epoch - 1 : *epoch);
  // S3: durable before the key exists anywhere, so no restart can reuse it.
  if (auto stored_epoch = store_drawn(key.epoch()); !stored_epoch) {
    set_state(State::kReleased, "cannot store the epoch");
    end(tl::unexpected(stored_epoch.error()), at);
    return;
  }
  key_ = key;
  fenced_by_.reset();
  set_state(State::kAcquiring, "registering " + key.to_string());
  acquire_register(key, std::move(reads), round, at);
}

void Resource::acquire_register(Key key, Reads reads, int round, Time now) {
  if (cancelled_) {
    acquire_failed(key, "cancelled before registering", now);
    return;
  }
  drain_before_register(
      reads, key, now, [this, key, round, reads](const std::string& draining, Time from) mutable {
        if (!draining.empty()) {
          acquire_not_registered(key, draining, from);
          return;
        }
        if (cancelled_) {
          acquire_failed(key, "cancelled before registering", from);
          return;
        }
        run(register_everywhere(key), from,
            [this, key, round, reads = std::move(reads)](const std::vector<pr::Response>& responses,
                                                         Time at) mutable {
              note_late_registers(responses, at);
              if (const std::string error = first_error(responses); !error.empty()) {
                acquire_failed(key, "register: " + error, at);
                return;
              }
              acquire_take(key, std::move(reads), false, round, at);
            });
      });
}

// A PREEMPT or RESERVE that timed out may still execute, and make our key the holder, at any time
// until the target has answered or aborted it; acquire_failed must not unregister there.
void Resource::note_uncertain(const std::vector<pr::Response>& responses,
                              const std::vector<std::size_t>& lu_of) {
  for (std::size_t r = 0; r < responses.size(); ++r) {
    if (!responses[r].data && responses[r].data.error().code() == ErrorCode::kIndeterminate) {
      uncertain_[lu_of[r]] = true;
    }
  }
}

codec::PrOutCommand Resource::take_command(Key key, std::uint64_t victim) const {
  return options_.preempt_abort ? codec::prout_preempt_and_abort(key.value(), victim, options_.type)
                                : codec::prout_preempt(key.value(), victim, options_.type);
}

void Resource::acquire_take(Key key, Reads reads, bool registered, int round, Time now) {
  if (cancelled_) {
    // The caller is gone: taking a LU now could preempt a holder that came after it.
    acquire_failed(key, "cancelled before taking the LUs", now);
    return;
  }
  for (std::size_t i = 0; i < options_.lus.size(); ++i) {
    // A key of another node of this cluster with an epoch as high as ours holds: it registered
    // after our read, and it may well have opened its gate already. Taking over with our key
    // would give two tokens the same epoch (BLKFENCE_EPOCH must order them, S3); draw a new one,
    // above it, and register that instead.
    const auto holder = reads.holder(i);
    if (holder && !ours(*holder) && Key::cluster_of(*holder) == options_.cluster_id &&
        Key::epoch_of(*holder) >= key.epoch()) {
      if (round + 1 >= options_.verify_rounds_max) {
        acquire_failed(key, "take: " + options_.lus[i].name + " is held by " + Key::format(*holder),
                       now);
        return;
      }
      acquire_draw(std::move(reads), round + 1, now);
      return;
    }
  }
  set_state(State::kAcquiring, "taking the reservation with " + key.to_string());
  std::vector<pr::Request> requests;
  std::vector<std::size_t> lu_of;
  for (std::size_t i = 0; i < options_.lus.size(); ++i) {
    const auto holder = reads.holder(i);
    if (holder == key.value()) {
      continue;
    }
    lu_of.push_back(i);
    // An older key of our own holds (an acquire after lost contact, or after one that failed past
    // this step): the register step moved our holding nexus to the new key, so there is nothing
    // left to preempt (a PREEMPT of the old key would find no registration and conflict).
    // RESERVE, on the first path as every take, is GOOD for the holder. But when it still holds
    // after our REGISTERs executed, it holds through a nexus this node no longer has (a path that
    // went away), which RESERVE cannot move: preempt it like any holder.
    if (holder && (!ours(*holder) || registered)) {
      requests.push_back(
          pr::prout_first_path(options_.lus[i], take_command(key, *holder),
                               options_.preempt_abort ? "PREEMPT AND ABORT" : "PREEMPT"));
    } else {
      requests.push_back(pr::prout_first_path(
          options_.lus[i], codec::prout_reserve(key.value(), options_.type), "RESERVE"));
    }
  }
  run(std::move(requests), now,
      [this, key, round, reads = std::move(reads), lu_of](
          const std::vector<pr::Response>& responses, Time at) {
        note_uncertain(responses, lu_of);
        if (const std::string error = first_error(responses); !error.empty()) {
          // Someone moved first, or the answer is unknown (S4): the verify reads again and decides
          // whether a racer outranks us (we lost) or not (take those LUs back).
          if (round + 1 >= options_.verify_rounds_max) {
            acquire_failed(key, "take: " + error, at);
            return;
          }
          acquire_verify(key, round + 1, at);
          return;
        }
        acquire_preempt_others(key, reads, round, at);
      });
}

void Resource::acquire_preempt_others(Key key, const Reads& reads, int round, Time now) {
  if (cancelled_) {
    acquire_failed(key, "cancelled before preempting the other keys", now);
    return;
  }
  std::vector<pr::Request> requests;
  std::vector<std::size_t> lu_of;
  for (std::size_t i = 0; i < options_.lus.size(); ++i) {
    const auto holder = reads.holder(i);
    for (const std::uint64_t other : reads.others(i, key.value())) {
      if (holder == other) {
        continue;  // preempted in the take step with its registrations
      }
      lu_of.push_back(i);
      requests.push_back(pr::prout_first_path(options_.lus[i], take_command(key, other),
                                              "PREEMPT (other registrant)"));
    }
  }
  if (requests.empty()) {
    acquire_verify(key, round, now);
    return;
  }
  set_state(State::kAcquiring, "removing other registrations");
  // A conflict here means the key went away meanwhile; the verify read decides (S4).
  run(std::move(requests), now,
      [this, key, round, lu_of](const std::vector<pr::Response>& responses, Time at) {
        note_uncertain(responses, lu_of);
        acquire_verify(key, round, at);
      });
}

void Resource::acquire_verify(Key key, int round, Time now) {
  if constexpr (mutant::kSkipVerify) {
    acquire_succeeded(key, now, now);
    return;
  }
  set_state(State::kAcquiring, "verifying " + key.to_string());
  read_all(Keys::kKeysAndPorts, now, [this, key, round](Reads reads, Time at) {
    if (!reads.ok()) {
      acquire_failed(key, "verify: " + reads.errors(options_.lus), at);
      return;
    }
    // A node with the same ids acting at the same time: its reservation would pass for ours.
    if (const std::string elsewhere = key_used_elsewhere(reads); !elsewhere.empty()) {
      acquire_failed(key, "verify: " + elsewhere, at);
      return;
    }
    bool others = false;
    bool retake = false;
    for (std::size_t i = 0; i < reads.lus.size(); ++i) {
      const auto holder = reads.holder(i);
      if (!reads.registered(i, key.value())) {
        acquire_failed(key, "verify: our key was removed from " + options_.lus[i].name, at);
        return;
      }
      if (holder != key.value()) {
        if (holder && outranks(*holder, key)) {
          // A racing acquire with a higher (epoch, node) takes precedence (docs/protocol.md).
          acquire_failed(
              key, "verify: " + options_.lus[i].name + " is held by " + Key::format(*holder), at);
          return;
        }
        retake = true;  // a racer with a lower key got there between our take and this read
      }
      others = others || !reads.others(i, key.value()).empty();
    }
    if (retake || others) {
      if (round + 1 >= options_.verify_rounds_max) {
        acquire_failed(key, "verify: other keys keep appearing", at);
        return;
      }
      if (retake) {
        acquire_take(key, std::move(reads), true, round + 1, at);
      } else {
        acquire_preempt_others(key, reads, round + 1, at);
      }
      return;
    }
    if (at - reads.started >= options_.lease) {
      // The verify read is a lease old by now (a slow or stalled target): the gate would open
      // with its lease already over. Read again while rounds remain.
      if (round + 1 >= options_.verify_rounds_max) {
        acquire_failed(key, "verify: the reads take longer than the lease", at);
        return;
      }
      acquire_verify(key, round + 1, at);
      return;
    }
    acquire_succeeded(key, reads.started, at);
  });
}

void Resource::acquire_succeeded(Key key, Time verified_since, Time now) {
  key_ = key;
  ++counters_.acquisitions;
  set_state(State::kHeld, "acquired with " + key.to_string());
  last_success_ = verified_since;
  set_gate(true, verified_since);
  emit(EventKind::kAcquired, detail_);
  next_check_ = now + options_.check_interval;
  round_ = 0;
  end(key, now);
}

void Resource::acquire_failed(Key key, std::string why, Time now) {
  ++counters_.acquire_failures;
  if constexpr (mutant::kNoReread) {
    mutant_unregister_unread(key, std::move(why), now);
    return;
  }
  // S4: whatever failed may still have executed; read the state before deciding anything.
  read_all(true, now, [this, key, why = std::move(why)](Reads reads, Time at) {
    // S3: the winner's key may be on the LUs only until a target without APTPL loses power.
    note_epochs_of_failed_read(reads);
    std::vector<pr::Request> cleanup;
    std::string left;
    std::optional<std::uint64_t> winner;
    for (std::size_t i = 0; i < reads.lus.size(); ++i) {
      const auto holder = reads.holder(i);
      if (!holder || *holder == key.value()) {
        continue;  // ours, or nobody's: the key keeps it, gate closed, as after a release
      }
      if (ours(*holder)) {
        // An older key of ours holds (a release keeps the reservation). A REGISTER AND IGNORE
        // EXISTING KEY of the new key on the nexus that holds it moves the reservation to the new
        // key, and one that timed out may still execute, after this read: unregistering the new
        // key now could drop the reservation (S1). It stays registered, as where a PREEMPT of
        // ours timed out, and nobody won this LU.
        left += (left.empty() ? "" : ", ") + options_.lus[i].name;
        continue;
      }
      winner = holder;
      // Lost on this LU, and our key is registered there (or its keys could not be read, and a
      // REGISTER of ours may have executed, S4): our registration would let this node write under
      // the winner's reservation, so take it back. Not where a PREEMPT or RESERVE of ours timed
      // out: should it execute before the unregister, we would be the holder, and unregistering
      // the holder drops the reservation, which lets every nexus write (S1). There the key stays
      // registered; the monitor takes it back once that command can no longer execute.
      if (reads.lus[i].keys && !reads.registered(i, key.value())) {
        continue;
      }
      if (uncertain_[i]) {
        left += (left.empty() ? "" : ", ") + options_.lus[i].name;
        continue;
      }
      for (auto& request : pr::prout_every_path(
               options_.lus[i], codec::prout_register(key.value(), 0, register_options()),
               "REGISTER (unregister)")) {
        cleanup.push_back(std::move(request));
      }
    }
    std::string detail = "acquire with " + key.to_string() + " failed: " + why;
    if (!reads.ok()) {
      detail += "; and reading back: " + reads.errors(options_.lus);
    }
    const ErrorCode code = cancelled_ ? ErrorCode::kCancelled
                           : winner   ? ErrorCode::kLost
                                      : ErrorCode::kIndeterminate;
    if (winner) {
      detail += "; " + Key::format(*winner) + " holds it";
    }
    if (!left.empty()) {
      detail += "; " + key.to_string() + " is not taken back from " + left +
                " until a command of ours that timed out can no longer execute";
      leftover_ = Leftover{.key = key, .after = late_execution_end(at)};
    }
    if (auto given_up = give_up(key); !given_up) {
      detail += "; and storing the epoch failed (a restart could adopt " + key.to_string() +
                "): " + given_up.error().message();
    }
    const auto finish = [this, code, detail](Time when) {
      set_state(State::kReleased, detail);
      end(fail(code, "resource " + options_.name + ": " + detail), when);
    };
    if (cleanup.empty()) {
      finish(at);
      return;
    }
    run(std::move(cleanup), at,
        [finish](const std::vector<pr::Response>&, Time done_at) { finish(done_at); });
  });
}

// How long after an acquire failed a PR OUT of it that timed out is assumed unable to execute any
// more: the initiator aborts a timed-out command (SCSI error handling), so twice its timeout. Only
// the fallback where the transport cannot tell when the kernel gave the command back
// (end_waits_for_returned_commands).
Time acquire_window(const ResourceOptions& options, Time command_timeout) {
  BLKFENCE_ASSERT(options.verify_rounds_max >= 1);
  return (3 * options.verify_rounds_max + 3) * command_timeout;
}

Time stray_bound(const ResourceOptions& options, Time command_timeout) {
  return acquire_window(options, command_timeout) +
         (options.keys_every + 1) * Time(options.check_interval) + 3 * command_timeout;
}

// When a PR OUT of ours that timed out by `at` can no longer execute. Where the transport can tell
// (Transport::unreturned()), once the kernel gave every such command back, however long that takes:
// end_waits_for_returned_commands() ends the wait then, and meanwhile the holder's monitor removes
// the key left beside its reservation as a stray (docs/protocol.md). Elsewhere at the horizon.
Time Resource::late_execution_end(Time at) const {
  if (engine_.transport().unreturned().has_value()) {
    return Time::max();
  }
  return at + late_execution_horizon();
}

Time Resource::late_execution_horizon() const {
  return 2 * std::chrono::duration_cast<Time>(engine_.policy().command_timeout);
}

// --- release -------------------------------------------------------------------------------------

void Resource::release(Time now, Done done) {
  if (op_ == Op::kPaths) {
    set_gate(false, now);  // the writer stops now, whatever waits
  }
  if (queue_behind_paths([this, done](Time at) mutable { release(at, std::move(done)); })) {
    return;
  }
  if (op_ != Op::kNone) {
    done(fail(ErrorCode::kBusy, "resource " + options_.name + ": another operation is running"),
         now);
    return;
  }
  begin(Op::kRelease, std::move(done));
  const bool was_primary = std::exchange(primary_, false);
  // The writer stops before anything else happens (docs/protocol.md, Release).
  set_gate(false, now);
  if (!key_) {
    set_state(State::kReleased, "released (this node held no key)");
    emit(EventKind::kReleased, detail_);
    end(fail(ErrorCode::kLost, "resource " + options_.name + ": this node holds no key"), now);
    return;
  }
  const Key key = *key_;
  // The primary of primary mode releases as an exclusive holder does: RELEASE would leave the LUs
  // unreserved and take its epoch off them (S1, S3). A member reads first (release_shared).
  if (options_.mode == Mode::kShared && !was_primary) {
    release_shared(key, now);
    return;
  }
  if constexpr (mutant::kReleaseDrops) {
    mutant_release(key, now);
    return;
  }
  release_keeping(key, state_ == State::kHeld || state_ == State::kLostContact, now);
}

void Resource::release_keeping(Key key, bool held, Time now) {
  // Exclusive: the token is given up here, not on the target. Dropping the reservation would let
  // every nexus write, a node preempted a moment ago that has not noticed yet included (S1), and
  // the LUs would forget the epoch (S3). So the key keeps the reservation, with the gate closed,
  // until the next acquirer preempts it as it preempts any holder; and the store moves one past it
  // so that a restart does not adopt a key that was given up (docs/protocol.md, release).
  if (auto given_up = give_up(key); !given_up) {
    set_state(State::kReleased, "released " + key.to_string() +
                                    ", but the epoch store failed: a restart would adopt it again");
    emit(EventKind::kReleased, detail_);
    end(fail(given_up.error().code(), "release of " + options_.name + ": " + detail_ + " (" +
                                          given_up.error().message() + ")"),
        now);
    return;
  }
  set_state(State::kReleased,
            "released " + key.to_string() +
                (held ? ": gate closed; the key keeps the reservation until another node acquires"
                      : " (it no longer held the LUs)"));
  emit(EventKind::kReleased, detail_);
  key_.reset();
  end(key, now);
}

// An acquire that ends before it sent anything of its new key (its wait for the node's writes
// ended): nothing to read back or take back; the older key keeps the reservation, gate closed.
void Resource::acquire_not_registered(Key key, const std::string& why, Time now) {
  ++counters_.acquire_failures;
  std::string detail = "acquire with " + key.to_string() + " failed: " + why;
  if (auto given_up = give_up(key); !given_up) {
    detail += "; and storing the epoch failed: " + given_up.error().message();
  }
  set_state(State::kReleased, detail);
  end(fail(cancelled_ ? ErrorCode::kCancelled : ErrorCode::kIndeterminate,
           "resource " + options_.name + ": " + detail),
      now);
}

Result<void> Resource::give_up(Key key) {
  // Only the epoch last used decides adoption: a higher epoch seen (a member's key in primary mode)
  // does not give this key up.
  if (Key::epoch_reserved(key.epoch()) || (stored_ && stored_->used > key.epoch())) {
    return {};  // nothing above it can be adopted; the exhausted space refuses acquires anyway
  }
  const std::uint32_t seen = stored_ ? stored_->seen : 0;
  return store_epochs(StoredEpochs{.used = key.epoch() + 1,
                                   .seen = std::max(seen, key.epoch() + 1),
                                   .registering = stored_ && stored_->registering});
}

void Resource::release_shared(Key key, Time now) {
  set_state(State::kReleasing, "releasing " + key.to_string());
  // S4: a PR OUT of ours that failed or timed out before (an unfence, a fence, the monitor's
  // RESERVE) is read back before anything is sent.
  after_monitor_prouts(now, [this, key](Time from) {
    read_all(true, from, [this, key](const Reads& before, Time read) {
      if (!before.ok()) {
        set_state(State::kReleased, "release failed: cannot read " + before.errors(options_.lus) +
                                        "; " + key.to_string() + " stays registered");
        end(fail(ErrorCode::kIndeterminate, "release of " + options_.name + ": " + detail_), read);
        return;
      }
      // A member of primary mode whose key holds a LU (a promote that failed at its verify, or
      // was cancelled after its take) keeps it as the primary does: unregistering the holder
      // would take the highest epoch off the LUs, and the next promote could draw it again (S3).
      if (options_.primary) {
        for (std::size_t i = 0; i < before.lus.size(); ++i) {
          if (before.holder(i) == key.value()) {
            release_keeping(key, true, read);
            return;
          }
        }
      }
      // Under an All Registrants type every registrant holds: a RELEASE from any of them, or the
      // unregister of the last one, would leave the LUs unreserved, open to every nexus, a fenced
      // member's included (S1). So the member's nexuses move to the departed key instead, which
      // keeps the reservation and opens no gate (docs/protocol.md, "Release"). Under a
      // Registrants Only type (primary mode's members) only a holder's RELEASE does anything.
      if (codec::is_all_registrants(options_.type) && !mutant::kReleaseDrops) {
        release_registering(key, key_for(Key::kEpochDeparted), read);
        return;
      }
      std::vector<pr::Request> releases;
      for (const auto& lu : options_.lus) {
        releases.push_back(
            pr::prout_first_path(lu, codec::prout_release(key.value(), options_.type), "RELEASE"));
      }
      run(std::move(releases), read, [this, key](const std::vector<pr::Response>&, Time at) {
        release_registering(key, std::nullopt, at);
      });
    });
  });
}

// Moves every path from the member's key to `then` (nullopt: unregisters), and reads back. A
// plain REGISTER: a nexus no longer registered with the key (fenced) stays unregistered (S5).
void Resource::release_registering(Key key, std::optional<Key> then, Time now) {
  std::vector<pr::Request> registers;
  for (const auto& lu : options_.lus) {
    for (auto& request : pr::prout_every_path(
             lu, codec::prout_register(key.value(), then ? then->value() : 0, register_options()),
             then ? "REGISTER (departed key)" : "REGISTER (unregister)")) {
      registers.push_back(std::move(request));
    }
  }
  run(std::move(registers), now,
      [this, key, then](const std::vector<pr::Response>& responses, Time done_at) {
        // One that timed out may still execute: the next unfence waits until it no longer can, or
        // it would move a nexus of the new registration to the departed key.
        const bool late = note_late_registers(responses, done_at);
        departure_unsettled_ = departure_unsettled_ || (then && late);
        // RESERVATION CONFLICT means the key was already gone; read back to report the truth.
        read_all(true, done_at, [this, key, then](Reads reads, Time read_at) {
          std::string left;
          for (std::size_t i = 0; i < reads.lus.size(); ++i) {
            if (!reads.lus[i].error.empty() || reads.registered(i, key.value())) {
              left += (left.empty() ? "" : ", ") + options_.lus[i].name;
            }
          }
          if (left.empty()) {
            set_state(State::kReleased, "released " + key.to_string() +
                                            (then ? "; the departed key " + then->to_string() +
                                                        " keeps the LUs reserved"
                                                  : ""));
            emit(EventKind::kReleased, detail_);
            key_.reset();
            end(key, read_at);
            return;
          }
          set_state(State::kReleased,
                    "released, but " + key.to_string() + " may still be registered on " + left);
          emit(EventKind::kReleased, detail_);
          end(fail(ErrorCode::kIndeterminate, "release of " + options_.name + ": " + detail_),
              read_at);
        });
      });
}

// --- shared mode ---------------------------------------------------------------------------------

}  // namespace blkfence::fence
