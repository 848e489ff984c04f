// The bodies of the deliberate protocol bugs that take more than a line (fence layer, tests only;
// the list is in mutants.h). Nothing in the product calls them.
#include "blkfence/codec/prout.h"
#include "blkfence/fence/resource.h"
#include "blkfence/pr/client.h"

namespace blkfence::fence {

// mutant::kReregister: "self-healing" after a fence, registering the old key again on every path
// and reopening the gate (S5, S1).
void Resource::mutant_reregister(Time now) {
  std::vector<pr::Request> requests;
  for (const auto& unit : options_.lus) {
    for (auto& request : pr::prout_every_path(
             unit, codec::prout_register_and_ignore(key_->value(), register_options()),
             "REGISTER")) {
      requests.push_back(std::move(request));
    }
  }
  run(std::move(requests), now, [this](const std::vector<pr::Response>&, Time at) {
    set_state(State::kHeld, "re-registered after a fence (mutant)");
    last_success_ = at;
    set_gate(true, at);
  });
}

// mutant::kReleaseDrops: an exclusive release that RELEASEs the reservation on every LU, leaving
// the LUs unreserved: under no reservation every nexus may write, a node preempted a moment ago
// that has not noticed yet included (S1). The product's release leaves the reservation with the
// key.
void Resource::mutant_release(Key key, Time now) {
  std::vector<pr::Request> requests;
  for (const auto& unit : options_.lus) {
    requests.push_back(
        pr::prout_first_path(unit, codec::prout_release(key.value(), options_.type), "RELEASE"));
  }
  (void)give_up(key);
  key_.reset();
  run(std::move(requests), now, [this, key](const std::vector<pr::Response>&, Time at) {
    set_state(State::kReleased, "released " + key.to_string() + " and its reservation (mutant)");
    emit(EventKind::kReleased, detail_);
    end(key, at);
  });
}

// mutant::kNoReread: a failed acquire unregisters its key on every path of every LU at once,
// without the read that S4 requires first (acquire_failed reads, and keeps the key where a PREEMPT
// of its own may have made it the holder).
void Resource::mutant_unregister_unread(Key key, std::string why, Time now) {
  std::vector<pr::Request> requests;
  for (const auto& unit : options_.lus) {
    for (auto& request :
         pr::prout_every_path(unit, codec::prout_register(key.value(), 0, register_options()),
                              "REGISTER (unregister)")) {
      requests.push_back(std::move(request));
    }
  }
  (void)give_up(key);
  run(std::move(requests), now,
      [this, key, why = std::move(why)](const std::vector<pr::Response>&, Time at) {
        set_state(State::kReleased, "acquire with " + key.to_string() + " failed: " + why);
        end(fail(ErrorCode::kIndeterminate, "resource " + options_.name + ": " + detail_), at);
      });
}

}  // namespace blkfence::fence
