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
    for (auto& request :
         pr::prout_every_path(unit, codec::prout_register_and_ignore(key_->value()), "REGISTER")) {
      requests.push_back(std::move(request));
    }
  }
  run(std::move(requests), now, [this](const std::vector<pr::Response>&, Time at) {
    set_state(State::kHeld, "re-registered after a fence (mutant)");
    last_success_ = at;
    set_gate(true, at);
  });
}

}  // namespace blkfence::fence
