// blkfence-lab-prloop: sends one PERSISTENT RESERVE OUT over and over on one path for a while, as
// fast as the target answers, and counts the outcomes. Several of them side by side on different
// nexuses make PR OUTs of two nodes overlap in the target, which the lab's stress checks need to
// reproduce LIO's races between them (tests/lab/README.md, "Limits").
//   usage: blkfence-lab-prloop /dev/sgN SECONDS ACTION KEY [VICTIM]
//   ACTION: register-ignore (KEY; 0 unregisters), reserve (KEY), release (KEY),
//           preempt or preempt-abort (KEY takes VICTIM's registrations; type 5 throughout)
// Prints "prloop ACTION: N sent, N good, N conflict, N unit-attention, N other" and exits 0 when
// every command got an answer (GOOD, RESERVATION CONFLICT or a CHECK CONDITION); 1 when one timed
// out or failed to reach the LU; 2 on bad arguments.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "blkfence/codec/prout.h"
#include "blkfence/transport/transport.h"

namespace {

using namespace blkfence;

std::optional<codec::PrOutCommand> command_for(std::string_view action, std::uint64_t key,
                                               std::uint64_t victim) {
  constexpr auto kType = codec::PrType::kWriteExclusiveRegistrantsOnly;
  if (action == "register-ignore") {
    return codec::prout_register_and_ignore(key);
  }
  if (action == "reserve") {
    return codec::prout_reserve(key, kType);
  }
  if (action == "release") {
    return codec::prout_release(key, kType);
  }
  if (action == "preempt") {
    return codec::prout_preempt(key, victim, kType);
  }
  if (action == "preempt-abort") {
    return codec::prout_preempt_and_abort(key, victim, kType);
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || argc > 6) {
    (void)std::fprintf(stderr, "usage: %s /dev/sgN SECONDS ACTION KEY [VICTIM]\n", argv[0]);
    return 2;
  }
  const std::string_view action = argv[3];
  const auto seconds = std::chrono::seconds(std::atoi(argv[2]));
  const auto prout = command_for(action, std::strtoull(argv[4], nullptr, 0),
                                 argc == 6 ? std::strtoull(argv[5], nullptr, 0) : 0);
  if (!prout || seconds.count() < 1) {
    (void)std::fprintf(stderr, "%s: bad arguments\n", argv[0]);
    return 2;
  }
  auto transport = transport::make_transport(transport::TransportKind::kSgio);
  if (!transport) {
    (void)std::fprintf(stderr, "transport: %s\n", transport.error().message().c_str());
    return 1;
  }
  auto path = (*transport)->open_path(argv[1]);
  if (!path) {
    (void)std::fprintf(stderr, "open %s: %s\n", argv[1], path.error().message().c_str());
    return 1;
  }
  long sent = 0, good = 0, conflict = 0, unit_attention = 0, other = 0;
  int status = 0;
  const auto end = std::chrono::steady_clock::now() + seconds;
  while (std::chrono::steady_clock::now() < end) {
    auto command = transport::Command::from_cdb(prout->cdb);
    command.direction = transport::DataDirection::kToDevice;
    command.data_out = prout->parameters;
    command.timeout = std::chrono::seconds(30);
    std::vector<transport::PathCommand> batch;
    batch.push_back({*path, std::move(command)});
    const auto completions = transport::run_batch(**transport, std::move(batch));
    ++sent;
    if (!completions) {
      (void)std::fprintf(stderr, "prloop: %s\n", completions.error().message().c_str());
      status = 1;
      break;
    }
    switch ((*completions)[0].outcome) {
      case transport::Outcome::kGood: ++good; break;
      case transport::Outcome::kReservationConflict: ++conflict; break;
      case transport::Outcome::kCheckCondition: ++unit_attention; break;
      default:
        ++other;
        status = 1;
        (void)std::fprintf(stderr, "prloop: %s\n",
                           std::string(transport::to_string((*completions)[0].outcome)).c_str());
    }
  }
  std::printf("prloop %s: %ld sent, %ld good, %ld conflict, %ld unit-attention, %ld other\n",
              std::string(action).c_str(), sent, good, conflict, unit_attention, other);
  return status;
}
