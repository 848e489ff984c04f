// Proves that SimTarget answers as LIO does (docs/reference/lio.md), through CDBs built by
// the codec's encoders and answers read by its decoders: REGISTER against REGISTER AND IGNORE
// EXISTING KEY, key changes and unregistering (the holder's implicit release, per type); RESERVE by
// the holder, a non-holder and an unregistered nexus (LIO's NOT READY 08/00); RELEASE by a
// non-holder (a GOOD no-op) and with the wrong TYPE (conflict); CLEAR with its 2A/03 unit
// attentions; every PREEMPT case of spc4-pr.md §4, with 2A/05 and 2A/04 where LIO sets them;
// PRgeneration after each step as LIO counts it (no bump on unregister); which nexus may write
// and read under each of the six types; a unit attention reported once, the highest first, all
// cleared, and the command that got it not executed; the PR IN layouts and LIO's truncation
// quirks; INQUIRY VPD pages; REGISTER AND MOVE; and held commands: PREEMPT AND ABORT aborts those
// whose holder-key snapshot matches, plain PREEMPT lets them land after it (the S1 hazard).
// Time is simulated: nothing sleeps.
#include "blkfence/testing/sim_target.h"

#include <gtest/gtest.h>

#include "blkfence/codec/sense.h"
#include "blkfence/testing/sim_commands.h"

namespace blkfence::transport::test {
namespace {

using codec::PrInAction;
using codec::PrType;
using codec::SenseKey;
using std::chrono::milliseconds;

constexpr std::uint64_t kKeyA = 0x4c494f0000000001ULL;
constexpr std::uint64_t kKeyB = 0x4c494f0000000002ULL;
constexpr std::uint64_t kKeyC = 0x4c494f0000000003ULL;
constexpr std::uint64_t kKeyD = 0x4c494f0000000004ULL;

// Node A has two paths (multipath), B and C one each; the stranger never registers; the observer
// only reads state (unit attentions go to registrants, so it never has one pending).
constexpr NexusId kA1 = 1;
constexpr NexusId kA2 = 2;
constexpr NexusId kB = 3;
constexpr NexusId kC = 4;
constexpr NexusId kStranger = 8;
constexpr NexusId kObserver = 9;

constexpr std::uint8_t kGood = 0x00;
constexpr std::uint8_t kCheckCondition = 0x02;
constexpr std::uint8_t kReservationConflict = 0x18;
constexpr std::uint8_t kTaskAborted = 0x40;

constexpr PrType kAllTypes[] = {
    PrType::kWriteExclusive,
    PrType::kExclusiveAccess,
    PrType::kWriteExclusiveRegistrantsOnly,
    PrType::kExclusiveAccessRegistrantsOnly,
    PrType::kWriteExclusiveAllRegistrants,
    PrType::kExclusiveAccessAllRegistrants,
};

::testing::AssertionResult is_good(const SimAnswer& answer) {
  if (answer.status == kGood) {
    return ::testing::AssertionSuccess();
  }
  const codec::Sense sense = codec::decode_sense(answer.sense);
  return ::testing::AssertionFailure()
         << "status 0x" << std::hex << int{answer.status} << ", sense key 0x"
         << int{static_cast<std::uint8_t>(sense.sense_key)} << " " << int{sense.asc} << "/"
         << int{sense.ascq};
}

::testing::AssertionResult is_conflict(const SimAnswer& answer) {
  if (answer.status == kReservationConflict && answer.sense.empty()) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "status 0x" << std::hex << int{answer.status};
}

// CHECK CONDITION with fixed-format sense of this key and ASC/ASCQ.
::testing::AssertionResult is_sense(const SimAnswer& answer, SenseKey key, std::uint8_t asc,
                                    std::uint8_t ascq) {
  const codec::Sense sense = codec::decode_sense(answer.sense);
  if (answer.status == kCheckCondition && sense.format == codec::SenseFormat::kFixed &&
      !sense.truncated && sense.sense_key == key && sense.asc == asc && sense.ascq == ascq) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "status 0x" << std::hex << int{answer.status} << ", sense key 0x"
         << int{static_cast<std::uint8_t>(sense.sense_key)} << " " << int{sense.asc} << "/"
         << int{sense.ascq};
}

::testing::AssertionResult is_unit_attention(const SimAnswer& answer, UnitAttention ua) {
  return is_sense(answer, SenseKey::kUnitAttention, ua.asc, ua.ascq);
}

class SimTargetTest : public ::testing::Test {
 protected:
  SimAnswer run(NexusId nexus, const Command& command) {
    return target.execute(lu, nexus, command);
  }
  SimAnswer prout(NexusId nexus, const codec::PrOutCommand& command) {
    return run(nexus, prout_command(command));
  }
  SimAnswer register_key(NexusId nexus, std::uint64_t key) {
    return prout(nexus, codec::prout_register_and_ignore(key));
  }
  SimAnswer reserve(NexusId nexus, std::uint64_t key, PrType type) {
    return prout(nexus, codec::prout_reserve(key, type));
  }

  codec::ReadKeys read_keys(NexusId nexus = kObserver) {
    const SimAnswer answer = run(nexus, prin_command(PrInAction::kReadKeys));
    EXPECT_TRUE(is_good(answer));
    auto keys = codec::decode_read_keys(answer.data_in);
    EXPECT_TRUE(keys.has_value());
    return keys.value_or(codec::ReadKeys{});
  }
  std::optional<codec::Reservation> read_reservation(NexusId nexus = kObserver) {
    const SimAnswer answer = run(nexus, prin_command(PrInAction::kReadReservation));
    EXPECT_TRUE(is_good(answer));
    auto reservation = codec::decode_read_reservation(answer.data_in);
    EXPECT_TRUE(reservation.has_value() && !reservation->truncated);
    return reservation ? reservation->reservation : std::nullopt;
  }
  std::uint32_t generation() { return read_keys().generation; }
  std::vector<std::uint64_t> keys() { return read_keys().keys; }

  // A holds the reservation of type through kA1; A2 is A's second path; B and C are registered.
  void set_up_holder(PrType type) {
    ASSERT_TRUE(is_good(register_key(kA1, kKeyA)));
    ASSERT_TRUE(is_good(register_key(kA2, kKeyA)));
    ASSERT_TRUE(is_good(register_key(kB, kKeyB)));
    ASSERT_TRUE(is_good(register_key(kC, kKeyC)));
    ASSERT_TRUE(is_good(reserve(kA1, kKeyA, type)));
  }

  SimClock clock;
  SimTarget target{clock};
  LuId lu = target.add_lu();
};

// --- REGISTER and REGISTER AND IGNORE EXISTING KEY (spc4-pr.md §3.3) ---

TEST_F(SimTargetTest, RegisterFromAnUnregisteredNexusNeedsKeyZero) {
  EXPECT_TRUE(is_conflict(prout(kA1, codec::prout_register(kKeyB, kKeyA))));
  EXPECT_TRUE(keys().empty());
  EXPECT_EQ(generation(), 0U);
  // SA key 0 from an unregistered nexus: GOOD and nothing, not even a PRgeneration bump.
  EXPECT_TRUE(is_good(prout(kA1, codec::prout_register(0, 0))));
  EXPECT_TRUE(is_good(prout(kA1, codec::prout_register_and_ignore(0))));
  EXPECT_EQ(generation(), 0U);
  EXPECT_TRUE(is_good(prout(kA1, codec::prout_register(0, kKeyA))));
  EXPECT_EQ(keys(), std::vector<std::uint64_t>{kKeyA});
  EXPECT_EQ(generation(), 1U);
}

TEST_F(SimTargetTest, RegisterChangesAKeyOnlyWhenGivenTheCurrentOne) {
  ASSERT_TRUE(is_good(prout(kA1, codec::prout_register(0, kKeyA))));
  EXPECT_TRUE(is_conflict(prout(kA1, codec::prout_register(kKeyC, kKeyB))));
  EXPECT_TRUE(is_conflict(prout(kA1, codec::prout_register(0, kKeyB))));
  EXPECT_EQ(keys(), std::vector<std::uint64_t>{kKeyA});
  EXPECT_EQ(generation(), 1U);
  EXPECT_TRUE(is_good(prout(kA1, codec::prout_register(kKeyA, kKeyB))));
  EXPECT_EQ(keys(), std::vector<std::uint64_t>{kKeyB});
  EXPECT_EQ(generation(), 2U);
}

TEST_F(SimTargetTest, RegisterAndIgnoreReplacesWhateverIsRegistered) {
  ASSERT_TRUE(is_good(register_key(kA1, kKeyA)));
  // REGISTER would need kKeyA here; REGISTER AND IGNORE EXISTING KEY does not.
  EXPECT_TRUE(is_good(register_key(kA1, kKeyB)));
  EXPECT_EQ(keys(), std::vector<std::uint64_t>{kKeyB});
  EXPECT_EQ(generation(), 2U);
  // Idempotent in effect; LIO still bumps PRgeneration for the "change" to the same key.
  EXPECT_TRUE(is_good(register_key(kA1, kKeyB)));
  EXPECT_EQ(keys(), std::vector<std::uint64_t>{kKeyB});
  EXPECT_EQ(generation(), 3U);
}

TEST_F(SimTargetTest, UnregisteringDoesNotBumpPrGenerationAsInLio) {
  ASSERT_TRUE(is_good(prout(kA1, codec::prout_register(0, kKeyA))));
  ASSERT_TRUE(is_good(register_key(kB, kKeyB)));
  ASSERT_EQ(generation(), 2U);
  EXPECT_TRUE(is_good(prout(kA1, codec::prout_register(kKeyA, 0))));
  EXPECT_TRUE(is_good(register_key(kB, 0)));
  EXPECT_TRUE(keys().empty());
  EXPECT_EQ(generation(), 2U);  // SPC-4 would say 4
  ASSERT_EQ(target.history().prouts.size(), 4U);
  EXPECT_EQ(target.history().prouts[2].unregistered, std::vector<NexusId>{kA1});
  EXPECT_EQ(target.history().prouts[3].unregistered, std::vector<NexusId>{kB});
}

TEST_F(SimTargetTest, EachPathOfANodeIsItsOwnRegistration) {
  ASSERT_TRUE(is_good(register_key(kA1, kKeyA)));
  ASSERT_TRUE(is_good(register_key(kA2, kKeyA)));
  ASSERT_TRUE(is_good(register_key(kB, kKeyB)));
  EXPECT_EQ(keys(), (std::vector<std::uint64_t>{kKeyA, kKeyA, kKeyB}));
  EXPECT_EQ(generation(), 3U);
}

// The holder's unregister releases the reservation (lio.md §5): RO types tell the remaining
// registrants (2A/04), WE/EA types tell nobody, and an AR reservation stays with the first
// remaining registration.
TEST_F(SimTargetTest, UnregisteringTheHolderReleasesPerType) {
  for (const PrType type : kAllTypes) {
    SCOPED_TRACE(codec::to_string(type));
    SimClock local_clock;
    SimTarget local(local_clock);
    const LuId id = local.add_lu();
    const std::pair<NexusId, std::uint64_t> registrants[] = {
        {kA1, kKeyA}, {kB, kKeyB}, {kC, kKeyC}};
    for (const auto& [nexus, key] : registrants) {
      ASSERT_TRUE(
          is_good(local.execute(id, nexus, prout_command(codec::prout_register_and_ignore(key)))));
    }
    ASSERT_TRUE(is_good(local.execute(id, kA1, prout_command(codec::prout_reserve(kKeyA, type)))));
    ASSERT_TRUE(is_good(local.execute(id, kA1, prout_command(codec::prout_register(kKeyA, 0)))));
    const bool all_registrants = codec::is_all_registrants(type);
    const bool registrants_only = type == PrType::kWriteExclusiveRegistrantsOnly ||
                                  type == PrType::kExclusiveAccessRegistrantsOnly;
    if (all_registrants) {
      EXPECT_EQ(local.reservation(id), (SimReservation{kB, kKeyB, type}));
    } else {
      EXPECT_EQ(local.reservation(id), std::nullopt);
    }
    const std::vector<UnitAttention> expected =
        registrants_only ? std::vector<UnitAttention>{kUaReservationsReleased}
                         : std::vector<UnitAttention>{};
    EXPECT_EQ(local.unit_attentions(id, kB), expected);
    EXPECT_EQ(local.unit_attentions(id, kC), expected);
    EXPECT_TRUE(local.unit_attentions(id, kA1).empty());
  }
}

// --- RESERVE (spc4-pr.md §3.3, lio.md §1) ---

TEST_F(SimTargetTest, ReserveFromAnUnregisteredNexusIsLiosNotReady0800) {
  EXPECT_TRUE(is_sense(reserve(kStranger, 0, PrType::kWriteExclusiveRegistrantsOnly),
                       SenseKey::kNotReady, 0x08, 0x00));
  EXPECT_EQ(read_reservation(), std::nullopt);
  // Once a reservation exists, the non-holder check answers first: RESERVATION CONFLICT.
  ASSERT_TRUE(is_good(register_key(kA1, kKeyA)));
  ASSERT_TRUE(is_good(reserve(kA1, kKeyA, PrType::kWriteExclusiveRegistrantsOnly)));
  EXPECT_TRUE(is_conflict(reserve(kStranger, 0, PrType::kWriteExclusiveRegistrantsOnly)));
}

TEST_F(SimTargetTest, ReserveByTheHolderAgainIsGoodButNotWithAnotherType) {
  ASSERT_TRUE(is_good(register_key(kA1, kKeyA)));
  ASSERT_TRUE(is_good(reserve(kA1, kKeyA, PrType::kWriteExclusiveRegistrantsOnly)));
  EXPECT_TRUE(is_good(reserve(kA1, kKeyA, PrType::kWriteExclusiveRegistrantsOnly)));
  EXPECT_TRUE(is_conflict(reserve(kA1, kKeyA, PrType::kExclusiveAccess)));
  EXPECT_TRUE(is_conflict(reserve(kA1, kKeyB, PrType::kWriteExclusiveRegistrantsOnly)));
  const auto reservation = read_reservation();
  ASSERT_TRUE(reservation.has_value());
  EXPECT_EQ(reservation->key, kKeyA);
  EXPECT_EQ(reservation->type, PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_EQ(generation(), 1U);  // RESERVE never bumps it
}

TEST_F(SimTargetTest, ReserveByANonHolderConflictsExceptTheSameAllRegistrantsType) {
  ASSERT_TRUE(is_good(register_key(kA1, kKeyA)));
  ASSERT_TRUE(is_good(register_key(kB, kKeyB)));
  ASSERT_TRUE(is_good(reserve(kA1, kKeyA, PrType::kWriteExclusiveRegistrantsOnly)));
  EXPECT_TRUE(is_conflict(reserve(kB, kKeyB, PrType::kWriteExclusiveRegistrantsOnly)));
  ASSERT_TRUE(
      is_good(prout(kA1, codec::prout_release(kKeyA, PrType::kWriteExclusiveRegistrantsOnly))));
  EXPECT_TRUE(is_unit_attention(run(kB, test_unit_ready_command()), kUaReservationsReleased));
  ASSERT_TRUE(is_good(reserve(kA1, kKeyA, PrType::kWriteExclusiveAllRegistrants)));
  EXPECT_TRUE(is_good(reserve(kB, kKeyB, PrType::kWriteExclusiveAllRegistrants)));
  EXPECT_TRUE(is_conflict(reserve(kB, kKeyB, PrType::kWriteExclusiveRegistrantsOnly)));
  EXPECT_EQ(target.reservation(lu)->holder, kA1);
}

TEST_F(SimTargetTest, ReserveWithAnInvalidTypeOrScopeIsIllegalRequest) {
  ASSERT_TRUE(is_good(register_key(kA1, kKeyA)));
  codec::PrOutCommand bad_type = codec::prout_reserve(kKeyA, PrType::kWriteExclusive);
  bad_type.cdb[2] = 0x02;  // obsolete
  EXPECT_TRUE(is_sense(prout(kA1, bad_type), SenseKey::kIllegalRequest, 0x24, 0x00));
  codec::PrOutCommand bad_scope = codec::prout_reserve(kKeyA, PrType::kWriteExclusive);
  bad_scope.cdb[2] |= 0x10;
  EXPECT_TRUE(is_sense(prout(kA1, bad_scope), SenseKey::kIllegalRequest, 0x26, 0x00));
  EXPECT_EQ(read_reservation(), std::nullopt);
}

// --- RELEASE ---

TEST_F(SimTargetTest, ReleaseByARegisteredNonHolderIsAGoodNoOp) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_TRUE(
      is_good(prout(kB, codec::prout_release(kKeyB, PrType::kWriteExclusiveRegistrantsOnly))));
  EXPECT_EQ(target.reservation(lu),
            (SimReservation{kA1, kKeyA, PrType::kWriteExclusiveRegistrantsOnly}));
  EXPECT_TRUE(target.unit_attentions(lu, kC).empty());
}

TEST_F(SimTargetTest, ReleaseByTheHolderWithAnotherTypeOrKeyConflicts) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  // SPC-4 says ILLEGAL REQUEST 26/04 for the wrong type; LIO says RESERVATION CONFLICT.
  EXPECT_TRUE(is_conflict(prout(kA1, codec::prout_release(kKeyA, PrType::kWriteExclusive))));
  EXPECT_TRUE(
      is_conflict(prout(kA1, codec::prout_release(kKeyB, PrType::kWriteExclusiveRegistrantsOnly))));
  EXPECT_TRUE(target.reservation(lu).has_value());
}

TEST_F(SimTargetTest, ReleaseTellsOtherRegistrantsOnlyForRegistrantsTypes) {
  for (const PrType type : kAllTypes) {
    SCOPED_TRACE(codec::to_string(type));
    SimClock local_clock;
    SimTarget local(local_clock);
    const LuId id = local.add_lu();
    const std::pair<NexusId, std::uint64_t> registrants[] = {{kA1, kKeyA}, {kB, kKeyB}};
    for (const auto& [nexus, key] : registrants) {
      ASSERT_TRUE(
          is_good(local.execute(id, nexus, prout_command(codec::prout_register_and_ignore(key)))));
    }
    ASSERT_TRUE(is_good(local.execute(id, kA1, prout_command(codec::prout_reserve(kKeyA, type)))));
    ASSERT_TRUE(is_good(local.execute(id, kA1, prout_command(codec::prout_release(kKeyA, type)))));
    EXPECT_EQ(local.reservation(id), std::nullopt);
    EXPECT_EQ(local.registrations(id).size(), 2U);
    EXPECT_EQ(local.generation(id), 2U);
    const bool tells = type != PrType::kWriteExclusive && type != PrType::kExclusiveAccess;
    EXPECT_EQ(
        local.unit_attentions(id, kB),
        tells ? std::vector<UnitAttention>{kUaReservationsReleased} : std::vector<UnitAttention>{});
    EXPECT_TRUE(local.unit_attentions(id, kA1).empty());
  }
}

TEST_F(SimTargetTest, ReleaseAndClearFromAnUnregisteredNexus) {
  EXPECT_TRUE(is_sense(prout(kStranger, codec::prout_release(0, PrType::kWriteExclusive)),
                       SenseKey::kNotReady, 0x08, 0x00));
  EXPECT_TRUE(is_sense(prout(kStranger, codec::prout_clear(0)), SenseKey::kNotReady, 0x08, 0x00));
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_TRUE(is_conflict(prout(kStranger, codec::prout_release(0, PrType::kWriteExclusive))));
  EXPECT_TRUE(is_conflict(prout(kStranger, codec::prout_clear(0))));
  EXPECT_EQ(keys().size(), 4U);
}

// --- CLEAR ---

TEST_F(SimTargetTest, ClearRemovesEverythingAndTellsEveryoneElse2A03) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  const std::uint32_t before = generation();
  EXPECT_TRUE(is_conflict(prout(kB, codec::prout_clear(kKeyC))));
  EXPECT_EQ(generation(), before);
  EXPECT_TRUE(is_good(prout(kB, codec::prout_clear(kKeyB))));
  EXPECT_TRUE(keys().empty());
  EXPECT_EQ(read_reservation(), std::nullopt);
  EXPECT_EQ(generation(), before + 1);
  for (const NexusId other : {kA1, kA2, kC}) {
    EXPECT_EQ(target.unit_attentions(lu, other),
              std::vector<UnitAttention>{kUaReservationsPreempted});
  }
  EXPECT_TRUE(target.unit_attentions(lu, kB).empty());
  EXPECT_EQ(target.history().prouts.back().unregistered, (std::vector<NexusId>{kA1, kA2, kB, kC}));
}

// --- PREEMPT and PREEMPT AND ABORT (spc4-pr.md §4, lio.md §4) ---

TEST_F(SimTargetTest, PreemptOfTheHolderTakesItAndRemovesEveryPathOfTheVictim) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  const std::uint32_t before = generation();
  EXPECT_TRUE(is_good(
      prout(kB, codec::prout_preempt(kKeyB, kKeyA, PrType::kWriteExclusiveRegistrantsOnly))));
  EXPECT_EQ(target.reservation(lu),
            (SimReservation{kB, kKeyB, PrType::kWriteExclusiveRegistrantsOnly}));
  EXPECT_EQ(keys(), (std::vector<std::uint64_t>{kKeyB, kKeyC}));
  EXPECT_EQ(generation(), before + 1);
  for (const NexusId victim : {kA1, kA2}) {
    EXPECT_EQ(target.unit_attentions(lu, victim),
              std::vector<UnitAttention>{kUaRegistrationsPreempted});
  }
  // Same type: nobody else hears of it.
  EXPECT_TRUE(target.unit_attentions(lu, kB).empty());
  EXPECT_TRUE(target.unit_attentions(lu, kC).empty());
  EXPECT_EQ(target.history().prouts.back().unregistered, (std::vector<NexusId>{kA1, kA2}));
  // A retry of the preempt that worked finds the key gone: RESERVATION CONFLICT, no change.
  EXPECT_TRUE(is_conflict(
      prout(kB, codec::prout_preempt(kKeyB, kKeyA, PrType::kWriteExclusiveRegistrantsOnly))));
  EXPECT_EQ(generation(), before + 1);
}

TEST_F(SimTargetTest, PreemptWithAKeyNobodyHasConflicts) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  const std::uint32_t before = generation();
  EXPECT_TRUE(is_conflict(
      prout(kB, codec::prout_preempt(kKeyB, kKeyD, PrType::kWriteExclusiveRegistrantsOnly))));
  EXPECT_EQ(generation(), before);
  EXPECT_EQ(keys().size(), 4U);
  EXPECT_EQ(target.reservation(lu)->holder, kA1);
}

TEST_F(SimTargetTest, PreemptNeedsARegisteredCallerWithItsKey) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_TRUE(is_conflict(
      prout(kB, codec::prout_preempt(kKeyC, kKeyA, PrType::kWriteExclusiveRegistrantsOnly))));
  EXPECT_TRUE(
      is_conflict(prout(kStranger, codec::prout_preempt(0, kKeyA, PrType::kWriteExclusive))));
  codec::PrOutCommand bad_type =
      codec::prout_preempt(kKeyB, kKeyC, PrType::kWriteExclusiveRegistrantsOnly);
  bad_type.cdb[2] = 0x04;  // obsolete, and checked although TYPE is ignored for a non-holder
  EXPECT_TRUE(is_sense(prout(kB, bad_type), SenseKey::kIllegalRequest, 0x24, 0x00));
  EXPECT_EQ(keys().size(), 4U);
}

TEST_F(SimTargetTest, PreemptOfANonHolderRemovesOnlyItsRegistrationsTypeIgnored) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_TRUE(is_good(prout(kB, codec::prout_preempt(kKeyB, kKeyC, PrType::kExclusiveAccess))));
  EXPECT_EQ(target.reservation(lu),
            (SimReservation{kA1, kKeyA, PrType::kWriteExclusiveRegistrantsOnly}));
  EXPECT_EQ(keys(), (std::vector<std::uint64_t>{kKeyA, kKeyA, kKeyB}));
  EXPECT_EQ(target.unit_attentions(lu, kC), std::vector<UnitAttention>{kUaRegistrationsPreempted});
  EXPECT_TRUE(target.unit_attentions(lu, kA1).empty());
}

// LIO (and SPC-4): a non-holder preempting its own key removes its own registrations too; only
// the others are told.
TEST_F(SimTargetTest, PreemptOfTheCallersOwnKeyByANonHolderRemovesTheCallerToo) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  ASSERT_TRUE(is_good(register_key(kStranger, kKeyB)));  // a second path of B
  EXPECT_TRUE(is_good(prout(kB, codec::prout_preempt(kKeyB, kKeyB, PrType::kWriteExclusive))));
  EXPECT_EQ(keys(), (std::vector<std::uint64_t>{kKeyA, kKeyA, kKeyC}));
  EXPECT_TRUE(target.unit_attentions(lu, kB).empty());
  EXPECT_EQ(target.unit_attentions(lu, kStranger),
            std::vector<UnitAttention>{kUaRegistrationsPreempted});
}

TEST_F(SimTargetTest, PreemptWithZeroSaKeyNeedsAnAllRegistrantsReservation) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_TRUE(is_sense(prout(kB, codec::prout_preempt(kKeyB, 0, PrType::kWriteExclusive)),
                       SenseKey::kIllegalRequest, 0x26, 0x00));
  EXPECT_EQ(keys().size(), 4U);
}

TEST_F(SimTargetTest, PreemptOfAnAllRegistrantsReservationWithZeroSaKeyTakesItAll) {
  set_up_holder(PrType::kWriteExclusiveAllRegistrants);
  EXPECT_TRUE(
      is_good(prout(kB, codec::prout_preempt(kKeyB, 0, PrType::kWriteExclusiveRegistrantsOnly))));
  EXPECT_EQ(target.reservation(lu),
            (SimReservation{kB, kKeyB, PrType::kWriteExclusiveRegistrantsOnly}));
  EXPECT_EQ(keys(), std::vector<std::uint64_t>{kKeyB});
  for (const NexusId victim : {kA1, kA2, kC}) {
    EXPECT_EQ(target.unit_attentions(lu, victim),
              std::vector<UnitAttention>{kUaRegistrationsPreempted});
  }
}

TEST_F(SimTargetTest, PreemptOfAnAllRegistrantsReservationWithAKeyRemovesOnlyThatKey) {
  set_up_holder(PrType::kExclusiveAccessAllRegistrants);
  EXPECT_TRUE(is_good(
      prout(kB, codec::prout_preempt(kKeyB, kKeyC, PrType::kExclusiveAccessAllRegistrants))));
  EXPECT_EQ(target.reservation(lu),
            (SimReservation{kA1, kKeyA, PrType::kExclusiveAccessAllRegistrants}));
  EXPECT_EQ(keys(), (std::vector<std::uint64_t>{kKeyA, kKeyA, kKeyB}));
  // READ RESERVATION reports key 0 under an all-registrants type (SPC-4 5.13.10).
  const auto reservation = read_reservation();
  ASSERT_TRUE(reservation.has_value());
  EXPECT_EQ(reservation->key, 0U);
  EXPECT_EQ(reservation->type, PrType::kExclusiveAccessAllRegistrants);
}

TEST_F(SimTargetTest, PreemptChangingTheTypeTellsTheRemainingRegistrants2A04) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_TRUE(is_good(prout(kB, codec::prout_preempt(kKeyB, kKeyA, PrType::kExclusiveAccess))));
  EXPECT_EQ(target.reservation(lu)->type, PrType::kExclusiveAccess);
  EXPECT_EQ(target.unit_attentions(lu, kC), std::vector<UnitAttention>{kUaReservationsReleased});
  EXPECT_EQ(target.unit_attentions(lu, kA1), std::vector<UnitAttention>{kUaRegistrationsPreempted});
  EXPECT_TRUE(target.unit_attentions(lu, kB).empty());
}

TEST_F(SimTargetTest, SelfPreemptChangesTheTypeAndDropsTheHoldersOtherPaths) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_TRUE(is_good(prout(kA1, codec::prout_preempt(kKeyA, kKeyA, PrType::kWriteExclusive))));
  EXPECT_EQ(target.reservation(lu), (SimReservation{kA1, kKeyA, PrType::kWriteExclusive}));
  EXPECT_EQ(keys(), (std::vector<std::uint64_t>{kKeyA, kKeyB, kKeyC}));
  EXPECT_EQ(target.unit_attentions(lu, kA2), std::vector<UnitAttention>{kUaRegistrationsPreempted});
}

// --- PRgeneration (spc4-pr.md §6, lio.md §1) ---

TEST_F(SimTargetTest, PrGenerationFollowsLioStepByStep) {
  const auto step = [this](const SimAnswer& answer, std::uint32_t expected) {
    EXPECT_TRUE(is_good(answer) || is_conflict(answer));
    EXPECT_EQ(generation(), expected);
  };
  step(register_key(kA1, kKeyA), 1);                                     // new
  step(register_key(kB, kKeyB), 2);                                      // new
  step(reserve(kA1, kKeyA, PrType::kWriteExclusiveRegistrantsOnly), 2);  // RESERVE
  step(prout(kA1, codec::prout_register(kKeyA, kKeyC)), 3);              // key change
  step(prout(kA1, codec::prout_register(kKeyA, kKeyD)), 3);              // conflict
  step(prout(kA1, codec::prout_release(kKeyC, PrType::kWriteExclusiveRegistrantsOnly)), 3);
  EXPECT_TRUE(is_unit_attention(run(kB, test_unit_ready_command()), kUaReservationsReleased));
  step(register_key(kB, 0), 3);  // unregister
  step(register_key(kB, 0), 3);  // no-op
  step(register_key(kB, kKeyB), 4);
  step(prout(kB, codec::prout_preempt(kKeyB, kKeyC, PrType::kWriteExclusive)), 5);
  step(prout(kB, codec::prout_preempt(kKeyB, kKeyC, PrType::kWriteExclusive)), 5);  // conflict
  step(prout(kB, codec::prout_clear(kKeyB)), 6);
  EXPECT_EQ(target.history().prouts.back().generation, 6U);
}

// --- Who may write and read (lio.md §3, core_scsi3_pr_seq_non_holder) ---

struct AccessCase {
  PrType type;
  bool registrant_writes;
  bool stranger_reads;
  bool registrant_reads;
};

class SimTargetAccess : public SimTargetTest, public ::testing::WithParamInterface<AccessCase> {};

TEST_P(SimTargetAccess, WritesAndReadsFollowTheType) {
  const AccessCase access = GetParam();
  set_up_holder(access.type);
  const auto writes = [this](NexusId nexus, std::uint8_t fill) {
    const SimAnswer narrow = run(nexus, write_command(10, fill));
    const SimAnswer wide = run(nexus, write_command(11, fill, 1, true));
    EXPECT_EQ(narrow.status, wide.status);
    if (is_good(narrow)) {
      EXPECT_EQ(target.block(lu, 10), std::vector<std::uint8_t>(512, fill));
      return true;
    }
    EXPECT_TRUE(is_conflict(narrow));
    EXPECT_NE(target.block(lu, 10), std::vector<std::uint8_t>(512, fill));
    return false;
  };
  const auto reads = [this](NexusId nexus) {
    const SimAnswer answer = run(nexus, read_command(10, 1, nexus % 2 == 0));
    EXPECT_TRUE(is_good(answer) || is_conflict(answer));
    return is_good(answer);
  };
  EXPECT_TRUE(writes(kA1, 0x11));                          // the holder
  EXPECT_EQ(writes(kA2, 0x22), access.registrant_writes);  // the holder's other path
  EXPECT_EQ(writes(kB, 0x33), access.registrant_writes);   // another registrant
  EXPECT_FALSE(writes(kStranger, 0x44));                   // unregistered
  EXPECT_TRUE(reads(kA1));
  EXPECT_EQ(reads(kB), access.registrant_reads);
  EXPECT_EQ(reads(kStranger), access.stranger_reads);
  // Test unit ready and PR IN are allowed for everyone (explicitly, in LIO's table).
  EXPECT_TRUE(is_good(run(kStranger, test_unit_ready_command())));
  for (const WriteRecord& write : target.history().writes) {
    EXPECT_EQ(write.landed, write.outcome.status == kGood);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllSixTypes, SimTargetAccess,
    ::testing::Values(AccessCase{PrType::kWriteExclusive, false, true, true},
                      AccessCase{PrType::kExclusiveAccess, false, false, false},
                      AccessCase{PrType::kWriteExclusiveRegistrantsOnly, true, true, true},
                      AccessCase{PrType::kExclusiveAccessRegistrantsOnly, true, false, true},
                      AccessCase{PrType::kWriteExclusiveAllRegistrants, true, true, true},
                      AccessCase{PrType::kExclusiveAccessAllRegistrants, true, false, true}),
    [](const ::testing::TestParamInfo<AccessCase>& param_info) {
      return "Type" + std::to_string(static_cast<int>(param_info.param.type));
    });

TEST_F(SimTargetTest, WithoutAReservationAnyNexusWrites) {
  ASSERT_TRUE(is_good(register_key(kA1, kKeyA)));
  EXPECT_TRUE(is_good(run(kStranger, write_command(0, 0x5a))));
  EXPECT_EQ(target.block(lu, 0), std::vector<std::uint8_t>(512, 0x5a));
}

// --- Unit attentions (lio.md §5) ---

TEST_F(SimTargetTest, AUnitAttentionIsReportedOnceAndItsCommandDoesNotExecute) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  ASSERT_TRUE(is_good(prout(
      kB, codec::prout_preempt_and_abort(kKeyB, kKeyA, PrType::kWriteExclusiveRegistrantsOnly))));
  const std::uint32_t before = generation();
  // A1 re-registers: the REGISTER gets the UA and does not happen (docs/design.md §7).
  EXPECT_TRUE(is_unit_attention(register_key(kA1, kKeyA), kUaRegistrationsPreempted));
  EXPECT_EQ(keys(), (std::vector<std::uint64_t>{kKeyB, kKeyC}));
  EXPECT_EQ(generation(), before);
  EXPECT_TRUE(is_good(register_key(kA1, kKeyA)));
  EXPECT_EQ(generation(), before + 1);
  // A2's write gets the UA, so it is neither refused by the reservation nor executed.
  EXPECT_TRUE(is_unit_attention(run(kA2, write_command(3, 0x77)), kUaRegistrationsPreempted));
  EXPECT_EQ(target.block(lu, 3), std::nullopt);
  EXPECT_TRUE(is_conflict(run(kA2, write_command(3, 0x77))));
}

TEST_F(SimTargetTest, OnlyTheHighestUnitAttentionIsReportedAndAllAreCleared) {
  target.add_unit_attention(lu, kA1, kUaRegistrationsPreempted);
  target.add_unit_attention(lu, kA1, kUaReservationsReleased);
  target.nexus_loss(kA1);
  // LIO compares a new UA with the head only, so this duplicate is queued again.
  target.add_unit_attention(lu, kA1, kUaRegistrationsPreempted);
  EXPECT_EQ(target.unit_attentions(lu, kA1),
            (std::vector<UnitAttention>{kUaItNexusLoss, kUaRegistrationsPreempted,
                                        kUaReservationsReleased, kUaRegistrationsPreempted}));
  EXPECT_TRUE(is_unit_attention(run(kA1, test_unit_ready_command()), kUaItNexusLoss));
  EXPECT_TRUE(target.unit_attentions(lu, kA1).empty());
  EXPECT_TRUE(is_good(run(kA1, test_unit_ready_command())));
}

TEST_F(SimTargetTest, InquiryReportLunsAndRequestSenseAreExempt) {
  target.add_unit_attention(lu, kA1, kUaReservationsPreempted);
  EXPECT_TRUE(is_good(run(kA1, inquiry_command(std::nullopt))));
  const SimAnswer luns = run(kA1, report_luns_command());
  ASSERT_TRUE(is_good(luns));
  EXPECT_EQ(luns.data_in.size(), 16U);
  EXPECT_EQ(target.unit_attentions(lu, kA1).size(), 1U);
  // REQUEST SENSE returns the UA as its data and clears it.
  const SimAnswer sense = run(kA1, request_sense_command());
  ASSERT_TRUE(is_good(sense));
  const codec::Sense decoded = codec::decode_sense(sense.data_in);
  EXPECT_EQ(decoded.sense_key, SenseKey::kUnitAttention);
  EXPECT_EQ(decoded.asc, 0x2a);
  EXPECT_EQ(decoded.ascq, 0x03);
  EXPECT_TRUE(is_good(run(kA1, test_unit_ready_command())));
  EXPECT_EQ(codec::decode_sense(run(kA1, request_sense_command()).data_in).sense_key,
            SenseKey::kNoSense);
}

TEST_F(SimTargetTest, CdbErrorsComeBeforeTheUnitAttention) {
  target.nexus_loss(kA1);
  Command unknown = Command::from_cdb(std::vector<std::uint8_t>{0xd7, 0, 0, 0, 0, 0});
  EXPECT_TRUE(is_sense(run(kA1, unknown), SenseKey::kIllegalRequest, 0x20, 0x00));
  EXPECT_TRUE(is_sense(run(kA1, write_command(2048, 0x01)), SenseKey::kIllegalRequest, 0x21, 0x00));
  EXPECT_TRUE(is_sense(run(kA1, read_command(2047, 2)), SenseKey::kIllegalRequest, 0x21, 0x00));
  EXPECT_EQ(target.unit_attentions(lu, kA1), std::vector<UnitAttention>{kUaItNexusLoss});
}

// --- PR OUT parameter list checks (spc4-pr.md §3.2) ---

TEST_F(SimTargetTest, ParameterListErrorsAreLios) {
  ASSERT_TRUE(is_good(register_key(kA1, kKeyA)));
  codec::PrOutCommand short_list = codec::prout_reserve(kKeyA, PrType::kWriteExclusive);
  short_list.parameters.resize(23);
  store_be32(short_list.cdb, 5, 23);
  EXPECT_TRUE(is_sense(prout(kA1, short_list), SenseKey::kIllegalRequest, 0x1a, 0x00));
  codec::PrOutCommand long_list = codec::prout_reserve(kKeyA, PrType::kWriteExclusive);
  long_list.parameters.resize(25);
  store_be32(long_list.cdb, 5, 25);
  EXPECT_TRUE(is_sense(prout(kA1, long_list), SenseKey::kIllegalRequest, 0x1a, 0x00));
  codec::PrOutCommand spec_i_pt = codec::prout_reserve(kKeyA, PrType::kWriteExclusive);
  spec_i_pt.parameters[20] = 0x08;
  EXPECT_TRUE(is_sense(prout(kA1, spec_i_pt), SenseKey::kIllegalRequest, 0x26, 0x00));
  codec::PrOutCommand unknown = codec::prout_clear(kKeyA);
  unknown.cdb[1] = 0x08;  // REPLACE LOST RESERVATION
  EXPECT_TRUE(is_sense(prout(kA1, unknown), SenseKey::kIllegalRequest, 0x24, 0x00));
  codec::PrOutCommand all_tg_pt_lost = codec::prout_register_and_ignore(kKeyB);
  ASSERT_TRUE(is_good(
      prout(kB, codec::prout_register_and_ignore(kKeyB, {.all_tg_pt = true, .aptpl = false}))));
  EXPECT_TRUE(is_sense(prout(kB, all_tg_pt_lost), SenseKey::kIllegalRequest, 0x24, 0x00));
  EXPECT_EQ(read_reservation(), std::nullopt);
  // The list as received counts, not the CDB's claim: 24 claimed and 20 sent is too short.
  Command truncated = prout_command(codec::prout_clear(kKeyA));
  truncated.data_out.resize(20);
  EXPECT_TRUE(is_sense(run(kA1, truncated), SenseKey::kIllegalRequest, 0x1a, 0x00));
}

// --- PR IN (spc4-pr.md §5, lio.md §1) ---

TEST_F(SimTargetTest, ReadKeysCountsEveryKeyButCopiesOnlyWholeOnesThatFit) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  const SimAnswer answer = run(kObserver, prin_command(PrInAction::kReadKeys, 21));
  ASSERT_TRUE(is_good(answer));
  ASSERT_EQ(answer.data_in.size(), 21U);
  EXPECT_EQ(load_be32(answer.data_in, 4), 32U);
  EXPECT_EQ(std::vector<std::uint8_t>(answer.data_in.begin() + 16, answer.data_in.end()),
            std::vector<std::uint8_t>(5, 0));
  const auto decoded = codec::decode_read_keys(answer.data_in);
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->keys, std::vector<std::uint64_t>{kKeyA});
  EXPECT_TRUE(decoded->truncated);
  EXPECT_TRUE(is_sense(run(kObserver, prin_command(PrInAction::kReadKeys, 7)),
                       SenseKey::kIllegalRequest, 0x24, 0x00));
  Command unknown = prin_command(PrInAction::kReadKeys);
  unknown.cdb[1] = 0x04;
  EXPECT_TRUE(is_sense(run(kObserver, unknown), SenseKey::kIllegalRequest, 0x24, 0x00));
}

TEST_F(SimTargetTest, ReadReservationBelow22BytesHasNeitherKeyNorType) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  const SimAnswer answer = run(kObserver, prin_command(PrInAction::kReadReservation, 16));
  ASSERT_TRUE(is_good(answer));
  EXPECT_EQ(answer.data_in.size(), 16U);
  EXPECT_EQ(load_be32(answer.data_in, 4), 16U);
  EXPECT_EQ(load_be64(answer.data_in, 8), 0U);
  const auto decoded = codec::decode_read_reservation(answer.data_in);
  ASSERT_TRUE(decoded.has_value());
  EXPECT_TRUE(decoded->truncated);
  EXPECT_EQ(decoded->reservation, std::nullopt);
}

TEST_F(SimTargetTest, ReportCapabilitiesAsLio) {
  Command command = prin_command(PrInAction::kReportCapabilities, 8);
  auto caps = codec::decode_report_capabilities(run(kObserver, command).data_in);
  ASSERT_TRUE(caps.has_value());
  EXPECT_TRUE(caps->crh && caps->sip_c && caps->atp_c && caps->ptpl_c && caps->tmv);
  EXPECT_FALSE(caps->rlr_c);
  EXPECT_EQ(caps->allow_commands, 1);
  EXPECT_FALSE(caps->ptpl_a);
  for (const PrType type : kAllTypes) {
    EXPECT_TRUE(caps->supports(type)) << codec::to_string(type);
  }
  ASSERT_TRUE(is_good(
      prout(kA1, codec::prout_register_and_ignore(kKeyA, {.all_tg_pt = false, .aptpl = true}))));
  caps = codec::decode_report_capabilities(run(kObserver, command).data_in);
  ASSERT_TRUE(caps.has_value());
  EXPECT_TRUE(caps->ptpl_a);
  EXPECT_TRUE(is_sense(run(kObserver, prin_command(PrInAction::kReportCapabilities, 5)),
                       SenseKey::kIllegalRequest, 0x24, 0x00));
}

TEST_F(SimTargetTest, ReadFullStatusDescribesEveryRegistration) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  auto status = codec::decode_read_full_status(
      run(kObserver, prin_command(PrInAction::kReadFullStatus)).data_in);
  ASSERT_TRUE(status.has_value());
  ASSERT_EQ(status->descriptors.size(), 4U);
  EXPECT_FALSE(status->truncated);
  const NexusId nexuses[] = {kA1, kA2, kB, kC};
  for (std::size_t i = 0; i < 4; ++i) {
    const codec::FullStatusDescriptor& descriptor = status->descriptors[i];
    EXPECT_EQ(descriptor.holder, i == 0);
    EXPECT_EQ(descriptor.relative_target_port_id, SimTarget::kRelativeTargetPortId);
    EXPECT_EQ(descriptor.transport_id, SimTarget::initiator_port(nexuses[i]));
  }
  EXPECT_EQ(status->descriptors[0].type, PrType::kWriteExclusiveRegistrantsOnly);
  // Under an AR type every registrant is a holder (B and C are left).
  ASSERT_TRUE(is_good(
      prout(kB, codec::prout_preempt(kKeyB, kKeyA, PrType::kWriteExclusiveAllRegistrants))));
  status = codec::decode_read_full_status(
      run(kObserver, prin_command(PrInAction::kReadFullStatus)).data_in);
  ASSERT_TRUE(status.has_value());
  ASSERT_EQ(status->descriptors.size(), 2U);
  for (const codec::FullStatusDescriptor& descriptor : status->descriptors) {
    EXPECT_TRUE(descriptor.holder);
    EXPECT_EQ(descriptor.type, PrType::kWriteExclusiveAllRegistrants);
  }
  // LIO's fit check counts only the 24-byte TransportID: at 60 bytes the second descriptor is
  // dropped and not counted, so nothing looks truncated; at 80 it is counted and then cut.
  status = codec::decode_read_full_status(
      run(kObserver, prin_command(PrInAction::kReadFullStatus, 60)).data_in);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->additional_length, 48U);
  EXPECT_EQ(status->descriptors.size(), 1U);
  EXPECT_FALSE(status->truncated);
  const SimAnswer cut = run(kObserver, prin_command(PrInAction::kReadFullStatus, 80));
  EXPECT_EQ(cut.data_in.size(), 80U);
  status = codec::decode_read_full_status(cut.data_in);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->additional_length, 96U);
  EXPECT_EQ(status->descriptors.size(), 1U);
  EXPECT_TRUE(status->truncated);
}

// --- INQUIRY ---

TEST_F(SimTargetTest, InquiryGivesSerialAndNaaDesignator) {
  const auto serial = codec::decode_vpd_unit_serial(
      run(kA1, inquiry_command(codec::VpdPage::kUnitSerialNumber)).data_in);
  ASSERT_TRUE(serial.has_value());
  EXPECT_EQ(serial->serial, "sim-lu-0");
  const auto identification = codec::decode_vpd_device_identification(
      run(kA1, inquiry_command(codec::VpdPage::kDeviceIdentification)).data_in);
  ASSERT_TRUE(identification.has_value());
  EXPECT_FALSE(identification->truncated);
  EXPECT_EQ(codec::lu_wwn(*identification), "naa.60014050000000000000000000000000");
  const LuId second = target.add_lu({.serial = "abc",
                                     .naa = {0x60, 0x01, 0x40, 0x5a, 0xbc},
                                     .product = "X",
                                     .block_size = 4096,
                                     .block_count = 16,
                                     .aptpl_file_writable = true});
  const auto other = codec::decode_vpd_device_identification(
      target.execute(second, kA1, inquiry_command(codec::VpdPage::kDeviceIdentification)).data_in);
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(codec::lu_wwn(*other), "naa.6001405abc0000000000000000000000");
  const SimAnswer standard = run(kA1, inquiry_command(std::nullopt, 36));
  ASSERT_TRUE(is_good(standard));
  EXPECT_EQ(std::string(standard.data_in.begin() + 8, standard.data_in.begin() + 16), "LIO-ORG ");
  Command evpd_zero_with_page = inquiry_command(std::nullopt);
  evpd_zero_with_page.cdb[2] = 0x80;
  EXPECT_TRUE(is_sense(run(kA1, evpd_zero_with_page), SenseKey::kIllegalRequest, 0x24, 0x00));
  Command unknown_page = inquiry_command(codec::VpdPage::kSupportedPages);
  unknown_page.cdb[2] = 0xb0;
  EXPECT_TRUE(is_sense(run(kA1, unknown_page), SenseKey::kIllegalRequest, 0x24, 0x00));
}

// --- REGISTER AND MOVE (spc4-pr.md §3.3) ---

codec::PrOutCommand register_and_move(std::uint64_t key, std::uint64_t sa_key, NexusId to,
                                      bool unreg) {
  codec::RegisterAndMoveParameters parameters;
  parameters.key = key;
  parameters.sa_key = sa_key;
  parameters.unreg = unreg;
  parameters.relative_target_port_id = SimTarget::kRelativeTargetPortId;
  parameters.transport_id = SimTarget::initiator_port(to);
  return codec::encode_prout_register_and_move(parameters).value();
}

TEST_F(SimTargetTest, RegisterAndMoveHandsTheReservationToAnotherNexus) {
  target.add_path("/dev/sg-c", lu, kC);
  ASSERT_TRUE(is_good(register_key(kA1, kKeyA)));
  EXPECT_TRUE(is_sense(prout(kA1, register_and_move(kKeyA, kKeyC, kC, true)),
                       SenseKey::kIllegalRequest, 0x24, 0x00));  // no reservation
  ASSERT_TRUE(is_good(reserve(kA1, kKeyA, PrType::kWriteExclusive)));
  EXPECT_TRUE(is_sense(prout(kA1, register_and_move(kKeyA, kKeyC, kA1, true)),
                       SenseKey::kIllegalRequest, 0x26, 0x00));  // to itself
  EXPECT_TRUE(is_sense(prout(kA1, register_and_move(kKeyA, kKeyC, 77, true)),
                       SenseKey::kIllegalRequest, 0x26, 0x00));  // an unknown initiator
  const std::uint32_t before = generation();
  EXPECT_TRUE(is_good(prout(kA1, register_and_move(kKeyA, kKeyC, kC, true))));
  EXPECT_EQ(target.reservation(lu), (SimReservation{kC, kKeyC, PrType::kWriteExclusive}));
  EXPECT_EQ(keys(), std::vector<std::uint64_t>{kKeyC});
  EXPECT_EQ(generation(), before + 1);
  EXPECT_TRUE(is_good(run(kC, write_command(1, 0x0c))));
  EXPECT_TRUE(is_conflict(run(kA1, write_command(1, 0x0a))));
  // Not from a non-holder, nor under an all-registrants type.
  ASSERT_TRUE(is_good(register_key(kB, kKeyB)));
  EXPECT_TRUE(is_conflict(prout(kB, register_and_move(kKeyB, kKeyA, kA1, false))));
  ASSERT_TRUE(is_good(
      prout(kC, codec::prout_preempt(kKeyC, kKeyC, PrType::kWriteExclusiveAllRegistrants))));
  EXPECT_TRUE(is_conflict(prout(kC, register_and_move(kKeyC, kKeyA, kA1, false))));
}

// --- APTPL (docs/design.md §7: LIO without /var/target/pr) ---

TEST_F(SimTargetTest, MissingAptplDirectoryAnswersNotReadyAfterTheChange) {
  LuConfig config;
  config.aptpl_file_writable = false;
  const LuId broken = target.add_lu(config);
  const SimAnswer answer =
      target.execute(broken, kA1, prout_command(codec::prout_register_and_ignore(kKeyA)));
  EXPECT_TRUE(is_sense(answer, SenseKey::kNotReady, 0x08, 0x00));
  EXPECT_EQ(target.registrations(broken), (std::vector<SimRegistration>{{kA1, kKeyA, false}}));
  EXPECT_TRUE(is_good(target.execute(
      broken, kA1, prout_command(codec::prout_reserve(kKeyA, PrType::kWriteExclusive)))));
}

// --- Held commands: PREEMPT AND ABORT vs PREEMPT (docs/reference/lio.md §4, docs/protocol.md S1)
// ---

struct Held {
  std::optional<SimAnswer> answer;
  SimTime at{0};
};

SimTarget::AnswerFn keep(Held& held, const SimClock& clock) {
  return [&held, &clock](SimAnswer answer) {
    held.answer = std::move(answer);
    held.at = clock.now();
  };
}

TEST_F(SimTargetTest, PreemptAndAbortAbortsTheVictimsHeldWrites) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  Held write;
  target.submit(lu, kA1, write_command(5, 0xaa), milliseconds(10), keep(write, clock));
  EXPECT_EQ(target.held_count(lu), 1U);
  clock.advance(milliseconds(2));
  ASSERT_TRUE(is_good(prout(
      kB, codec::prout_preempt_and_abort(kKeyB, kKeyA, PrType::kWriteExclusiveRegistrantsOnly))));
  ASSERT_TRUE(write.answer.has_value());
  EXPECT_EQ(write.answer->status, kTaskAborted);
  EXPECT_EQ(write.at, milliseconds(2));
  EXPECT_EQ(target.held_count(lu), 0U);
  clock.advance(milliseconds(20));
  EXPECT_EQ(target.block(lu, 5), std::nullopt);
  ASSERT_EQ(target.history().writes.size(), 1U);
  EXPECT_FALSE(target.history().writes[0].landed);
  EXPECT_EQ(target.history().writes[0].accepted_at, milliseconds(0));
  EXPECT_TRUE(s1_violations(target.history()).empty());
}

TEST_F(SimTargetTest, PlainPreemptLetsAHeldWriteOfTheVictimLandAfterIt) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  Held write;
  target.submit(lu, kA1, write_command(5, 0xaa), milliseconds(10), keep(write, clock));
  clock.advance(milliseconds(2));
  ASSERT_TRUE(is_good(
      prout(kB, codec::prout_preempt(kKeyB, kKeyA, PrType::kWriteExclusiveRegistrantsOnly))));
  EXPECT_FALSE(write.answer.has_value());
  clock.advance(milliseconds(20));
  ASSERT_TRUE(write.answer.has_value());
  EXPECT_TRUE(is_good(*write.answer));
  EXPECT_EQ(write.at, milliseconds(10));
  EXPECT_EQ(target.block(lu, 5), std::vector<std::uint8_t>(512, 0xaa));
  const auto violations = s1_violations(target.history());
  ASSERT_EQ(violations.size(), 1U);
  EXPECT_EQ(violations[0].nexus, kA1);
  EXPECT_EQ(violations[0].at, milliseconds(10));
  // The same write arriving after the preempt is checked then: after the UA, refused.
  EXPECT_TRUE(is_unit_attention(run(kA1, write_command(6, 0xaa)), kUaRegistrationsPreempted));
  EXPECT_TRUE(is_conflict(run(kA1, write_command(6, 0xaa))));
}

// LIO picks commands to abort by the holder's key when each passed its checks (lio.md §4): a
// registrant's write under A's reservation carries A's key and is aborted with A's; a write
// accepted while nobody held carries 0 and is never aborted, even from the victim.
TEST_F(SimTargetTest, PreemptAndAbortMatchesTheHolderKeySnapshot) {
  ASSERT_TRUE(is_good(register_key(kA1, kKeyA)));
  ASSERT_TRUE(is_good(register_key(kB, kKeyB)));
  ASSERT_TRUE(is_good(register_key(kC, kKeyC)));
  Held before_reservation;
  target.submit(lu, kA1, write_command(1, 0x01), milliseconds(10), keep(before_reservation, clock));
  ASSERT_TRUE(is_good(reserve(kA1, kKeyA, PrType::kWriteExclusiveRegistrantsOnly)));
  Held registrant;
  target.submit(lu, kC, write_command(2, 0x02), milliseconds(10), keep(registrant, clock));
  Held preemptor;
  target.submit(lu, kB, write_command(3, 0x03), milliseconds(10), keep(preemptor, clock));
  ASSERT_EQ(target.held_count(lu), 3U);
  ASSERT_TRUE(is_good(prout(
      kB, codec::prout_preempt_and_abort(kKeyB, kKeyA, PrType::kWriteExclusiveRegistrantsOnly))));
  ASSERT_TRUE(registrant.answer.has_value());
  EXPECT_EQ(registrant.answer->status, kTaskAborted);
  ASSERT_TRUE(preemptor.answer.has_value());
  EXPECT_EQ(preemptor.answer->status, kTaskAborted);  // the preemptor's own, with A's key
  EXPECT_FALSE(before_reservation.answer.has_value());
  clock.advance(milliseconds(10));
  ASSERT_TRUE(before_reservation.answer.has_value());
  EXPECT_TRUE(is_good(*before_reservation.answer));
  EXPECT_EQ(s1_violations(target.history()).size(), 1U);
}

}  // namespace
}  // namespace blkfence::transport::test
