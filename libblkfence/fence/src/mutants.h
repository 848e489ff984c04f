// The deliberate protocol bugs ("mutants") of the fence layer, all listed here (tests only).
//
// tests/sim and the lab prove that they catch a broken protocol by running one: each mutant is a
// build of the fence layer with one of the switches below turned on (blkfence_mutant() in
// libblkfence/CMakeLists.txt), never installed. The protocol code tests its switch with
// `if constexpr (mutant::...)` at the one place the bug lives; in the product every switch is
// false and the hook is discarded at compile time. A reader of the protocol can skip those lines.
#pragma once

namespace blkfence::fence::mutant {

// An acquire opens the gate without the verify read (S2): the simulation and the lab see a writer
// whose key is not the holder, or not the only registrant.
#ifdef BLKFENCE_MUTANT_SKIP_VERIFY
inline constexpr bool kSkipVerify = true;
#else
inline constexpr bool kSkipVerify = false;
#endif

// After a fence, the node "heals itself": it registers its old key again on every path and reopens
// the gate (S5, and with it S1). Resource::mutant_reregister in resource_mutants.cc.
#ifdef BLKFENCE_MUTANT_REREGISTER
inline constexpr bool kReregister = true;
#else
inline constexpr bool kReregister = false;
#endif

}  // namespace blkfence::fence::mutant
