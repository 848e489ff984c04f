// Proves SimTransport keeps the Transport contract under every fault it injects, on simulated
// time: unknown devices fail with ENOENT; answers take simulated latency (reap() advances the
// clock, nothing sleeps) and may complete out of order; a lost answer (executed) and a lost
// command (never executed) both end as kIndeterminate exactly at the deadline; a late command
// executes after its caller got kIndeterminate; a duplicated command executes twice and completes
// once; an injected unit attention stops its command; an unreachable LU gives DID_NO_CONNECT or
// silence; close_path() reports what is in flight; every command completes exactly once under
// random faults; the same seed replays the same run (completions and target history) and another
// seed does not; transports sharing a clock run their events in one order (poll_fd() included);
// a path in recovery holds commands in the host and sends them in queue order (passthrough
// first), or fails them unsent; and PREEMPT AND ABORT through the transport aborts a held write
// (TASK ABORTED) where a plain PREEMPT lets it land, which s1_violations() catches.
#include "blkfence/testing/sim_transport.h"

#include <map>
#include <set>
#include <tuple>

#include <gtest/gtest.h>
#include <poll.h>

#include "blkfence/codec/sense.h"
#include "blkfence/testing/sim_commands.h"

namespace blkfence::transport::test {
namespace {

using codec::PrInAction;
using codec::PrType;
using std::chrono::milliseconds;

constexpr std::uint64_t kKeyA = 0x4c494f0000000001ULL;
constexpr std::uint64_t kKeyB = 0x4c494f0000000002ULL;
constexpr NexusId kA = 1;
constexpr NexusId kB = 2;
constexpr milliseconds kTimeout{100};
constexpr milliseconds kLong{60'000};  // a deadline no step of a test reaches

Command tagged(Command command, std::uint64_t tag, milliseconds timeout = kTimeout) {
  command.tag = tag;
  command.timeout = timeout;
  return command;
}

std::vector<Completion> reap_all(Transport& transport) {
  std::vector<Completion> completions;
  for (int round = 0; transport.in_flight() > 0 && round < 100'000; ++round) {
    EXPECT_TRUE(transport.reap(milliseconds(1000), completions).has_value());
  }
  EXPECT_EQ(transport.in_flight(), 0U);
  return completions;
}

// Submits one command and waits for it; nothing else may be in flight.
Completion run_one(Transport& transport, PathId path, Command command) {
  EXPECT_EQ(transport.in_flight(), 0U);
  const auto submitted = transport.submit(path, std::move(command));
  EXPECT_TRUE(submitted.has_value()) << submitted.error().message();
  std::vector<Completion> completions = reap_all(transport);
  EXPECT_EQ(completions.size(), 1U);
  return completions.empty() ? Completion{} : std::move(completions.front());
}

bool is_pr_out(const FaultContext& context) {
  return context.command.cdb[0] == 0x5f;
}

bool is_write(const FaultContext& context) {
  return context.command.cdb[0] == 0x2a;
}

class SimTransportTest : public ::testing::Test {
 protected:
  // The fixture's paths: /dev/sg1 is node A's nexus to the LU, /dev/sg2 node B's.
  SimTransportTest() {
    target.add_path("/dev/sg1", lu, kA);
    target.add_path("/dev/sg2", lu, kB);
  }

  std::unique_ptr<SimTransport> make(SimTransportOptions options = {}) {
    auto made = SimTransport::make(target, std::move(options));
    EXPECT_TRUE(made.has_value());
    return made ? std::move(*made) : nullptr;
  }
  PathId open(SimTransport& transport, const std::string& device) {
    auto path = transport.open_path(device);
    EXPECT_TRUE(path.has_value());
    return path.value_or(0);
  }

  SimClock clock;
  SimTarget target{clock};
  LuId lu = target.add_lu();
};

TEST_F(SimTransportTest, UnknownDevicesFailLikeOpenWould) {
  auto transport = make();
  const auto missing = transport->open_path("/dev/sg9");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code(), ErrorCode::kOs);
  EXPECT_EQ(missing.error().errno_value(), ENOENT);
  EXPECT_TRUE(transport->open_path("/dev/sg1").has_value());
  EXPECT_EQ(transport->name(), "sim");
}

TEST_F(SimTransportTest, RefusesBadCommandsAndUnknownPathsAtSubmit) {
  auto transport = make();
  const PathId path = open(*transport, "/dev/sg1");
  Command empty;
  const auto refused = transport->submit(path, empty);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(transport->submit(path + 7, test_unit_ready_command()).has_value());
  EXPECT_EQ(transport->in_flight(), 0U);
}

TEST_F(SimTransportTest, AnswersTakeSimulatedLatencyAndNoRealTime) {
  SimTransportOptions options;
  options.latency_min = milliseconds(1);
  options.latency_max = milliseconds(3);
  auto transport = make(options);
  const PathId path = open(*transport, "/dev/sg1");
  ASSERT_TRUE(transport->submit(path, tagged(prin_command(PrInAction::kReadKeys), 7)).has_value());
  std::vector<Completion> completions;
  ASSERT_EQ(transport->reap(milliseconds(0), completions).value_or(9), 0U);
  EXPECT_EQ(clock.now(), SimTime(0));
  EXPECT_EQ(transport->in_flight(), 1U);
  ASSERT_EQ(transport->reap(milliseconds(60'000), completions).value_or(0), 1U);
  const Completion& done = completions.front();
  EXPECT_EQ(done.tag, 7U);
  EXPECT_EQ(done.outcome, Outcome::kGood);
  EXPECT_EQ(done.latency, clock.now());
  EXPECT_GE(clock.now(), milliseconds(1));
  EXPECT_LE(clock.now(), milliseconds(3));
  const auto keys = codec::decode_read_keys(done.data_in);
  ASSERT_TRUE(keys.has_value());
  EXPECT_TRUE(keys->keys.empty());
  // Waiting with nothing in flight is a simulated sleep.
  const SimTime before = clock.now();
  EXPECT_EQ(transport->reap(milliseconds(250), completions).value_or(9), 0U);
  EXPECT_EQ(clock.now(), before + milliseconds(250));
}

TEST_F(SimTransportTest, CompletionsComeInTheOrderAnswersArrive) {
  SimTransportOptions options;
  options.fault = [](const FaultContext& context) {
    Fault fault;
    if (context.sequence == 0) {
      fault.response_delay = milliseconds(5);
    }
    return fault;
  };
  auto transport = make(options);
  const PathId path = open(*transport, "/dev/sg1");
  ASSERT_TRUE(transport->submit(path, tagged(test_unit_ready_command(), 1)).has_value());
  ASSERT_TRUE(transport->submit(path, tagged(test_unit_ready_command(), 2)).has_value());
  const auto completions = reap_all(*transport);
  ASSERT_EQ(completions.size(), 2U);
  EXPECT_EQ(completions[0].tag, 2U);
  EXPECT_EQ(completions[1].tag, 1U);
}

TEST_F(SimTransportTest, ALostAnswerIsIndeterminateButTheCommandExecuted) {
  SimTransportOptions options;
  options.fault = [](const FaultContext& context) {
    Fault fault;
    fault.drop_response = is_pr_out(context);
    return fault;
  };
  auto transport = make(options);
  const PathId path = open(*transport, "/dev/sg1");
  const Completion done =
      run_one(*transport, path, tagged(prout_command(codec::prout_register_and_ignore(kKeyA)), 3));
  EXPECT_EQ(done.outcome, Outcome::kIndeterminate);
  EXPECT_EQ(done.latency, kTimeout);
  EXPECT_EQ(target.registrations(lu), (std::vector<SimRegistration>{{kA, kKeyA, false}}));
  EXPECT_EQ(transport->unreturned(), std::optional<std::size_t>(0)) << "it ran: nothing can run";
}

TEST_F(SimTransportTest, ALostCommandIsIndeterminateAndNeverExecutes) {
  SimTransportOptions options;
  options.deadline_grace = milliseconds(20);
  options.fault = [](const FaultContext&) {
    Fault fault;
    fault.drop_request = true;
    return fault;
  };
  auto transport = make(options);
  const PathId path = open(*transport, "/dev/sg1");
  const Completion done =
      run_one(*transport, path, tagged(prout_command(codec::prout_register_and_ignore(kKeyA)), 3));
  EXPECT_EQ(done.outcome, Outcome::kIndeterminate);
  EXPECT_EQ(done.latency, kTimeout + milliseconds(20));  // the timeout plus the grace
  EXPECT_EQ(transport->unreturned(), std::optional<std::size_t>(0)) << "lost: it cannot run";
  clock.advance(std::chrono::hours(1));
  EXPECT_TRUE(target.registrations(lu).empty());
  EXPECT_TRUE(target.history().prouts.empty());
}

// The hazard of S4 (docs/protocol.md): the caller has its kIndeterminate, and the command executes
// afterwards, whether it was late on the way or held in the target.
TEST_F(SimTransportTest, ALateCommandExecutesAfterItsCallerGaveUp) {
  for (const bool held_in_target : {false, true}) {
    SCOPED_TRACE(held_in_target ? "held in the target" : "late on the way");
    SimClock local_clock;
    SimTarget local(local_clock);
    const LuId id = local.add_lu();
    local.add_path("/dev/sg1", id, kA);
    SimTransportOptions options;
    options.fault = [held_in_target](const FaultContext&) {
      Fault fault;
      (held_in_target ? fault.execute_delay : fault.request_delay) = milliseconds(500);
      return fault;
    };
    auto transport = SimTransport::make(local, options).value();
    const PathId path = transport->open_path("/dev/sg1").value();
    const Completion done = run_one(
        *transport, path, tagged(prout_command(codec::prout_register_and_ignore(kKeyA)), 3));
    EXPECT_EQ(done.outcome, Outcome::kIndeterminate);
    EXPECT_EQ(local_clock.now(), kTimeout);
    EXPECT_TRUE(local.registrations(id).empty());
    EXPECT_EQ(local.held_count(id), held_in_target ? 1U : 0U);
    EXPECT_EQ(transport->unreturned(), std::optional<std::size_t>(1)) << "it may still run";
    local_clock.advance(milliseconds(1000));
    EXPECT_EQ(transport->unreturned(), std::optional<std::size_t>(0)) << "it ran";
    EXPECT_EQ(local.registrations(id).size(), 1U);
    ASSERT_EQ(local.history().prouts.size(), 1U);
    EXPECT_GT(local.history().prouts[0].at, milliseconds(500));
    // The late answer found nobody waiting: still nothing to reap.
    std::vector<Completion> late;
    EXPECT_EQ(transport->reap(milliseconds(0), late).value_or(9), 0U);
  }
}

TEST_F(SimTransportTest, ADuplicatedCommandExecutesTwiceAndCompletesOnce) {
  SimTransportOptions options;
  options.fault = [](const FaultContext&) {
    Fault fault;
    fault.duplicates = 1;
    fault.duplicate_interval = milliseconds(10);
    return fault;
  };
  auto transport = make(options);
  const PathId path = open(*transport, "/dev/sg1");
  // REGISTER from an unregistered nexus: the first copy registers, the retransmission then comes
  // from a registered nexus with RESERVATION KEY 0 and conflicts; the caller sees the first.
  const Completion done =
      run_one(*transport, path, tagged(prout_command(codec::prout_register(0, kKeyA)), 3));
  EXPECT_EQ(done.outcome, Outcome::kGood);
  clock.advance(milliseconds(50));
  ASSERT_EQ(target.history().prouts.size(), 2U);
  EXPECT_EQ(target.history().prouts[0].outcome.status, 0x00);
  EXPECT_EQ(target.history().prouts[1].outcome.status, 0x18);
  EXPECT_EQ(target.generation(lu), 1U);
  // REGISTER AND IGNORE twice: both execute, and LIO bumps PRgeneration for each.
  const Completion again =
      run_one(*transport, path, tagged(prout_command(codec::prout_register_and_ignore(kKeyB)), 4));
  EXPECT_EQ(again.outcome, Outcome::kGood);
  clock.advance(milliseconds(50));
  EXPECT_EQ(target.generation(lu), 3U);
  std::vector<Completion> extra;
  EXPECT_EQ(transport->reap(milliseconds(0), extra).value_or(9), 0U);
}

TEST_F(SimTransportTest, AnInjectedUnitAttentionStopsItsCommand) {
  SimTransportOptions options;
  options.fault = [](const FaultContext& context) {
    Fault fault;
    if (context.sequence == 0) {
      fault.unit_attention = kUaItNexusLoss;
    }
    return fault;
  };
  auto transport = make(options);
  const PathId path = open(*transport, "/dev/sg1");
  const Completion first =
      run_one(*transport, path, tagged(prout_command(codec::prout_register_and_ignore(kKeyA)), 1));
  EXPECT_EQ(first.outcome, Outcome::kCheckCondition);
  const codec::Sense sense = codec::decode_sense(first.sense);
  EXPECT_EQ(sense.sense_key, codec::SenseKey::kUnitAttention);
  EXPECT_EQ(sense.asc, 0x29);
  EXPECT_EQ(sense.ascq, 0x07);
  EXPECT_TRUE(target.registrations(lu).empty());
  const Completion second =
      run_one(*transport, path, tagged(prout_command(codec::prout_register_and_ignore(kKeyA)), 2));
  EXPECT_EQ(second.outcome, Outcome::kGood);
  EXPECT_EQ(target.registrations(lu).size(), 1U);
}

TEST_F(SimTransportTest, AnUnreachableLuAnswersNoConnectOrNothing) {
  SimTransportOptions options;
  options.latency_min = milliseconds(2);
  options.latency_max = milliseconds(2);
  options.fault = [](const FaultContext& context) {
    Fault fault;
    if (context.command.tag == 4) {
      fault.response_delay = milliseconds(20);
    }
    return fault;
  };
  auto transport = make(options);
  const PathId path = open(*transport, "/dev/sg1");
  const Command register_a = prout_command(codec::prout_register_and_ignore(kKeyA));
  transport->set_link(lu, LinkState::kNoConnect);
  const Completion refused = run_one(*transport, path, tagged(register_a, 1));
  EXPECT_EQ(refused.outcome, Outcome::kTransportError);
  EXPECT_EQ(refused.host_status, 0x01);
  EXPECT_EQ(refused.latency, milliseconds(2));
  transport->set_link(lu, LinkState::kNoAnswer);
  const Completion silent = run_one(*transport, path, tagged(register_a, 2));
  EXPECT_EQ(silent.outcome, Outcome::kIndeterminate);
  EXPECT_EQ(silent.latency, kTimeout);
  EXPECT_TRUE(target.registrations(lu).empty());
  transport->set_link(lu, LinkState::kUp);
  EXPECT_EQ(run_one(*transport, path, tagged(register_a, 3)).outcome, Outcome::kGood);
  // The link drops while the answer is on its way back: executed, and indeterminate.
  ASSERT_TRUE(
      transport->submit(path, tagged(prout_command(codec::prout_register_and_ignore(kKeyB)), 4))
          .has_value());
  clock.advance(milliseconds(5));
  EXPECT_EQ(target.registrations(lu), (std::vector<SimRegistration>{{kA, kKeyB, false}}));
  transport->set_link(lu, LinkState::kNoAnswer);
  const auto lost = reap_all(*transport);
  ASSERT_EQ(lost.size(), 1U);
  EXPECT_EQ(lost[0].outcome, Outcome::kIndeterminate);
}

TEST_F(SimTransportTest, ClosingAPathReportsWhatIsInFlight) {
  SimTransportOptions options;
  options.fault = [](const FaultContext&) {
    Fault fault;
    fault.request_delay = milliseconds(30);
    return fault;
  };
  auto transport = make(options);
  const PathId path = open(*transport, "/dev/sg1");
  ASSERT_TRUE(
      transport->submit(path, tagged(prout_command(codec::prout_register_and_ignore(kKeyA)), 5))
          .has_value());
  transport->close_path(path);
  std::vector<Completion> completions;
  ASSERT_EQ(transport->reap(milliseconds(0), completions).value_or(0), 1U);
  EXPECT_EQ(completions[0].tag, 5U);
  EXPECT_EQ(completions[0].outcome, Outcome::kIndeterminate);
  EXPECT_EQ(transport->in_flight(), 0U);
  EXPECT_FALSE(transport->submit(path, test_unit_ready_command()).has_value());
  clock.advance(milliseconds(100));
  EXPECT_EQ(target.registrations(lu).size(), 1U);  // it executed all the same
}

// Events and held commands outlive neither the transport nor the target that queued them: the
// clock runs on afterwards without touching freed memory (the sanitizer build checks).
TEST(SimLifetime, DestroyingTransportOrTargetWithWorkQueuedIsSafe) {
  SimClock clock;
  {
    SimTarget target(clock);
    const LuId lu = target.add_lu();
    target.add_path("/dev/sg1", lu, kA);
    SimTransportOptions options;
    options.fault = [](const FaultContext&) {
      Fault fault;
      fault.execute_delay = milliseconds(30);
      fault.duplicates = 1;
      return fault;
    };
    auto transport = SimTransport::make(target, options).value();
    const PathId path = transport->open_path("/dev/sg1").value();
    ASSERT_TRUE(transport->submit(path, tagged(write_command(0, 0x01), 1)).has_value());
    clock.advance(milliseconds(1));
    EXPECT_EQ(target.held_count(lu), 1U);
    transport.reset();
    clock.advance(milliseconds(40));  // the held write lands; its answer has nobody to go to
    EXPECT_EQ(target.block(lu, 0), std::vector<std::uint8_t>(512, 0x01));
    // The second copy was still on its way: it went with the transport.
    EXPECT_EQ(target.history().writes.size(), 1U);
    target.submit(lu, kA, write_command(1, 0x02), milliseconds(30), [](const SimAnswer&) {});
    EXPECT_EQ(target.held_count(lu), 1U);
  }  // the target cancels its held command
  clock.advance(std::chrono::hours(1));
  EXPECT_EQ(clock.pending(), 0U);
}

TEST_F(SimTransportTest, RunBatchWorksOverTheSimulation) {
  const LuId second = target.add_lu();
  target.add_path("/dev/sg3", second, kA);
  ASSERT_EQ(
      target.execute(second, kB, prout_command(codec::prout_register_and_ignore(kKeyB))).status,
      0x00);
  auto transport = make();
  std::vector<PathCommand> batch;
  batch.push_back({open(*transport, "/dev/sg1"), tagged(prin_command(PrInAction::kReadKeys), 10)});
  batch.push_back({open(*transport, "/dev/sg3"), tagged(prin_command(PrInAction::kReadKeys), 11)});
  const auto completions = run_batch(*transport, std::move(batch));
  ASSERT_TRUE(completions.has_value());
  ASSERT_EQ(completions->size(), 2U);
  EXPECT_EQ((*completions)[0].tag, 10U);
  EXPECT_TRUE(codec::decode_read_keys((*completions)[0].data_in)->keys.empty());
  EXPECT_EQ(codec::decode_read_keys((*completions)[1].data_in)->keys,
            std::vector<std::uint64_t>{kKeyB});
}

bool readable(int fd) {
  pollfd watch{fd, POLLIN, 0};
  return ::poll(&watch, 1, 0) == 1 && (watch.revents & POLLIN) != 0;
}

// Two nodes' transports on one clock: reaping on one runs the other's events in time order, and
// the other's poll_fd() says so.
TEST_F(SimTransportTest, TransportsSharingAClockRunInOneOrder) {
  SimTransportOptions fast;
  fast.latency_min = fast.latency_max = milliseconds(1);
  SimTransportOptions slow;
  slow.latency_min = slow.latency_max = milliseconds(10);
  auto node_a = make(fast);
  auto node_b = make(slow);
  const PathId path_a = open(*node_a, "/dev/sg1");
  const PathId path_b = open(*node_b, "/dev/sg2");
  ASSERT_TRUE(
      node_a->submit(path_a, tagged(prout_command(codec::prout_register_and_ignore(kKeyA)), 1))
          .has_value());
  ASSERT_TRUE(node_b->submit(path_b, tagged(prin_command(PrInAction::kReadKeys), 2)).has_value());
  EXPECT_FALSE(readable(node_a->poll_fd()));
  const auto b_done = reap_all(*node_b);
  ASSERT_EQ(b_done.size(), 1U);
  // B's READ KEYS reached the target (at 5 ms) after A's REGISTER (at 0.5 ms).
  EXPECT_EQ(codec::decode_read_keys(b_done[0].data_in)->keys, std::vector<std::uint64_t>{kKeyA});
  EXPECT_TRUE(readable(node_a->poll_fd()));
  std::vector<Completion> a_done;
  ASSERT_EQ(node_a->reap(milliseconds(0), a_done).value_or(0), 1U);
  EXPECT_EQ(a_done[0].latency, milliseconds(1));
  EXPECT_FALSE(readable(node_a->poll_fd()));
}

// A compact record of a run, for comparing runs.
using Summary = std::vector<std::tuple<std::uint64_t, Outcome, std::uint8_t, std::int64_t,
                                       std::vector<std::uint8_t>, std::vector<std::uint8_t>>>;

RandomFaults heavy_faults() {
  RandomFaults rates;
  rates.drop_request = 0.1;
  rates.drop_response = 0.1;
  rates.delay_response = 0.2;
  rates.execute_late = 0.2;
  rates.duplicate = 0.2;
  rates.unit_attention = 0.1;
  rates.delay_max = milliseconds(150);
  return rates;
}

// Two nodes fight over the LU through one transport each, under random faults.
std::pair<Summary, SimHistory> random_run(std::uint64_t seed, std::size_t rounds) {
  SimClock clock;
  SimTarget target(clock);
  const LuId lu = target.add_lu();
  target.add_path("/dev/sg1", lu, kA);
  target.add_path("/dev/sg2", lu, kB);
  SimTransportOptions options;
  options.seed = seed;
  options.fault = random_faults(heavy_faults());
  auto transport = SimTransport::make(target, options).value();
  const PathId paths[] = {transport->open_path("/dev/sg1").value(),
                          transport->open_path("/dev/sg2").value()};
  const std::uint64_t keys[] = {kKeyA, kKeyB};
  std::mt19937_64 workload(seed ^ 0x5eedULL);
  Summary summary;
  std::vector<Completion> completions;
  for (std::size_t round = 0; round < rounds; ++round) {
    const std::size_t me = workload() % 2;
    const std::uint64_t key = keys[me];
    const std::uint64_t other = keys[1 - me];
    Command command;
    switch (workload() % 5) {
      case 0: command = prout_command(codec::prout_register_and_ignore(key)); break;
      case 1:
        command = prout_command(codec::prout_reserve(key, PrType::kWriteExclusiveRegistrantsOnly));
        break;
      case 2:
        command = prout_command(
            codec::prout_preempt_and_abort(key, other, PrType::kWriteExclusiveRegistrantsOnly));
        break;
      case 3: command = write_command(round % 8, static_cast<std::uint8_t>(round)); break;
      default: command = prin_command(PrInAction::kReadKeys, 64); break;
    }
    EXPECT_TRUE(transport->submit(paths[me], tagged(std::move(command), round)).has_value());
    EXPECT_TRUE(transport->reap(milliseconds(workload() % 20), completions).has_value());
  }
  for (Completion& completion : reap_all(*transport)) {
    completions.push_back(std::move(completion));
  }
  for (const Completion& c : completions) {
    summary.emplace_back(c.tag, c.outcome, c.status, c.latency.count(), c.sense, c.data_in);
  }
  clock.advance(std::chrono::hours(1));  // let late and held commands finish
  return {summary, target.history()};
}

TEST(SimTransportRandom, TheSameSeedReplaysTheSameRun) {
  const auto first = random_run(42, 300);
  const auto again = random_run(42, 300);
  EXPECT_EQ(first.first, again.first);
  EXPECT_TRUE(first.second == again.second);
  const auto other = random_run(43, 300);
  EXPECT_NE(first.first, other.first);
  EXPECT_FALSE(first.second == other.second);
}

TEST(SimTransportRandom, EveryCommandCompletesExactlyOnceWhateverTheFaults) {
  for (const std::uint64_t seed : {1ULL, 2ULL, 3ULL}) {
    const auto [summary, history] = random_run(seed, 400);
    std::map<std::uint64_t, int> seen;
    std::map<Outcome, int> outcomes;
    for (const auto& entry : summary) {
      ++seen[std::get<0>(entry)];
      ++outcomes[std::get<1>(entry)];
    }
    EXPECT_EQ(seen.size(), 400U) << "seed " << seed;
    for (const auto& [tag, count] : seen) {
      EXPECT_EQ(count, 1) << "tag " << tag << " completed " << count << " times";
    }
    // The faults really happened: some indeterminate, some answered, and some retransmissions.
    EXPECT_GT(outcomes[Outcome::kIndeterminate], 0);
    EXPECT_GT(outcomes[Outcome::kGood], 0);
    EXPECT_GT(history.prouts.size() + history.writes.size(), summary.size() / 2);
  }
}

// A path in recovery (SimHostQueues): its commands wait in the host, started nowhere, and go out
// in queue order when it comes back, passthrough commands ahead of the writes already waiting. So
// a REGISTER that a fenced node's daemon queues reaches the LU before the writes that waited
// there, and they land; without it they are refused.
TEST_F(SimTransportTest, APathInRecoveryHoldsCommandsAndSendsPassthroughFirst) {
  for (const bool register_again : {false, true}) {
    SCOPED_TRACE(register_again ? "the daemon registers meanwhile" : "nothing registers");
    SimClock local_clock;
    SimTarget local(local_clock);
    const LuId id = local.add_lu();
    local.add_path("/dev/sg1", id, kA);
    local.add_path("/dev/sd1", id, kA);
    local.add_path("/dev/sg2", id, kB);
    const auto host = std::make_shared<SimHostQueues>();
    auto daemon = SimTransport::make(local, {.host_queues = host, .queue_at_head = true}).value();
    auto writer = SimTransport::make(local, {.host_queues = host, .queue_at_head = false}).value();
    auto holder = SimTransport::make(local).value();
    const PathId sg = daemon->open_path("/dev/sg1").value();
    const PathId sd = writer->open_path("/dev/sd1").value();
    const PathId b = holder->open_path("/dev/sg2").value();
    ASSERT_EQ(run_one(*holder, b, tagged(prout_command(codec::prout_register_and_ignore(kKeyB)), 1))
                  .outcome,
              Outcome::kGood);
    ASSERT_EQ(run_one(*holder, b,
                      tagged(prout_command(codec::prout_reserve(
                                 kKeyB, PrType::kWriteExclusiveRegistrantsOnly)),
                             2))
                  .outcome,
              Outcome::kGood);

    host->hold(kA);
    ASSERT_TRUE(writer->submit(sd, tagged(write_command(7, 0xee), 3, kLong)).has_value());
    local_clock.advance(milliseconds(50));
    EXPECT_EQ(host->waiting(kA), 1U);
    EXPECT_TRUE(local.history().writes.empty()) << "not sent";
    EXPECT_EQ(local.held_count(id), 0U);
    if (register_again) {
      ASSERT_TRUE(
          daemon
              ->submit(sg, tagged(prout_command(codec::prout_register_and_ignore(kKeyA)), 4, kLong))
              .has_value());
    }
    local_clock.advance(milliseconds(50));
    EXPECT_EQ(host->waiting(kA), register_again ? 2U : 1U);
    host->release(kA, true);
    EXPECT_FALSE(host->held(kA));
    const auto written = reap_all(*writer);
    ASSERT_EQ(written.size(), 1U);
    EXPECT_EQ(written[0].outcome, register_again ? Outcome::kGood : Outcome::kReservationConflict);
    EXPECT_EQ(local.block(id, 7).has_value(), register_again);
    if (register_again) {
      EXPECT_EQ(reap_all(*daemon).size(), 1U);
      const SimHistory& history = local.history();
      ASSERT_EQ(history.prouts.size(), 3U);
      ASSERT_EQ(history.writes.size(), 1U);
      EXPECT_LT(history.prouts.back().sequence, history.writes[0].sequence)
          << "the REGISTER queued later went out first";
    }
  }
}

// A recovery that ends in a torn-down session fails what waits, unsent. A command whose deadline
// passes while it waits is reported indeterminate and may still run, and runs when the path comes
// back, even once its transport is gone: the kernel sends it anyway.
TEST_F(SimTransportTest, WhatWaitsInRecoveryFailsUnsentOrRunsLate) {
  const auto host = std::make_shared<SimHostQueues>();
  auto writer = make({.host_queues = host, .queue_at_head = false});
  auto daemon = make({.host_queues = host, .queue_at_head = true});
  const PathId sd = open(*writer, "/dev/sg1");
  const PathId sg = open(*daemon, "/dev/sg1");

  host->hold(kA);
  ASSERT_TRUE(writer->submit(sd, tagged(write_command(1, 0x11), 1, kLong)).has_value());
  clock.advance(milliseconds(10));
  host->release(kA, false);
  const auto failed = reap_all(*writer);
  ASSERT_EQ(failed.size(), 1U);
  EXPECT_EQ(failed[0].outcome, Outcome::kTransportError);
  EXPECT_EQ(failed[0].host_status, 0x0f) << "DID_TRANSPORT_FAILFAST";
  EXPECT_EQ(writer->unreturned(), std::optional<std::size_t>(0));

  host->hold(kA);
  const Completion late = run_one(*writer, sd, tagged(write_command(2, 0x22), 2));
  EXPECT_EQ(late.outcome, Outcome::kIndeterminate);
  EXPECT_EQ(writer->unreturned(), std::optional<std::size_t>(1)) << "it waits, and may still run";
  ASSERT_TRUE(
      daemon->submit(sg, tagged(prout_command(codec::prout_register_and_ignore(kKeyA)), 3, kLong))
          .has_value());
  daemon.reset();
  host->release(kA, true);
  clock.advance(milliseconds(1000));
  EXPECT_EQ(writer->unreturned(), std::optional<std::size_t>(0)) << "it ran";
  EXPECT_TRUE(target.block(lu, 2).has_value());
  EXPECT_FALSE(target.block(lu, 1).has_value());
  EXPECT_EQ(target.registrations(lu).size(), 1U) << "the REGISTER of a transport gone went out";
}

// PREEMPT AND ABORT against a writer whose WRITE the target holds: the write completes TASK
// ABORTED and never lands. With plain PREEMPT it lands after the preempt: an S1 violation.
TEST_F(SimTransportTest, PreemptAndAbortAbortsAHeldWriteWherePreemptLetsItLand) {
  for (const bool abort : {true, false}) {
    SCOPED_TRACE(abort ? "PREEMPT AND ABORT" : "PREEMPT");
    SimClock local_clock;
    SimTarget local(local_clock);
    const LuId id = local.add_lu();
    local.add_path("/dev/sg1", id, kA);
    local.add_path("/dev/sg2", id, kB);
    SimTransportOptions writer_options;
    writer_options.fault = [](const FaultContext& context) {
      Fault fault;
      if (is_write(context)) {
        fault.execute_delay = milliseconds(40);
      }
      return fault;
    };
    auto writer = SimTransport::make(local, writer_options).value();
    auto fencer = SimTransport::make(local).value();
    const PathId a = writer->open_path("/dev/sg1").value();
    const PathId b = fencer->open_path("/dev/sg2").value();
    ASSERT_EQ(run_one(*writer, a, tagged(prout_command(codec::prout_register_and_ignore(kKeyA)), 1))
                  .outcome,
              Outcome::kGood);
    ASSERT_EQ(run_one(*writer, a,
                      tagged(prout_command(codec::prout_reserve(
                                 kKeyA, PrType::kWriteExclusiveRegistrantsOnly)),
                             2))
                  .outcome,
              Outcome::kGood);
    ASSERT_EQ(run_one(*fencer, b, tagged(prout_command(codec::prout_register_and_ignore(kKeyB)), 3))
                  .outcome,
              Outcome::kGood);
    ASSERT_TRUE(writer->submit(a, tagged(write_command(7, 0xee), 4)).has_value());
    local_clock.advance(milliseconds(5));  // the write is held in the target now
    ASSERT_EQ(local.held_count(id), 1U);
    const codec::PrOutCommand fence =
        abort ? codec::prout_preempt_and_abort(kKeyB, kKeyA, PrType::kWriteExclusiveRegistrantsOnly)
              : codec::prout_preempt(kKeyB, kKeyA, PrType::kWriteExclusiveRegistrantsOnly);
    EXPECT_EQ(run_one(*fencer, b, tagged(prout_command(fence), 5)).outcome, Outcome::kGood);
    const auto written = reap_all(*writer);
    ASSERT_EQ(written.size(), 1U);
    EXPECT_EQ(written[0].outcome, abort ? Outcome::kTaskAborted : Outcome::kGood);
    EXPECT_EQ(local.block(id, 7).has_value(), !abort);
    EXPECT_EQ(s1_violations(local.history()).size(), abort ? 0U : 1U);
    // The record shows the write held across the preempt: accepted before it, ended after it.
    const SimHistory& history = local.history();
    ASSERT_EQ(history.writes.size(), 1U);
    EXPECT_LE(history.writes[0].accepted_sequence, history.prouts.back().sequence);
    EXPECT_GT(history.writes[0].sequence, history.prouts.back().sequence);
  }
}

}  // namespace
}  // namespace blkfence::transport::test
