// What one simulated run leaves behind for the checker (tests/sim): every command each node's
// daemon put on the wire and what it reaped, the driver's calls, the observer's gates and events,
// the writers' stamped writes, and the target's own history of PR OUTs and writes.
//
// Everything carries one global sequence number, taken when it happened, so that the checker can
// order a node's submissions, completions and events exactly even when they share a simulated
// instant. The target's records carry their own sequence (SimTarget::history()), which orders PR
// OUTs against writes on the target. Plain data; single-threaded like the simulation.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "blkfence/error.h"
#include "blkfence/fence/resource.h"
#include "blkfence/testing/sim_target.h"
#include "blkfence/transport/transport.h"

namespace blkfence::sim {

using Time = std::chrono::nanoseconds;

inline constexpr std::uint8_t kPrIn = 0x5e;
inline constexpr std::uint8_t kPrOut = 0x5f;

// One command a node's daemon submitted through its recording transport, and its completion as
// the daemon reaped it.
struct Command {
  std::uint16_t node = 0;
  std::uint32_t boot = 0;  // which run of the node's daemon (restarts count up)
  transport::LuId lu = 0;
  transport::NexusId nexus = 0;
  std::uint8_t opcode = 0;
  std::uint8_t action = 0;  // PR IN or PR OUT service action
  std::uint8_t type = 0;    // PR OUT TYPE
  std::uint64_t key = 0;    // PR OUT RESERVATION KEY
  std::uint64_t sa_key = 0;
  Time submitted{0};
  std::uint64_t submitted_seq = 0;
  bool completed = false;
  Time completed_at{0};
  std::uint64_t completed_seq = 0;
  // How it completed, as the transport reported it (a timeout, an OS error, or a SCSI status), and
  // the raw answer: the SAM status byte, the sense data and the data received. The checker reads
  // these itself (sense keys, PR IN parameter data) rather than trusting the codec under test.
  transport::Outcome outcome = transport::Outcome::kOsError;
  std::uint8_t status = 0;
  std::vector<std::uint8_t> sense;
  std::vector<std::uint8_t> data_in;
  // The CDB and the parameter data as sent: two submissions with the same bytes on the same nexus
  // are the same command (the engine resubmitting one that did not execute).
  std::string bytes;
  // The engine's request this command is an attempt of (pr::request_of_tag of its tag), unique
  // within one boot of the node: a resubmission, or a read sent on the next path, has the same one
  // as the first attempt, while a new request with the same bytes has its own.
  std::uint64_t request = 0;

  bool is_prout() const { return opcode == kPrOut; }
  bool is_prin() const { return opcode == kPrIn; }
  bool is(codec::PrOutAction a) const {
    return is_prout() && action == static_cast<std::uint8_t>(a);
  }
  // REGISTER or REGISTER AND IGNORE EXISTING KEY that puts a key in place (not an unregister).
  bool registers() const {
    return (is(codec::PrOutAction::kRegister) ||
            is(codec::PrOutAction::kRegisterAndIgnoreExistingKey)) &&
           sa_key != 0;
  }
};

// A LU as the target had it at one moment (read directly, no command involved).
struct LuState {
  std::optional<std::uint64_t> holder;
  std::vector<transport::SimRegistration> registrations;
};

enum class EntryKind : std::uint8_t {
  kBoot,   // the daemon was created and start() called
  kCrash,  // the daemon was destroyed (its commands in flight carry on)
  kPause,  // the daemon stops processing (detail says whether the writer froze too)
  kResume,
  kLink,           // the node's links to some LUs changed (detail)
  kAcquireCalled,  // the driver called acquire(), or unfence() in shared mode, or promote() in
                   // primary mode (detail says which), and it was not refused as busy
  kReleaseCalled,
  kOpDone,   // an acquire/release finished (ok, code, detail)
  kRefused,  // the driver asked for an operation while another ran: refused (kBusy)
  kGate,     // the observer's on_gate (open, verified_since, key, and the target at that moment)
  kEvent,    // the observer's on_event
  kQuiet,    // the scenario ended: faults and pauses off, links up
  kBusy,     // the resource's operation began (open) or ended: its reads may not be the monitor's
  kPaths,    // the driver told the resource of its LU's current paths (detail)
  kFenceCalled,   // shared mode: the driver called fence_node() (detail names the victim)
  kCancelCalled,  // the driver called cancel() while the acquire or promote it asked for ran
  kPowerCycle,    // the target: a LU lost power and came back (detail: whether its PR state stayed)
};

struct Entry {
  std::uint64_t seq = 0;
  Time at{0};
  std::uint16_t node = 0;
  EntryKind kind = EntryKind::kBoot;
  bool open = false;     // kGate
  bool holds = false;    // kGate, primary mode: opened as the primary (state held), not as a member
  bool rekeyed = false;  // kGate: the key changed with the gate open (no on_gate; node.cc)
  bool ok = false;       // kOpDone
  ErrorCode code = ErrorCode::kInvalidArgument;
  Time verified_since{0};
  std::optional<std::uint64_t> key;  // the resource's key when it happened
  std::optional<std::uint64_t> other_key;
  fence::EventKind event = fence::EventKind::kStateKnown;
  std::vector<LuState> target;  // kGate with open: every LU at that moment
  std::string detail;
};

// One write a node's writer issued while its gate was open: the LBA is the write's id, and the
// block holds the node id, the epoch of the writer's token and the id.
struct WriteIssue {
  std::uint64_t id = 0;
  std::uint16_t node = 0;
  std::uint64_t key = 0;  // the token the writer held
  transport::LuId lu = 0;
  transport::NexusId nexus = 0;
  Time issued{0};
  std::uint32_t epoch() const { return static_cast<std::uint32_t>(key); }
};

struct NodeEnd {
  std::uint16_t node = 0;
  bool alive = false;
  bool gate_open = false;
  std::optional<std::uint64_t> key;
  std::string state;
};

struct Run {
  std::uint64_t seed = 0;
  std::uint16_t cluster_id = 0;
  std::size_t lus = 0;
  bool preempt_abort = false;
  // S1 judged as docs/protocol.md states it in plain PREEMPT runs too: a write held in the task set
  // across the preempt is a violation, not the documented weakness of plain PREEMPT.
  bool strict_s1 = false;
  bool strict_epochs = false;  // also check that fresh acquisitions of all nodes increase
  fence::Mode mode = fence::Mode::kExclusive;  // every node's (shared: unfence and fence_node)
  bool primary = false;  // shared mode with ResourceOptions::primary: unfence joins, promote holds
  Time check_interval{0};
  Time lease{0};
  Time command_timeout{0};
  // Exclusive mode: fence::stray_bound() of the run's configuration; zero: R1 is not judged.
  Time stray_bound{0};
  Time end{0};
  std::map<transport::NexusId, std::uint16_t> node_of_nexus;
  std::vector<Command> commands;
  std::vector<Entry> trace;
  std::map<std::uint64_t, WriteIssue> writes;  // by id (= LBA)
  const transport::SimHistory* target = nullptr;
  std::vector<LuState> final_lus;
  std::vector<NodeEnd> final_nodes;
  std::vector<std::string> notes;  // not violations: printed with --verbose, counted
};

}  // namespace blkfence::sim
