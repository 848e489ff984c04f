// Shared mode of a resource: unfence, fence another node, release (docs/protocol.md, "Shared
// mode"; fence layer). See resource.h.
#include <algorithm>
#include <set>

#include "blkfence/assert.h"
#include "blkfence/codec/prin.h"
#include "blkfence/codec/prout.h"
#include "blkfence/fence/resource.h"
#include "blkfence/pr/client.h"

#include "resource_reads.h"

namespace blkfence::fence {

void Resource::unfence(Time now, Done done) {
  if (refuse(Mode::kShared, now, done)) {
    return;
  }
  // A member already, or the primary (a member that holds): re-registering the member key on the
  // holding nexus would move the reservation to it.
  if ((state_ == State::kUnfenced || (primary_ && state_ == State::kHeld)) && gate_open_) {
    done(*key_, now);
    return;
  }
  // Primary mode draws the member's key: its epochs, and whether the run before left a REGISTER
  // under way (docs/protocol.md, "Late registrations"), are read first, as a promote does.
  if (options_.primary) {
    if (auto loaded = load_epochs(now); !loaded) {
      done(tl::unexpected(loaded.error()), now);
      return;
    }
  }
  begin(Op::kUnfence, std::move(done));
  primary_ = false;
  new_paths_.clear();  // every path is registered
  paths_after_a_round_.clear();
  fenced_by_.reset();
  set_state(State::kUnfencing, "reading before registering");
  // S4: a PR OUT of ours that failed or timed out before (an unfence, a fence, a release) is read
  // back before we register again, whatever the register then does.
  after_monitor_prouts(now, [this](Time monitor_done) {
    after_registers_settle(monitor_done, [this](Time settled) {
      with_capabilities(settled, [this](Time from) { unfence_register(from); });
    });
  });
}

// Reads, draws the member's key (primary mode), registers it on every path.
void Resource::unfence_register(Time now) {
  read_all(Keys::kKeysAndPorts, now, [this](const Reads& reads, Time read_at) {
    if (!reads.ok()) {
      set_state(State::kReleased, "unfence failed: cannot read " + reads.errors(options_.lus));
      end(fail(ErrorCode::kIndeterminate, "unfence of " + options_.name + ": " + detail_), read_at);
      return;
    }
    if (const std::string elsewhere = key_used_elsewhere(reads); !elsewhere.empty()) {
      set_state(State::kReleased, "unfence refused: " + elsewhere);
      end(fail(ErrorCode::kKeyInUse, "unfence of " + options_.name + ": " + elsewhere), read_at);
      return;
    }
    // docs/protocol.md, "Shared mode": members register with epoch 0. In primary mode a
    // member draws a new epoch as promote does: its REGISTER may re-key a nexus that holds
    // (a released or unreachable primary rejoining), which must not take an epoch off the
    // LUs, and no key is ever registered twice (S3).
    Key key = key_for(0);
    if (options_.primary) {
      const Result<std::uint32_t> epoch = draw_epoch(reads, "unfence");
      if (!epoch) {
        set_state(State::kReleased, "unfence failed: " + epoch.error().message());
        end(tl::unexpected(epoch.error()), read_at);
        return;
      }
      key = key_for(*epoch);
      if (auto stored = store_drawn(key.epoch()); !stored) {
        set_state(State::kReleased, "unfence failed: cannot store the epoch");
        end(tl::unexpected(stored.error()), read_at);
        return;
      }
    }
    // docs/protocol.md, "Writes queued in the initiator": a fenced member's earlier writes, and a
    // primary rejoining as a member re-keying the nexus that holds, must have finished first. The
    // key becomes the node's only once it goes out: a wait that fails leaves the older one.
    drain_before_register(reads, key, read_at, [this, key](const std::string& draining, Time from) {
      if (!draining.empty()) {
        set_state(State::kReleased, "unfence failed: " + draining);
        end(fail(ErrorCode::kIndeterminate, "unfence of " + options_.name + ": " + draining), from);
        return;
      }
      key_ = key;
      set_state(State::kUnfencing, "registering " + key.to_string());
      std::vector<pr::Request> requests = register_everywhere(key);
      run(std::move(requests), from,
          [this, key](const std::vector<pr::Response>& responses, Time at) {
            note_late_registers(responses, at);
            if (const std::string error = first_error(responses); !error.empty()) {
              set_state(State::kReleased, "unfence failed: " + error);
              end(fail(ErrorCode::kIndeterminate, "unfence of " + options_.name + ": " + error),
                  at);
              return;
            }
            unfence_reserve(key, at);
          });
    });
  });
}

void Resource::unfence_reserve(Key key, Time now) {
  if (options_.primary) {
    unfence_verify(key, now);  // members never reserve: the primary holds (promote)
    return;
  }
  read_all(false, now, [this, key](Reads reads, Time at) {
    std::vector<pr::Request> reserves;
    for (std::size_t i = 0; i < reads.lus.size(); ++i) {
      if (reads.lus[i].error.empty() && !reads.holder(i) &&
          !reads.lus[i].reservation->reservation) {
        reserves.push_back(pr::prout_first_path(
            options_.lus[i], codec::prout_reserve(key.value(), options_.type), "RESERVE"));
      }
    }
    if (reserves.empty()) {
      unfence_verify(key, at);
      return;
    }
    // A conflict means another member reserved first, which is as good.
    run(std::move(reserves), at, [this, key](const std::vector<pr::Response>&, Time done_at) {
      unfence_verify(key, done_at);
    });
  });
}

void Resource::unfence_verify(Key key, Time now) {
  read_all(Keys::kKeysAndPorts, now, [this, key](Reads reads, Time at) {
    // A node with the same ids acting at the same time: its keys would pass for ours.
    if (const std::string elsewhere = reads.ok() ? key_used_elsewhere(reads) : std::string();
        !elsewhere.empty()) {
      set_state(State::kReleased, "unfence refused: " + elsewhere);
      end(fail(ErrorCode::kKeyInUse, "unfence of " + options_.name + ": " + elsewhere), at);
      return;
    }
    for (std::size_t i = 0; i < reads.lus.size(); ++i) {
      std::string problem;
      if (!reads.lus[i].error.empty()) {
        problem = reads.lus[i].error;
      } else if (!reads.registered(i, key.value())) {
        problem = "our key is not registered";
      } else if (!options_.primary && !reads.lus[i].reservation->reservation) {
        problem = "no reservation protects it";
      } else if (at - reads.started >= options_.lease) {
        problem = "the reads take longer than the lease";  // the gate would open expired (S2)
      }
      if (!problem.empty()) {
        set_state(State::kReleased, "unfence failed: " + options_.lus[i].name + ": " + problem);
        end(fail(ErrorCode::kIndeterminate, "unfence of " + options_.name + ": " + detail_), at);
        return;
      }
    }
    set_state(State::kUnfenced, "unfenced with " + key.to_string());
    last_success_ = reads.started;
    set_gate(true, reads.started);
    emit(EventKind::kUnfenced, detail_);
    end(key, at);
  });
}

void Resource::fence_node(std::uint16_t node_id, Time now, Done done) {
  if (refuse(Mode::kShared, now, done)) {
    return;
  }
  // Primary mode: the promote fences the old primary, holder first; a member's PREEMPT of another
  // key would take the reservation where the victim holds (and look like a primary to the next
  // promote), and leave a member's nexus unregistered on a LU nobody reserved, open to its writes.
  if (options_.primary) {
    done(fail(ErrorCode::kInvalidArgument,
              "resource " + options_.name +
                  " is in primary mode: a promote fences the old primary; fence is shared mode's"),
         now);
    return;
  }
  if (node_id == options_.node_id) {
    done(fail(ErrorCode::kInvalidArgument, "a node cannot fence itself; use release"), now);
    return;
  }
  if (state_ != State::kUnfenced || !key_) {
    done(fail(ErrorCode::kInvalidArgument,
              "resource " + options_.name + ": this node must be unfenced to fence another"),
         now);
    return;
  }
  begin(Op::kFence, std::move(done));
  after_monitor_prouts(now, [this, node_id](Time from) {
    read_all(true, from, [this, node_id](const Reads& reads, Time at) {
      if (!reads.ok()) {
        end(fail(ErrorCode::kIndeterminate, "fence of node " + std::to_string(node_id) +
                                                ": cannot read " + reads.errors(options_.lus)),
            at);
        return;
      }
      fence_preempt(node_id, reads, at);
    });
  });
}

void Resource::fence_preempt(std::uint16_t victim, const Reads& reads, Time now) {
  const Key key = *key_;
  const auto victims_of = [&](const Reads& r, std::size_t i) {
    std::vector<std::uint64_t> found;
    for (const std::uint64_t k : r.others(i, key.value())) {
      if (Key::cluster_of(k) == options_.cluster_id && Key::node_of(k) == victim) {
        found.push_back(k);
      }
    }
    return found;
  };
  std::vector<pr::Request> requests;
  std::optional<std::uint64_t> victim_key;
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    for (const std::uint64_t k : victims_of(reads, i)) {
      victim_key = k;
      requests.push_back(
          pr::prout_first_path(options_.lus[i], take_command(key, k),
                               options_.preempt_abort ? "PREEMPT AND ABORT" : "PREEMPT"));
    }
  }
  if (requests.empty()) {
    end(key, now);  // nothing of that node is registered: already fenced
    return;
  }
  run(std::move(requests), now,
      [this, key, victim, victim_key, victims_of](const std::vector<pr::Response>&, Time at) {
        read_all(true, at, [this, key, victim, victim_key, victims_of](Reads check, Time done_at) {
          for (std::size_t i = 0; i < check.lus.size(); ++i) {
            if (!check.lus[i].error.empty() || !victims_of(check, i).empty()) {
              end(fail(ErrorCode::kIndeterminate,
                       "fence of node " + std::to_string(victim) + " on " + options_.lus[i].name +
                           ": its key is still registered or unreadable" +
                           (check.lus[i].error.empty() ? "" : " (" + check.lus[i].error + ")")),
                  done_at);
              return;
            }
          }
          emit(EventKind::kFencedNode, "fenced node " + std::to_string(victim), victim_key);
          end(key, done_at);
        });
      });
}

}  // namespace blkfence::fence
