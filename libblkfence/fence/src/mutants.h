// The deliberate protocol bugs ("mutants") of the fence layer, all listed here (tests only).
//
// tests/sim and the lab prove that they catch a broken protocol by running one: each mutant is a
// build of the fence layer with one of the switches below turned on (blkfence_mutant() in
// libblkfence/CMakeLists.txt), never installed. The protocol code tests its switch, a constant, at
// the one place the bug lives (`if constexpr (mutant::...)`, or a term of a condition); in the
// product every switch is false and the hook is discarded at compile time. A reader of the
// protocol can skip those lines. Each is caught by the property named here (tests/sim/README.md
// gives the seed).
// The switches are not inline: namespace-scope constexpr gives each translation unit its own copy
// (internal linkage), as a mutant library mixes objects built with its switch on (the sources that
// test it) and the product's objects built with it off.
#pragma once

namespace blkfence::fence::mutant {

// S2: an acquire opens the gate without the verify read: the simulation and the lab see a writer
// whose key is not the holder, or not the only registrant.
#ifdef BLKFENCE_MUTANT_SKIP_VERIFY
constexpr bool kSkipVerify = true;
#else
constexpr bool kSkipVerify = false;
#endif

// After a fence, the node "heals itself": it registers its old key again on every path and reopens
// the gate (S5, and with it S1). Resource::mutant_reregister in resource_mutants.cc.
#ifdef BLKFENCE_MUTANT_REREGISTER
constexpr bool kReregister = true;
#else
constexpr bool kReregister = false;
#endif

// A release in exclusive mode drops the reservation (RELEASE, then the key unregistered) instead of
// leaving it with the key: every nexus may write again, a node preempted a moment ago included
// (S1). Resource::mutant_release in resource_mutants.cc. In shared mode the same: the member
// RELEASEs and unregisters instead of moving to its departed key, and the last one to leave
// leaves the LUs unreserved.
#ifdef BLKFENCE_MUTANT_RELEASE_DROPS
constexpr bool kReleaseDrops = true;
#else
constexpr bool kReleaseDrops = false;
#endif

// The monitor never closes the gate when the lease runs out without a good check (S2): a node that
// cannot see its LUs keeps its writer running.
#ifdef BLKFENCE_MUTANT_NO_LEASE
constexpr bool kNoLease = true;
#else
constexpr bool kNoLease = false;
#endif

// An acquire reuses the highest epoch it saw instead of drawing one above it (S3).
#ifdef BLKFENCE_MUTANT_NO_EPOCH_BUMP
constexpr bool kNoEpochBump = true;
#else
constexpr bool kNoEpochBump = false;
#endif

// A failed acquire unregisters its key everywhere at once, without reading first what its failed or
// timed-out commands did (S4): a PREEMPT of it that executed made it the holder, and unregistering
// the holder drops the reservation. Resource::mutant_unregister_unread in resource_mutants.cc.
#ifdef BLKFENCE_MUTANT_NO_REREAD
constexpr bool kNoReread = true;
#else
constexpr bool kNoReread = false;
#endif

// In shared mode the monitor ignores a round that shows our key removed (another member fenced
// us): the gate stays open and the lease runs on (S2).
#ifdef BLKFENCE_MUTANT_SHARED_IGNORES_FENCE
constexpr bool kSharedIgnoresFence = true;
#else
constexpr bool kSharedIgnoresFence = false;
#endif

// Primary mode: a promote takes the LUs even after cancel() (its caller went away): a pre_promote
// that the cluster manager killed may still preempt a newer primary (C1).
#ifdef BLKFENCE_MUTANT_PROMOTE_IGNORES_CANCEL
constexpr bool kPromoteIgnoresCancel = true;
#else
constexpr bool kPromoteIgnoresCancel = false;
#endif

// Primary mode: a promote reuses the highest epoch it saw instead of drawing one above it: two
// primaries' tokens carry one epoch, or a newer one a lower (S3).
#ifdef BLKFENCE_MUTANT_PROMOTE_NO_EPOCH_BUMP
constexpr bool kPromoteNoEpochBump = true;
#else
constexpr bool kPromoteNoEpochBump = false;
#endif

// Primary mode: a promote opens the primary's gate whatever its verify read showed (another holder,
// none, our key gone): a primary whose key does not hold every LU (S2).
#ifdef BLKFENCE_MUTANT_PROMOTE_SKIPS_VERIFY
constexpr bool kPromoteSkipsVerify = true;
#else
constexpr bool kPromoteSkipsVerify = false;
#endif

// The holder's monitor leaves alone the keys of its cluster that outrank its own, as it once did
// (R1): a node that died between its REGISTERs and its take keeps a registration, and so write
// access, beside the holder until the next acquire.
#ifdef BLKFENCE_MUTANT_STRAYS_ABOVE_LEFT
constexpr bool kStraysAboveLeft = true;
#else
constexpr bool kStraysAboveLeft = false;
#endif

// An acquire, promote or unfence registers without waiting for the node's earlier writes, as it
// once did (S1): re-keying a nexus of ours that holds with an older key, a write marked with the
// older key outlives the next holder's PREEMPT AND ABORT of the new one; registering a fenced
// nexus again, a write still on its way or held back by the initiator lands.
#ifdef BLKFENCE_MUTANT_REKEY_WITHOUT_DRAIN
constexpr bool kRekeyWithoutDrain = true;
#else
constexpr bool kRekeyWithoutDrain = false;
#endif

// The host's queues of writes (dm-multipath queue_if_no_path) are left queueing while the gate is
// closed, as before blkfence stopped them (S1): a write the map held across a fence goes out once
// the node registered again, and lands. Caught by the lab (smoke/rekey_inflight.sh, case
// queued-mutant).
#ifdef BLKFENCE_MUTANT_KEEP_HOST_QUEUES
constexpr bool kKeepHostQueues = true;
#else
constexpr bool kKeepHostQueues = false;
#endif

}  // namespace blkfence::fence::mutant
