// Path hot-plug of a resource: new paths registered with the current key (docs/protocol.md,
// "Paths"; fence layer). See resource.h.
#include <algorithm>
#include <cerrno>
#include <set>

#include "blkfence/assert.h"
#include "blkfence/codec/prin.h"
#include "blkfence/codec/prout.h"
#include "blkfence/fence/resource.h"
#include "blkfence/pr/client.h"

#include "resource_reads.h"

namespace blkfence::fence {

// --- path hot-plug -------------------------------------------------------------------------------

bool Resource::holding() const {
  return key_ && ((state_ == State::kHeld && gate_open_) || state_ == State::kUnfenced);
}

// Lost contact while holding: whether the key is still current is not known yet. A path that
// appears meanwhile is neither registered (S5) nor forgotten: once a round shows the key current
// again and the gate reopens, it is registered like any new path (the read before its REGISTER
// checks the key once more). Forgetting it would leave the writer a path that gets RESERVATION
// CONFLICT, and the monitor a nexus it cannot preempt a stray through.
bool Resource::lost_contact_with_key() const {
  return key_ && state_ == State::kLostContact;
}

// What reads showed: key registered on every LU, and the holder everywhere in exclusive mode.
bool Resource::key_current(const Reads& reads, Key key) const {
  bool current = reads.ok();
  for (std::size_t i = 0; current && i < reads.lus.size(); ++i) {
    current = reads.registered(i, key.value()) &&
              (options_.mode == Mode::kShared || reads.holder(i) == key.value());
  }
  return current;
}

void Resource::update_paths(std::size_t lu, std::vector<pr::Path> paths, Time now) {
  BLKFENCE_ASSERT(lu < options_.lus.size());
  if (paths.empty()) {
    return;
  }
  std::vector<pr::Path>& current = options_.lus[lu].paths;
  // A path is its H:C:T:L and the device nodes that reach it: a device removed and found again
  // under the same H:C:T:L is a new device (often under new node names, since the old ones live on
  // while an fd holds them), so the old one is gone and the new one is registered like any new
  // path (on the same I_T nexus that is a no-op for the target).
  const auto known = [](const std::vector<pr::Path>& list, const pr::Path& path) {
    return std::any_of(list.begin(), list.end(), [&](const pr::Path& p) {
      return p.hctl == path.hctl && p.sg == path.sg && p.sd == path.sd;
    });
  };
  std::string added;
  std::string removed;
  for (const pr::Path& path : paths) {
    if (!known(current, path)) {
      added += (added.empty() ? "" : ", ") + pr::command_device(path) + " (" + path.hctl + ")";
      new_paths_.emplace_back(lu, path);
    }
  }
  for (const pr::Path& path : current) {
    if (!known(paths, path)) {
      removed += (removed.empty() ? "" : ", ") + pr::command_device(path) + " (" + path.hctl + ")";
    }
  }
  // A path that went away is not waiting for a registration any more.
  std::erase_if(new_paths_, [&](const auto& pending) {
    return pending.first == lu && !known(paths, pending.second);
  });
  std::erase_if(paths_after_a_round_, [&](const auto& pending) {
    return pending.first == lu && !known(paths, pending.second);
  });
  if (added.empty() && removed.empty()) {
    return;
  }
  for (const pr::Path& path : current) {
    if (!known(paths, path)) {
      engine_.forget(pr::command_device(path),
                     options_.lus[lu].wwn);  // its fd would hold the removed device open
    }
  }
  current = std::move(paths);
  std::string detail = options_.lus[lu].name + ":";
  if (!added.empty()) {
    detail += " new path " + added;
  }
  if (!removed.empty()) {
    detail += std::string(added.empty() ? "" : ";") + " path gone " + removed;
  }
  if (!added.empty() && lost_contact_with_key()) {
    detail += "; registered once contact is back and the key is verified as current";
  } else if (!added.empty() && !holding()) {
    // S5: a path that appears (or comes back) while our key is not the current one stays
    // unregistered; the next acquire or unfence registers every path.
    std::erase_if(new_paths_, [lu](const auto& pending) { return pending.first == lu; });
    detail += "; not registered: this node does not hold the resource";
  }
  emit(EventKind::kPathsChanged, detail, std::nullopt, options_.lus[lu].name);
  if (op_ == Op::kNone && !new_paths_.empty()) {
    register_new_paths(now);
  }
}

// New paths whose registration ended on a read that failed: whether the key is current was not
// shown, so they are registered after the next round that reads every LU, if that round leaves the
// key current (the gate open, or unfenced); a fence or a release drops them. Not at once: a read
// that fails at once would make that a loop.
void Resource::retry_paths_after_a_round(
    const std::vector<std::pair<std::size_t, pr::Path>>& paths) {
  if (!holding() && !lost_contact_with_key()) {
    return;  // fenced or released: the next acquire or unfence registers every path
  }
  for (const auto& pending : paths) {
    const pr::Path& path = pending.second;
    const auto& current = options_.lus[pending.first].paths;
    if (std::any_of(current.begin(), current.end(), [&path](const pr::Path& p) {
          return p.hctl == path.hctl && p.sg == path.sg && p.sd == path.sd;
        })) {
      paths_after_a_round_.push_back(pending);  // not one that went away meanwhile
    }
  }
}

// At the end of a round that read every LU (check_done): the paths waiting for one are registered
// once it shows the key current, keys included (a round without keys, or one that shows the key
// gone, leaves them waiting, or a fence drops them).
void Resource::register_paths_after_a_round(const Reads& reads, Time now) {
  if (!holding()) {
    if (!lost_contact_with_key()) {
      paths_after_a_round_.clear();
    }
    return;
  }
  const bool has_keys = std::all_of(reads.lus.begin(), reads.lus.end(),
                                    [](const Reads::Lu& lu) { return lu.keys.has_value(); });
  if (!has_keys || !key_current(reads, *key_)) {
    keys_next_ = keys_next_ || !paths_after_a_round_.empty() || !new_paths_.empty();
    return;
  }
  new_paths_.insert(new_paths_.end(), paths_after_a_round_.begin(), paths_after_a_round_.end());
  paths_after_a_round_.clear();
  if (op_ == Op::kNone && !new_paths_.empty()) {
    register_new_paths(now);  // those too that appeared while contact was lost
  }
}

bool Resource::holds_commands_back(std::size_t lu) const {
  if (!options_.writes_in_flight) {
    return false;
  }
  const auto writes = options_.writes_in_flight(options_.lus[lu]);
  return !writes && writes.error().errno_value() == EBUSY;
}

// Registers the new paths with the current key: read first (the key must still be current: a key
// preempted meanwhile is never registered again, S5), then REGISTER AND IGNORE EXISTING KEY on each
// new path, then read again. No atomic "register only while key K is registered" exists in SPC-4,
// so a preempt can land between the read and the REGISTER; the read afterwards catches it, and the
// new registrations are then taken back (and the holder's monitor would preempt them too: they rank
// below its key).
void Resource::register_new_paths(Time now) {
  if (lost_contact_with_key()) {
    return;  // kept until contact is back (check_done), or a fence or an operation drops them
  }
  if (!holding()) {
    new_paths_.clear();
    return;
  }
  // A LU with a path that holds commands back (its SCSI device blocked: an iSCSI session in
  // recovery) could hold the REGISTER too, at the head of that queue, and send it once the session
  // is back, maybe long after a fence and ahead of the writes waiting behind it (docs/protocol.md,
  // "Paths that come and go"). Its new paths wait for a round that finds none holding back.
  std::vector<std::pair<std::size_t, pr::Path>> held_back;
  std::erase_if(new_paths_, [this, &held_back](const std::pair<std::size_t, pr::Path>& pending) {
    if (!holds_commands_back(pending.first)) {
      return false;
    }
    held_back.push_back(pending);
    return true;
  });
  if (!held_back.empty()) {
    retry_paths_after_a_round(held_back);
  }
  if (new_paths_.empty()) {
    return;
  }
  begin(Op::kPaths, nullptr);
  const Key key = *key_;
  std::vector<std::pair<std::size_t, pr::Path>> paths = std::move(new_paths_);
  new_paths_.clear();
  after_monitor_prouts(now, [this, key, paths = std::move(paths)](Time from) mutable {
    read_all(
        true, from, [this, key, paths = std::move(paths)](const Reads& reads, Time at) mutable {
          // Lost contact (or a fence) meanwhile: the key is not known to be current any
          // more, whatever this read showed (S5). A release queued behind this registration
          // closed the gate but leaves the state held: it waits for us.
          const bool still = state_ == State::kHeld || state_ == State::kUnfenced;
          if (!still || !key_current(reads, key)) {
            // A read that shows our key lost is a fence, declared here as the monitor would
            // (the gate closes now); otherwise the monitor's next round, now, decides.
            if (still && gate_open_) {
              fenced_if_lost(reads, at);
            }
            // A read that failed proved nothing, and one that came back while contact was being
            // declared lost may show the key current again at the next round; after a fence or
            // a release they are dropped.
            retry_paths_after_a_round(paths);
            next_check_ = at;
            keys_next_ = true;
            end(fail(ErrorCode::kLost, "new paths not registered: " + key.to_string() +
                                           " is not verified as current"),
                at);
            return;
          }
          if (auto marked = mark_registering(); !marked) {
            // Not registered: a restart could not know to wait for these REGISTERs. The
            // writer keeps the paths it had; the next acquire, unfence or promote registers every
            // path.
            end(fail(marked.error().code(),
                     "new paths not registered (the next acquire, unfence or promote registers "
                     "them): " +
                         marked.error().message()),
                at);
            return;
          }
          std::vector<pr::Request> requests;
          for (const auto& [lu, path] : paths) {
            const pr::LogicalUnit one{
                .wwn = options_.lus[lu].wwn, .name = options_.lus[lu].name, .paths = {path}};
            for (auto& request : pr::prout_every_path(
                     one, codec::prout_register_and_ignore(key.value(), register_options()),
                     "REGISTER AND IGNORE EXISTING KEY (new path)")) {
              // Right only while the key is current, as this read showed: not resent after
              // a sign that someone preempted meanwhile (a resend would register a key that
              // was just preempted, S5); the read afterwards decides.
              request.stop_when_preempted = true;
              requests.push_back(std::move(request));
            }
          }
          run(std::move(requests), at,
              [this, key, paths = std::move(paths)](const std::vector<pr::Response>& responses,
                                                    Time done_at) mutable {
                note_late_registers(responses, done_at);
                // One request per path, in order. A path whose REGISTER was stopped by a
                // sign of a preempt did not register: should the read show the key still
                // current (the sign was about an older change), it is tried again, read
                // first.
                std::vector<std::pair<std::size_t, pr::Path>> again;
                for (std::size_t i = 0; i < responses.size() && i < paths.size(); ++i) {
                  const auto& attempts = responses[i].attempts;
                  if (!responses[i].data && !attempts.empty() &&
                      (attempts.back().outcome == transport::Outcome::kTaskAborted ||
                       (attempts.back().sense && attempts.back().sense->asc == 0x2a))) {
                    again.push_back(paths[i]);
                  }
                }
                new_paths_registered(key, std::move(paths), std::move(again),
                                     done_at);  // the read decides
              });
        });
  });
}

void Resource::new_paths_registered(Key key, std::vector<std::pair<std::size_t, pr::Path>> paths,
                                    std::vector<std::pair<std::size_t, pr::Path>> again, Time now) {
  read_all(
      true, now,
      [this, key, paths = std::move(paths), again = std::move(again)](const Reads& reads, Time at) {
        if (!reads.ok()) {
          // What the REGISTERs did is unknown, and so is whether a new path is really new: one that
          // went away and came back may be the nexus holding the reservation, and unregistering it
          // would drop the reservation (S4: no decision without reading). The monitor reads again
          // now: a fence removed every registration of the key, a late REGISTER leaves a stray that
          // the holder removes, and if the key is current the new paths are registered.
          next_check_ = at;
          keys_next_ = true;
          retry_paths_after_a_round(paths);
          end(fail(ErrorCode::kIndeterminate, "new paths: reading back after registering failed: " +
                                                  reads.errors(options_.lus)),
              at);
          return;
        }
        const bool current = key_current(reads, key);
        std::string names;
        for (const auto& [lu, path] : paths) {
          names += (names.empty() ? "" : ", ") + pr::command_device(path);
        }
        if (current) {
          if (!again.empty()) {
            // end() starts the registration of these again, with a read first.
            new_paths_.insert(new_paths_.end(), again.begin(), again.end());
            end(fail(ErrorCode::kIndeterminate,
                     "new paths: a REGISTER did not go through; trying again after a read"),
                at);
            return;
          }
          emit(EventKind::kPathsChanged, "registered " + key.to_string() + " on " + names);
          end(key, at);
          return;
        }
        // Preempted between our read and the REGISTER: the new paths now carry a key that is no
        // longer current, and the target lets our writers through them until they are taken
        // back. So the fence is declared on this read, closing the gate now, not at the monitor's
        // next round after the unregister (a slow one kept it open; tests/sim found it). Then the
        // new paths are taken back.
        if ((state_ == State::kHeld || state_ == State::kUnfenced) && gate_open_) {
          fenced_if_lost(reads, at);
        }
        std::vector<pr::Request> requests;
        for (const auto& [lu, path] : paths) {
          const pr::LogicalUnit one{
              .wwn = options_.lus[lu].wwn, .name = options_.lus[lu].name, .paths = {path}};
          for (auto& request :
               pr::prout_every_path(one, codec::prout_register(key.value(), 0, register_options()),
                                    "REGISTER (unregister new path)")) {
            requests.push_back(std::move(request));
          }
        }
        next_check_ = at;
        keys_next_ = true;
        run(std::move(requests), at,
            [this, key, names](const std::vector<pr::Response>&, Time done_at) {
              end(fail(ErrorCode::kLost, "the key " + key.to_string() +
                                             " was not current after registering " + names +
                                             "; taken back there"),
                  done_at);
            });
      });
}

}  // namespace blkfence::fence
