// Proves that SimTarget's PERSISTENT RESERVE OUT answers as LIO does (docs/reference/lio.md),
// through CDBs built by the codec's encoders and answers read by its decoders: REGISTER against
// REGISTER AND IGNORE EXISTING KEY, key changes and unregistering (the holder's implicit release,
// per type); RESERVE by the holder, a non-holder and an unregistered nexus (LIO's NOT READY 08/00);
// RELEASE by a non-holder (a GOOD no-op) and with the wrong TYPE (conflict); CLEAR with its 2A/03
// unit attentions; every PREEMPT case of spc4-pr.md §4, with 2A/05 and 2A/04 where LIO sets them;
// PRgeneration after each step as LIO counts it (no bump on unregister); the parameter list
// checks; REGISTER AND MOVE; a missing APTPL directory; and held commands: PREEMPT AND ABORT
// aborts those whose holder-key snapshot matches, plain PREEMPT lets them land after it (the S1
// hazard). Time is simulated: nothing sleeps.
#include "sim_target_test_bench.h"

namespace blkfence::transport::test {
namespace {

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

// --- power cycles (SimTarget::power_cycle) ------------------------------------------------------

// Without APTPL a power cycle forgets every registration and the reservation (PRgeneration 0), says
// so in the history, and leaves every nexus a 29/00 unit attention.
TEST_F(SimTargetTest, APowerCycleWithoutAptplForgetsThePrState) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_FALSE(target.power_cycle(lu));
  EXPECT_TRUE(target.registrations(lu).empty());
  EXPECT_EQ(target.reservation(lu), std::nullopt);
  EXPECT_EQ(target.generation(lu), 0U);
  const PrOutRecord& record = target.history().prouts.back();
  EXPECT_EQ(record.service_action, kPowerCycleRecord);
  EXPECT_EQ(record.unregistered.size(), 4U);
  EXPECT_TRUE(is_unit_attention(run(kB, prin_command(PrInAction::kReadKeys)), kUaPowerOnOrReset));
  EXPECT_TRUE(keys().empty());
}

// With APTPL active (the last REGISTER set it) the registrations and the reservation survive.
TEST_F(SimTargetTest, APowerCycleWithAptplKeepsThePrState) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  ASSERT_TRUE(is_good(prout(kC, codec::prout_register_and_ignore(kKeyC, {.aptpl = true}))));
  ASSERT_TRUE(target.aptpl_active(lu));
  const auto before = target.registrations(lu);
  const std::size_t records = target.history().prouts.size();
  EXPECT_TRUE(target.power_cycle(lu));
  EXPECT_EQ(target.registrations(lu), before);
  ASSERT_TRUE(target.reservation(lu).has_value());
  EXPECT_EQ(target.reservation(lu)->key, kKeyA);
  EXPECT_EQ(target.history().prouts.size(), records);
  EXPECT_TRUE(is_unit_attention(run(kB, prin_command(PrInAction::kReadKeys)), kUaPowerOnOrReset));
}

// A REGISTER with APTPL=0 after one with APTPL=1 turns it off again (the last REGISTER wins).
TEST_F(SimTargetTest, TheLastRegisterDecidesAptpl) {
  ASSERT_TRUE(is_good(prout(kA1, codec::prout_register_and_ignore(kKeyA, {.aptpl = true}))));
  ASSERT_TRUE(target.aptpl_active(lu));
  ASSERT_TRUE(is_good(register_key(kB, kKeyB)));
  EXPECT_FALSE(target.aptpl_active(lu));
  EXPECT_FALSE(target.power_cycle(lu));
  EXPECT_TRUE(target.registrations(lu).empty());
}

// A LU without PTPL_C says so in REPORT CAPABILITIES and refuses APTPL=1.
TEST_F(SimTargetTest, ALuWithoutPtplCRefusesAptpl) {
  target.set_ptpl_capable(lu, false);
  const SimAnswer caps = run(kB, prin_command(PrInAction::kReportCapabilities));
  ASSERT_TRUE(is_good(caps));
  const auto decoded = codec::decode_report_capabilities(caps.data_in);
  ASSERT_TRUE(decoded.has_value());
  EXPECT_FALSE(decoded->ptpl_c);
  EXPECT_TRUE(is_sense(prout(kA1, codec::prout_register_and_ignore(kKeyA, {.aptpl = true})),
                       SenseKey::kIllegalRequest, 0x26, 0x00));
  EXPECT_TRUE(target.registrations(lu).empty());
}

}  // namespace
}  // namespace blkfence::transport::test
