// blkfence-lab-outstanding: puts more commands on one path at once than sg.c accepts per file
// descriptor (16; beyond that write() fails with EDOM) and checks that the transport queues the
// rest and every command completes GOOD with a well-formed READ KEYS response. Runs in the lab.
//   usage: blkfence-lab-outstanding uring|sgio /dev/sgN COUNT
// Exit 0 when all COUNT completed GOOD; 1 otherwise; 2 on bad arguments.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "blkfence/codec/prin.h"
#include "blkfence/transport/transport.h"

int main(int argc, char** argv) {
  using namespace blkfence;
  if (argc != 4) {
    (void)std::fprintf(stderr, "usage: %s uring|sgio /dev/sgN COUNT\n", argv[0]);
    return 2;
  }
  const std::string kind = argv[1];
  const int count = std::atoi(argv[3]);
  if ((kind != "uring" && kind != "sgio") || count < 1 || count > 4096) {
    (void)std::fprintf(stderr, "%s: bad arguments\n", argv[0]);
    return 2;
  }
  auto transport = transport::make_transport(kind == "uring" ? transport::TransportKind::kUring
                                                             : transport::TransportKind::kSgio);
  if (!transport) {
    (void)std::fprintf(stderr, "transport: %s\n", transport.error().message().c_str());
    return 1;
  }
  auto path = (*transport)->open_path(argv[2]);
  if (!path) {
    (void)std::fprintf(stderr, "open: %s\n", path.error().message().c_str());
    return 1;
  }
  const auto read_keys = [&](int n) {
    std::vector<transport::PathCommand> commands;
    for (int i = 0; i < n; ++i) {
      auto command =
          transport::Command::from_cdb(codec::encode_prin_cdb(codec::PrInAction::kReadKeys, 1024));
      command.direction = transport::DataDirection::kFromDevice;
      command.data_in_size = 1024;
      command.tag = static_cast<std::uint64_t>(i);
      commands.push_back({*path, std::move(command)});
    }
    return transport::run_batch(**transport, std::move(commands));
  };
  // A pending unit attention would answer one command of the batch: take it first.
  for (int i = 0; i < 5; ++i) {
    const auto warm = read_keys(1);
    if (warm && (*warm)[0].outcome == transport::Outcome::kGood) {
      break;
    }
  }
  const auto completions = read_keys(count);
  if (!completions) {
    (void)std::fprintf(stderr, "batch: %s\n", completions.error().message().c_str());
    return 1;
  }
  int good = 0;
  for (const auto& c : *completions) {
    if (c.outcome == transport::Outcome::kGood && codec::decode_read_keys(c.data_in)) {
      ++good;
    } else {
      (void)std::fprintf(stderr, "command %llu: %s\n", static_cast<unsigned long long>(c.tag),
                         std::string(transport::to_string(c.outcome)).c_str());
    }
  }
  std::printf("%d of %d READ KEYS on one %s path completed GOOD\n", good, count,
              std::string((*transport)->name()).c_str());
  return good == count ? 0 : 1;
}
