// A simulated SPC-4 target that answers as LIO does (transport layer, tests and simulation).
//
// SimTarget holds any number of logical units, each with persistent reservation state
// (registrations per I_T nexus, the reservation, PRgeneration), unit attentions per nexus and a
// small block store, and executes CDBs against them following LIO's target_core_pr.c,
// target_core_ua.c and __target_execute_cmd() as docs/reference/lio.md describes them,
// LIO's deviations from SPC-4 included (NOT READY 08/00 from an unregistered RESERVE, RELEASE or
// CLEAR; no PRgeneration bump on unregister; one unit attention reported and all cleared;
// writes told from reads by data direction; PREEMPT AND ABORT selecting victims by the holder's
// key as it was when each command passed its checks). A nexus is an integer the test assigns; a
// node with several paths to a LU owns several nexuses. Device names map to (LU, nexus) for
// SimTransport, which carries commands here with latency and faults.
//
// Commands pass their checks (CDB, UNIT ATTENTION, RESERVATION CONFLICT) when they reach the
// target and take effect at once, or, when the caller asks to hold them, later on the clock:
// PREEMPT AND ABORT aborts held commands (TASK ABORTED) and plain PREEMPT lets them land, which
// is the hazard of S1 (docs/protocol.md). history() records every write and every PERSISTENT
// RESERVE OUT with its effect and time, for checking S1 afterwards.
//
// Not thread-safe: a simulation runs on one thread. The target keeps a reference to its clock,
// which must outlive it; answer callbacks of held commands are owned here until they run.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "blkfence/codec/cdb.h"
#include "blkfence/codec/transport_id.h"
#include "blkfence/testing/sim_clock.h"
#include "blkfence/transport/transport.h"

namespace blkfence::transport {

using LuId = std::uint32_t;
using NexusId = std::uint32_t;

// What the target sent back for one command.
struct SimAnswer {
  std::uint8_t status = 0;            // SAM status byte
  std::vector<std::uint8_t> sense;    // fixed format (70h), with CHECK CONDITION only
  std::vector<std::uint8_t> data_in;  // at most the allocation length and the caller's buffer
};

// SPC-4 table D.1 codes this target establishes or is told to establish.
struct UnitAttention {
  std::uint8_t asc = 0;
  std::uint8_t ascq = 0;

  friend bool operator==(const UnitAttention&, const UnitAttention&) = default;
};
inline constexpr UnitAttention kUaPowerOnOrReset{0x29, 0x00};
inline constexpr UnitAttention kUaItNexusLoss{0x29, 0x07};
inline constexpr UnitAttention kUaReservationsPreempted{0x2a, 0x03};
inline constexpr UnitAttention kUaReservationsReleased{0x2a, 0x04};
inline constexpr UnitAttention kUaRegistrationsPreempted{0x2a, 0x05};

// What the target answered: the status and, with CHECK CONDITION, the sense key and ASC/ASCQ.
struct SimOutcome {
  std::uint8_t status = 0;
  std::uint8_t sense_key = 0;
  std::uint8_t asc = 0;
  std::uint8_t ascq = 0;

  friend bool operator==(const SimOutcome&, const SimOutcome&) = default;
};

struct SimRegistration {
  NexusId nexus = 0;
  std::uint64_t key = 0;
  bool all_tg_pt = false;

  friend bool operator==(const SimRegistration&, const SimRegistration&) = default;
};

struct SimReservation {
  // The registration LIO keeps as dev_pr_res_holder: the reserving nexus, or under an
  // all-registrants type the one LIO picked (every registrant holds it, SPC-4 5.13.10).
  NexusId holder = 0;
  std::uint64_t key = 0;  // the holder's key (READ RESERVATION says 0 under an AR type)
  codec::PrType type{};

  friend bool operator==(const SimReservation&, const SimReservation&) = default;
};

// One WRITE(10)/WRITE(16): refused by its checks, landed, or aborted while held.
struct WriteRecord {
  std::uint64_t sequence = 0;  // the order the target recorded it in, across writes and PR OUTs
  SimTime at{0};               // when it was refused, landed, or aborted
  SimTime accepted_at{0};      // when it passed its checks (== at unless it was held)
  LuId lu = 0;
  NexusId nexus = 0;
  std::uint64_t lba = 0;
  std::uint32_t blocks = 0;
  bool landed = false;  // the data is in the block store
  SimOutcome outcome;
  // The sequence the target's next record took when the write passed its checks: every record
  // numbered below it came before the acceptance (== sequence unless it was held). A write held
  // across a PR OUT has accepted_sequence <= that PR OUT's sequence < its own.
  std::uint64_t accepted_sequence = 0;

  friend bool operator==(const WriteRecord&, const WriteRecord&) = default;
};

// One PERSISTENT RESERVE OUT that reached the target, whatever it answered.
struct PrOutRecord {
  std::uint64_t sequence = 0;
  SimTime at{0};
  LuId lu = 0;
  NexusId nexus = 0;
  std::uint8_t service_action = 0;  // codec::PrOutAction, or the unknown code as sent
  std::uint8_t type = 0;            // CDB TYPE as sent
  std::uint64_t key = 0;            // RESERVATION KEY (0 when the list was too short to hold it)
  std::uint64_t sa_key = 0;         // SERVICE ACTION RESERVATION KEY
  SimOutcome outcome;
  std::vector<NexusId> unregistered;          // nexuses whose registration this command removed
  std::uint32_t generation = 0;               // PRgeneration afterwards
  std::optional<SimReservation> reservation;  // afterwards

  friend bool operator==(const PrOutRecord&, const PrOutRecord&) = default;
};

// PrOutRecord::service_action of a power cycle that took the PR state away (PR OUT service actions
// are 5 bits, so no command has it): unregistered lists every nexus, reservation is none.
inline constexpr std::uint8_t kPowerCycleRecord = 0xff;

struct SimHistory {
  std::vector<WriteRecord> writes;
  std::vector<PrOutRecord> prouts;

  friend bool operator==(const SimHistory&, const SimHistory&) = default;
};

struct LuConfig {
  std::string serial;                  // VPD 0x80; empty: "sim-lu-<id>"
  std::array<std::uint8_t, 16> naa{};  // VPD 0x83 NAA 6h designator; all zero: 6001405 + the id
  std::string product = "SIM";         // standard INQUIRY PRODUCT IDENTIFICATION
  std::uint32_t block_size = 512;
  std::uint64_t block_count = 2048;
  // False stands for LIO without <db_root>/pr (docs/design.md §7): REGISTER and unregister answer
  // NOT READY 08/00 although they took effect (docs/reference/lio.md §2).
  bool aptpl_file_writable = true;
  // REPORT CAPABILITIES says PTPL_C (LIO always does); without it a REGISTER with APTPL=1 is
  // refused, ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST (SPC-4 6.16.2).
  bool ptpl_capable = true;
};

// Where a device name leads.
struct SimPath {
  LuId lu = 0;
  NexusId nexus = 0;
};

class SimTarget {
 public:
  // Every nexus is an initiator port with SAS address kInitiatorSasBase + nexus, logged in
  // through the one target port, kRelativeTargetPortId (READ FULL STATUS, REGISTER AND MOVE).
  static constexpr std::uint64_t kInitiatorSasBase = 0x5001405f00000000ULL;
  static constexpr std::uint16_t kRelativeTargetPortId = 1;
  static codec::TransportId initiator_port(NexusId nexus) {
    return codec::sas_transport_id(kInitiatorSasBase + nexus);
  }

  using AnswerFn = std::function<void(SimAnswer)>;

  explicit SimTarget(SimClock& clock);
  ~SimTarget();
  SimTarget(const SimTarget&) = delete;
  SimTarget& operator=(const SimTarget&) = delete;

  SimClock& clock() const;

  LuId add_lu(LuConfig config = {});
  std::size_t lu_count() const;
  // Maps a device name (e.g. "/dev/sg3") to a nexus of a LU; each name once.
  void add_path(const std::string& device, LuId lu, NexusId nexus);
  // The name reaches another LU from now on, as a /dev/sgN name does once its device went away and
  // a new device took its minor; paths opened before keep the LU they were opened on.
  void move_path(const std::string& device, LuId lu, NexusId nexus);
  std::optional<SimPath> find_path(const std::string& device) const;

  // Executes a command now, as it reaches the LU through nexus.
  SimAnswer execute(LuId lu, NexusId nexus, const Command& command);
  // Runs the command's checks now. One that passes takes effect after hold (at once when zero);
  // until then it is held in the LU's task set. answer runs exactly once, possibly before submit()
  // returns: with the command's answer, or with TASK ABORTED when a PREEMPT AND ABORT aborted it.
  void submit(LuId lu, NexusId nexus, Command command, std::chrono::nanoseconds hold,
              AnswerFn answer);

  // Establishes a unit attention as LIO does (target_core_ua.c: core_scsi3_ua_allocate()).
  void add_unit_attention(LuId lu, NexusId nexus, UnitAttention ua);
  // The nexus's session dropped and came back: 29/07 on every LU (core_allocate_nexus_loss_ua).
  void nexus_loss(NexusId nexus);
  // The LU loses power and comes back at once. Its held commands end with TASK ABORTED and never
  // take effect; its pending unit attentions are replaced by 29/00 for every nexus it knows. The
  // registrations and the reservation survive only where APTPL is active (LIO reloads them from
  // <db_root>/pr, SPC-4 5.13.5); otherwise they are gone and PRgeneration is 0 again, recorded in
  // history() as a kPowerCycleRecord. Returns whether they survived.
  bool power_cycle(LuId lu);

  // State, read without going through commands (no unit attention is consumed).
  std::vector<SimRegistration> registrations(LuId lu) const;
  std::optional<SimReservation> reservation(LuId lu) const;
  std::uint32_t generation(LuId lu) const;
  std::vector<UnitAttention> unit_attentions(LuId lu, NexusId nexus) const;
  std::size_t held_count(LuId lu) const;
  // Those held from one nexus.
  std::size_t held_count(LuId lu, NexusId nexus) const;
  // The last REGISTER (or REGISTER AND MOVE) set APTPL and the APTPL file was written.
  bool aptpl_active(LuId lu) const;
  void set_ptpl_capable(LuId lu, bool capable);
  // The block as last written, nullopt if never written.
  std::optional<std::vector<std::uint8_t>> block(LuId lu, std::uint64_t lba) const;
  const SimHistory& history() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace blkfence::transport
