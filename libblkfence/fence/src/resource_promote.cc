// Primary mode's promote: this node becomes the primary, the holder of every LU, by preempting the
// old primary's key; the other members stay registered (docs/protocol.md, "Primary mode"; fence
// layer). See resource.h.
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

void Resource::promote(Time now, Done done) {
  if (options_.mode == Mode::kShared && !options_.primary) {
    done(fail(ErrorCode::kInvalidArgument,
              "resource " + options_.name + " is in shared mode: promote needs mode \"primary\""),
         now);
    return;
  }
  if (refuse(Mode::kShared, now, done)) {
    return;
  }
  if (primary_ && state_ == State::kHeld && gate_open_) {
    done(*key_, now);  // the monitor keeps verifying it
    return;
  }
  if (auto loaded = load_epochs(now); !loaded) {
    done(tl::unexpected(loaded.error()), now);
    return;
  }
  begin(Op::kPromote, std::move(done));
  promoting_member_ = gate_open_;
  new_paths_.clear();  // every path is registered with the new key
  paths_after_a_round_.clear();
  detail_ = "promoting: reading keys and reservations";
  // S4: a PR OUT of ours that failed or timed out before is read back first.
  after_monitor_prouts(now, [this](Time monitor_done) {
    after_registers_settle(monitor_done, [this](Time settled) {
      with_capabilities(settled, [this](Time from) {
        read_all(Keys::kKeysAndPorts, from, [this](const Reads& reads, Time at) {
          if (!reads.ok()) {
            end(fail(ErrorCode::kIndeterminate,
                     "promote of " + options_.name +
                         ": cannot read the LUs: " + reads.errors(options_.lus)),
                at);
            return;
          }
          if (const std::string elsewhere = key_used_elsewhere(reads); !elsewhere.empty()) {
            end(fail(ErrorCode::kKeyInUse, "promote of " + options_.name + ": " + elsewhere), at);
            return;
          }
          promote_draw(reads, at);
        });
      });
    });
  });
}

// S3 as in acquire: the new epoch is above every key of this cluster seen and the stored
// high-water mark, and durable before the key exists anywhere.
void Resource::promote_draw(const Reads& reads, Time now) {
  Result<std::uint32_t> epoch = draw_epoch(reads, "promote");
  if (!epoch) {
    end(tl::unexpected(epoch.error()), now);
    return;
  }
  if (cancelled_) {
    end(fail(ErrorCode::kCancelled, "promote of " + options_.name +
                                        ": cancelled before it sent "
                                        "anything"),
        now);
    return;
  }
  if constexpr (mutant::kPromoteNoEpochBump) {
    *epoch -= *epoch > 1 ? 1U : 0U;
  }
  const Key key = key_for(*epoch);
  if (auto stored = store_drawn(key.epoch()); !stored) {
    end(tl::unexpected(stored.error()), now);
    return;
  }
  // A primary promoted again over its own older key (after lost contact) re-keys the nexus that
  // holds: its writes under the older key must have finished first.
  drain_before_register(reads, key, now, [this, key](const std::string& draining, Time from) {
    if (!draining.empty()) {
      // Nothing of the new key was sent: the older key holds as before.
      detail_ = "promote failed: " + draining;
      end(fail(ErrorCode::kIndeterminate, "promote of " + options_.name + ": " + draining), from);
      return;
    }
    if (cancelled_) {
      detail_ = "promote cancelled before it registered";
      end(fail(ErrorCode::kCancelled,
               "promote of " + options_.name + ": cancelled before it registered"),
          from);
      return;
    }
    detail_ = "promoting: registering " + key.to_string();
    // REGISTER AND IGNORE EXISTING KEY moves each of our nexuses from its member key to the new
    // one in one command: the node stays registered, and so able to write, throughout.
    std::vector<pr::Request> requests = register_everywhere(key);
    run(std::move(requests), from,
        [this, key](const std::vector<pr::Response>& responses, Time at) {
          note_late_registers(responses, at);
          if (const std::string error = first_error(responses); !error.empty()) {
            promote_failed(key, "register: " + error, at);
            return;
          }
          read_all(true, at, [this, key](const Reads& registered, Time read_at) {
            if (!registered.ok()) {
              promote_failed(key,
                             "cannot read after registering: " + registered.errors(options_.lus),
                             read_at);
              return;
            }
            promote_take(key, registered, {}, 0, read_at);
          });
        });
  });
}

// Where another key holds: PREEMPT it (that removes every registration of the old primary's key
// on the LU and moves the reservation to ours); where nobody holds: RESERVE. The old primary's
// other keys are preempted first, each once its LU is reserved, in rounds of their own. Members'
// keys are left alone.
//
// Every PREEMPT names its victim by key, and no key is ever used twice (S3): a PREEMPT that
// executes late, after this promote failed or was cancelled, can only remove the primary it read,
// never one that came after it.
void Resource::promote_take(Key key, const Reads& reads, std::set<std::uint64_t> victims, int round,
                            Time now) {
  if constexpr (mutant::kPromoteIgnoresCancel) {
    cancelled_ = false;
  }
  if (cancelled_) {
    promote_failed(key, "cancelled before taking the LUs", now);
    return;
  }
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    const auto holder = reads.holder(i);
    if (holder && *holder != key.value()) {
      // A primary of this cluster promoted after our read, or at the same time with the same
      // epoch: taking over from it would give two primaries' tokens one epoch, or a newer one a
      // lower (S3). It wins.
      if (Key::cluster_of(*holder) == options_.cluster_id &&
          Key::epoch_of(*holder) >= key.epoch()) {
        promote_failed(key,
                       options_.lus[i].name + " is held by " + Key::format(*holder) +
                           ", a primary as new as this promote or newer",
                       now, ErrorCode::kLost);
        return;
      }
      victims.insert(*holder);
    }
  }
  const char* preempt = options_.preempt_abort ? "PREEMPT AND ABORT" : "PREEMPT";
  // Where nobody holds, RESERVE first. The old primary's other keys go next, each only where a
  // reservation is in place: removing a registration from a LU nobody reserved leaves its nexus
  // free to write there, since an unreserved LU refuses no write (SPC-4 5.13.1). The holder's go
  // only once no other key of the old primary is left: preempting the holder is the moment the
  // old primary is fenced, and a nexus of its node that still carried an older key after it could
  // go on writing under our reservation (S1). The verify after each round finds what is left and
  // takes it in the next one.
  std::vector<pr::Request> requests;
  bool others_left = false;
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    const auto holder = reads.holder(i);
    if (!holder) {
      requests.push_back(pr::prout_first_path(
          options_.lus[i], codec::prout_reserve(key.value(), options_.type), "RESERVE"));
    }
    for (const std::uint64_t other : reads.others(i, key.value())) {
      if (of_old_primary(victims, other, key) && other != holder) {
        others_left = true;
        if (holder) {
          requests.push_back(
              pr::prout_first_path(options_.lus[i], take_command(key, other), preempt));
        }
      }
    }
  }
  for (std::size_t i = 0; i < reads.lus.size() && !others_left; ++i) {
    const auto holder = reads.holder(i);
    if (holder && *holder != key.value()) {
      requests.push_back(
          pr::prout_first_path(options_.lus[i], take_command(key, *holder), preempt));
    }
  }
  if (requests.empty()) {
    promote_verify(key, std::move(victims), round, now);
    return;
  }
  // A failed or timed-out take is read back by the verify before anything is decided (S4).
  run(std::move(requests), now,
      [this, key, victims = std::move(victims), round](const std::vector<pr::Response>&,
                                                       Time at) mutable {
        promote_verify(key, std::move(victims), round, at);
      });
}

// The gate stays as it was throughout (a member's nexuses never stop being registered); the token
// becomes the new key only when every LU shows it as the holder, registered, and no key of the
// old primary left.
void Resource::promote_verify(Key key, std::set<std::uint64_t> victims, int round, Time now) {
  read_all(Keys::kKeysAndPorts, now,
           [this, key, victims = std::move(victims), round](const Reads& reads, Time at) mutable {
             // A node with the same ids acting at the same time: its keys would pass for ours.
             std::string problem = reads.ok() ? key_used_elsewhere(reads) : std::string();
             for (std::size_t i = 0; i < reads.lus.size() && problem.empty(); ++i) {
               const auto holder = reads.holder(i);
               if (!reads.lus[i].error.empty()) {
                 problem = reads.lus[i].error;
               } else if (holder != key.value()) {
                 problem = holder ? "held by " + Key::format(*holder) : "no reservation";
               } else if (!reads.registered(i, key.value())) {
                 problem = "our key is not registered";
               } else {
                 for (const std::uint64_t other : reads.others(i, key.value())) {
                   if (of_old_primary(victims, other, key)) {
                     problem =
                         "the old primary's key " + Key::format(other) + " is still registered";
                   }
                 }
               }
               if (!problem.empty()) {
                 problem.insert(0, options_.lus[i].name + ": ");
               }
             }
             if constexpr (mutant::kPromoteSkipsVerify) {
               problem.clear();
             }
             if (problem.empty() && at - reads.started >= options_.lease) {
               // As in acquire: a verify read a lease old by now (a slow or stalled target) would
               // open the gate with its lease already over (S2).
               problem = "the reads take longer than the lease";
             }
             if (problem.empty()) {
               key_ = key;
               primary_ = true;
               fenced_by_.reset();
               set_state(State::kHeld, "primary with " + key.to_string() + ": holds every LU");
               last_success_ = reads.started;
               set_gate(true, reads.started);
               emit(EventKind::kAcquired, detail_,
                    victims.empty() ? std::nullopt : std::optional(*victims.begin()));
               end(key, at);
               return;
             }
             if (!reads.ok() || round + 1 >= options_.verify_rounds_max) {
               promote_failed(key, "verify: " + problem, at);
               return;
             }
             promote_take(key, reads, std::move(victims), round + 1, at);
           });
}

// A key of the old primary: one that held when a take read the LUs, or any older key of its node.
// Every one of them goes, not only the one that held: a nexus whose path went away, or whose re-key
// timed out, may still carry an older key, and under a Registrants Only reservation every
// registered nexus may write (S1). A key of that node with our epoch or above is a promote of its
// own racing this one, which may hold by the time a PREEMPT reaches the LU: preempting it would let
// our lower epoch take over from a higher one (S3), so it is left to that promote's outcome.
bool Resource::of_old_primary(const std::set<std::uint64_t>& victims, std::uint64_t key,
                              Key ours) const {
  return std::any_of(victims.begin(), victims.end(), [&](std::uint64_t victim) {
    return victim == key ||
           (Key::cluster_of(victim) == options_.cluster_id &&
            Key::cluster_of(key) == options_.cluster_id &&
            Key::node_of(victim) == Key::node_of(key) && Key::epoch_of(key) < ours.epoch());
  });
}

// What a failed promote leaves is read, not assumed (S4). A node whose new key is registered on
// every LU stays a member (its gate as it was: a replica keeps writing); one whose key is gone
// from a LU was fenced meanwhile.
void Resource::promote_failed(Key key, std::string why, Time now, ErrorCode failure) {
  ++counters_.acquire_failures;
  read_all(true, now, [this, key, why = std::move(why), failure](const Reads& reads, Time at) {
    // S3: the winner's key may be on the LUs only until a target without APTPL loses power.
    note_epochs_of_failed_read(reads);
    const ErrorCode code = cancelled_ ? ErrorCode::kCancelled : failure;
    primary_ = false;
    for (std::size_t i = 0; i < reads.lus.size(); ++i) {
      if (reads.lus[i].keys && !reads.registered(i, key.value())) {
        // Our key was never registered there, or a newer primary preempted it: either way this
        // node may not write there; the fence is declared (S5: nothing registers it again).
        key_ = key;
        fenced(reads.holder(i), options_.lus[i].name,
               "promote failed and our key is not registered", at);
        end(fail(code, "promote of " + options_.name + ": " + why + "; " + detail_), at);
        return;
      }
    }
    key_ = key;
    std::string left;
    if (!reads.ok()) {
      left =
          "what it left is unknown (" + reads.errors(options_.lus) + "); the monitor reads again";
      set_state(gate_open_ ? State::kUnfenced : State::kReleased, "promote failed: " + left);
    } else {
      left = (promoting_member_ ? "still a member with " : "registered with ") + key.to_string();
      for (std::size_t i = 0; i < reads.lus.size(); ++i) {
        if (reads.holder(i) == key.value()) {
          left += "; holds " + options_.lus[i].name;
        }
      }
      if (promoting_member_ && at - reads.started < options_.lease) {
        // A read issued after every PR OUT of ours shows our key on every LU: the member gate
        // (re)opens on it, even if the lease ran out while the promote ran (S2).
        set_state(State::kUnfenced, "promote failed: " + left);
        last_success_ = reads.started;
        set_gate(true, reads.started);
      } else if (promoting_member_) {
        // The same read, but a lease old: the monitor's next round decides, as after lost contact.
        set_gate(false, at);
        set_state(State::kLostContact,
                  "promote failed: " + left + "; the read took longer than the lease");
      } else {
        left += "; gate closed: unfence to rejoin as a member";
        set_state(State::kReleased, "promote failed: " + left);
      }
    }
    end(fail(code, "promote of " + options_.name + ": " + why + "; " + left), at);
  });
}

}  // namespace blkfence::fence
