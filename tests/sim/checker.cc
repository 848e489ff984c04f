// The safety checker of the simulation (tests/sim): S1–S5 of docs/protocol.md, each stated
// precisely above its check, judged after the run on its record (history.h). It also replays the
// target's PR OUT history to know which key every removed registration held, and cross-checks that
// replay against the target's final state, so a wrong record shows up as a "checker" violation
// rather than as a silent pass. Pure functions over the record.
#include "checker.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <set>
#include <tuple>

#include "blkfence/codec/cdb.h"

#include "answer.h"

namespace blkfence::sim {
namespace {

using codec::PrOutAction;
using transport::PrOutRecord;
using transport::WriteRecord;

std::uint16_t node_of_key(std::uint64_t key) {
  return static_cast<std::uint16_t>(key >> 32U);
}
std::uint16_t cluster_of_key(std::uint64_t key) {
  return static_cast<std::uint16_t>(key >> 48U);
}
std::uint32_t epoch_of_key(std::uint64_t key) {
  return static_cast<std::uint32_t>(key);
}
// Shared mode: the epoch of a departed member's key (docs/protocol.md, "Shared mode").
constexpr std::uint32_t kDepartedEpoch = 1;

bool shared(const Run& run) {
  return run.mode == fence::Mode::kShared;
}

// Primary mode (shared mode with ResourceOptions::primary): shared(run) holds too.
bool primary(const Run& run) {
  return run.primary;
}

// What an open gate vouches for: exclusive, the sole holder; shared, a member registered under a
// reservation; primary mode, a member registered (the members never reserve), or the primary (a
// gate opened in state held), the holder and registered.
enum class Gauge : std::uint8_t { kSole, kMember, kPrimary };

Gauge gauge_of(const Run& run, bool holds) {
  if (!shared(run)) {
    return Gauge::kSole;
  }
  return primary(run) && holds ? Gauge::kPrimary : Gauge::kMember;
}

std::uint16_t node_of(const Run& run, transport::NexusId nexus) {
  const auto it = run.node_of_nexus.find(nexus);
  return it == run.node_of_nexus.end() ? 0 : it->second;
}

std::string prout_name(std::uint8_t action) {
  if (action == transport::kPowerCycleRecord) {
    return "POWER CYCLE (PR state forgotten)";
  }
  if (action <= static_cast<std::uint8_t>(PrOutAction::kRegisterAndMove)) {
    return std::string(codec::to_string(static_cast<PrOutAction>(action)));
  }
  return "PR OUT " + std::to_string(action);
}

std::string prin_name(std::uint8_t action) {
  if (action <= static_cast<std::uint8_t>(codec::PrInAction::kReadFullStatus)) {
    return std::string(codec::to_string(static_cast<codec::PrInAction>(action)));
  }
  return "PR IN " + std::to_string(action);
}

std::string outcome_text(const transport::SimOutcome& outcome) {
  switch (outcome.status) {
    case 0x00: return "GOOD";
    case 0x18: return "RESERVATION CONFLICT";
    case 0x40: return "TASK ABORTED";
    case 0x08: return "BUSY";
    case 0x02: {
      char text[64];
      (void)std::snprintf(text, sizeof text, "CHECK CONDITION %x/%02x/%02x", outcome.sense_key,
                          outcome.asc, outcome.ascq);
      return text;
    }
    default: return "status " + std::to_string(outcome.status);
  }
}

// A PR OUT completion after which S4 wants a read: anything but GOOD, except the answers that say
// the command did not execute (answer::did_not_execute, the checker's own reading of the status).
bool wants_read(const Command& command) {
  return !answer::good(command) && !answer::did_not_execute(command);
}

// One node's view of its own history, in the order it happened.
struct Step {
  std::uint64_t seq = 0;
  const Entry* entry = nullptr;      // a trace entry, or
  const Command* command = nullptr;  // a command's submission or completion
  bool completion = false;
};

std::vector<Step> collect_steps(const Run& run, std::uint16_t node) {
  std::vector<Step> steps;
  for (const Entry& entry : run.trace) {
    if (entry.node == node) {
      steps.push_back(Step{entry.seq, &entry, nullptr, false});
    }
  }
  for (const Command& command : run.commands) {
    if (command.node != node) {
      continue;
    }
    steps.push_back(Step{command.submitted_seq, nullptr, &command, false});
    if (command.completed) {
      steps.push_back(Step{command.completed_seq, nullptr, &command, true});
    }
  }
  std::sort(steps.begin(), steps.end(), [](const Step& a, const Step& b) { return a.seq < b.seq; });
  return steps;
}

// Every node's steps, built once for all the checks.
using Steps = std::map<std::uint16_t, std::vector<Step>>;

std::set<std::uint16_t> nodes_of(const Run& run) {
  std::set<std::uint16_t> nodes;
  for (const auto& [nexus, node] : run.node_of_nexus) {
    nodes.insert(node);
  }
  return nodes;
}

// The target's registrations replayed from its PR OUT history: which key each removed
// registration held, and the holder before each record.
struct Replay {
  struct Removal {
    const PrOutRecord* record = nullptr;
    transport::NexusId nexus = 0;
    std::uint64_t key = 0;
  };
  std::vector<Removal> removals;
  std::map<std::uint64_t, std::optional<std::uint64_t>> holder_before;  // by record sequence
  // Per LU: (sequence, holder afterwards) of every PR OUT, in order.
  std::map<transport::LuId, std::vector<std::pair<std::uint64_t, std::optional<std::uint64_t>>>>
      holders;

  // The holder of a LU just before the target's record number `sequence`.
  std::optional<std::uint64_t> holder_at(transport::LuId lu, std::uint64_t sequence) const {
    const auto found = holders.find(lu);
    if (found == holders.end()) {
      return std::nullopt;
    }
    std::optional<std::uint64_t> holder;
    for (const auto& [seq, after] : found->second) {
      if (seq >= sequence) {
        break;
      }
      holder = after;
    }
    return holder;
  }
};

Replay replay(const Run& run, std::vector<Violation>& violations) {
  Replay out;
  std::map<transport::LuId, std::map<transport::NexusId, std::uint64_t>> keys;
  std::map<transport::LuId, std::optional<std::uint64_t>> holder;
  for (const PrOutRecord& record : run.target->prouts) {
    auto& lu = keys[record.lu];
    out.holder_before[record.sequence] = holder[record.lu];
    for (const transport::NexusId nexus : record.unregistered) {
      const auto it = lu.find(nexus);
      if (it == lu.end()) {
        violations.push_back({"checker",
                              "the replay lost track of a registration the target removed",
                              {describe(run, record)}});
        continue;
      }
      out.removals.push_back({&record, nexus, it->second});
      lu.erase(it);
    }
    const bool registration =
        record.service_action == static_cast<std::uint8_t>(PrOutAction::kRegister) ||
        record.service_action ==
            static_cast<std::uint8_t>(PrOutAction::kRegisterAndIgnoreExistingKey);
    if (registration && record.outcome.status == 0 && record.sa_key != 0) {
      lu[record.nexus] = record.sa_key;
    }
    holder[record.lu] = record.reservation ? std::optional(record.reservation->key) : std::nullopt;
    out.holders[record.lu].emplace_back(record.sequence, holder[record.lu]);
  }
  for (std::size_t lu = 0; lu < run.final_lus.size(); ++lu) {
    std::map<transport::NexusId, std::uint64_t> actual;
    for (const auto& registration : run.final_lus[lu].registrations) {
      actual[registration.nexus] = registration.key;
    }
    if (actual != keys[static_cast<transport::LuId>(lu)]) {
      violations.push_back(
          {"checker",
           "the replayed registrations of LU " + std::to_string(lu) + " differ from the target's",
           {}});
    }
    if (holder[static_cast<transport::LuId>(lu)] != run.final_lus[lu].holder) {
      violations.push_back(
          {"checker",
           "the replayed holder of LU " + std::to_string(lu) + " differs from the target's",
           {}});
    }
  }
  return out;
}

// One monitor round of a node: its PR INs submitted at one instant, each replaced by the engine's
// next attempt of the same request (a resend, or the next path), if any.
struct Round {
  std::vector<const Command*> reads;
  std::uint64_t first_seq = 0;

  bool ended() const {
    return std::all_of(reads.begin(), reads.end(),
                       [](const Command* read) { return read->completed; });
  }
  const Command& last() const {
    return **std::max_element(reads.begin(), reads.end(), [](const Command* a, const Command* b) {
      return a->completed_seq < b->completed_seq;
    });
  }
  // The first read that shows `key` is not the holder, or not registered, on its LU. In shared
  // mode only the registration counts: another member's reservation, or none, is no loss.
  const Command* reveals_loss(std::uint64_t key, bool shared_mode) const {
    return reveals_loss(key, shared_mode, {key});
  }
  // The same, where any of `keys` registered is as good as `key` (primary mode: a member's gate
  // stays open while its promote moves its nexuses to a new key).
  const Command* reveals_loss(std::uint64_t key, bool shared_mode,
                              const std::set<std::uint64_t>& keys) const {
    for (const Command* read : reads) {
      const auto view = answer::view_of(*read);
      if (view && ((!shared_mode && view->shows_reservation && view->holder != key) ||
                   (view->shows_keys &&
                    std::none_of(view->keys.begin(), view->keys.end(),
                                 [&keys](std::uint64_t k) { return keys.contains(k); })))) {
        return read;
      }
    }
    return nullptr;
  }
};

std::vector<Round> rounds_of(const Run& run, std::uint16_t node_id) {
  std::vector<const Command*> reads;
  for (const Command& command : run.commands) {
    if (command.node == node_id && command.is_prin()) {
      reads.push_back(&command);
    }
  }
  std::sort(reads.begin(), reads.end(),
            [](const Command* a, const Command* b) { return a->submitted_seq < b->submitted_seq; });
  std::vector<Round> rounds;
  // (boot, request) -> (round, slot) of the latest attempt of each request: the engine's next
  // attempt of it (a resend after an answer that says it did not execute, or the read sent on the
  // next path after a transport error) takes its place in its round. The request, not the bytes:
  // a new round may send the same bytes on the same nexus while an older round's read waits to be
  // resent, and taking one for the other mixes two rounds.
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::pair<std::size_t, std::size_t>> retry;
  for (const Command* read : reads) {
    const auto key = std::pair(read->boot, read->request);
    std::pair<std::size_t, std::size_t> at;
    const auto awaiting = retry.find(key);
    if (awaiting != retry.end() &&
        rounds[awaiting->second.first].reads[awaiting->second.second]->completed_seq <
            read->submitted_seq) {
      at = awaiting->second;
      rounds[at.first].reads[at.second] = read;
    } else {
      if (rounds.empty() || rounds.back().reads.front()->submitted != read->submitted ||
          rounds.back().reads.front()->boot != read->boot) {
        rounds.push_back(Round{{}, read->submitted_seq});
      }
      at = {rounds.size() - 1, rounds.back().reads.size()};
      rounds.back().reads.push_back(read);
    }
    retry[key] = at;
  }
  return rounds;
}

// S1 (docs/protocol.md: no write from a nexus whose key was preempted lands after the preempt
// completed), on the target's own clock. Let P be a PR OUT record on LU L (target sequence s_P,
// executed at P.at) issued from a nexus of node M with key K_M, whose `unregistered` list removed
// a registration holding key K_V of another node V (V != M), where K_M has a greater epoch than
// K_V or K_V had opened V's gate before P.at: P fenced V's token. (A racer's lower-epoch preempt
// of a registration that never opened a gate fences nothing: that acquire is still running and
// may legitimately re-register and win.) Then no write W that landed on L with target sequence
// s_W > s_P through a nexus X whose registration P removed (or that was registered with K_V after
// P, below) was issued by V's writer under a token of epoch <= epoch(K_V). In words: once a
// higher epoch's acquire took L from V's key of epoch e on nexus X, nothing V wrote with epoch e
// or older lands on L through X, whether it was on the wire, held in the target's task set
// (PREEMPT AND ABORT must abort it) or sent later by a writer that did not know yet. S1 is judged
// per I_T nexus: a node with two keys on L (a nexus left on an older key by a REGISTER that timed
// out) is cut off from L through each nexus when that nexus's registration goes, and a write
// through a nexus still registered lands legitimately; the new holder's acquire or promote
// returns only once every key of the old one is gone (its verify), so nothing lands after it.
//
// Plain PREEMPT (run.preempt_abort false) does not abort the victim's task set, so S1 as stated
// holds only with PREEMPT AND ABORT (docs/protocol.md). With plain PREEMPT the checker asserts the
// property that remains: no W that the target accepted (passed its checks) after P lands; a W
// accepted before P (write.accepted_sequence <= s_P) and landing after it is excused and reported
// apart (held_across_plain_preempt). run.strict_s1 judges plain runs by S1 as stated.
//
// One window is open, and excused (docs/protocol.md, "Paths that come and go"): SPC-4 has no
// conditional registration, so a new path's REGISTER AND IGNORE EXISTING KEY that V sent while its
// reads showed K_V current may execute just after P removed K_V. The new nexus then carries K_V,
// and under a Registrants Only type V's writer can write through it until V learns of the fence.
// W is excused when (a) it came through a nexus X of V that a REGISTER from X with K_V registered
// after P and before W, (b) V sent that REGISTER, and V's writer issued W, before V could know:
// before the end of V's first round of reads submitted after P, all back, that shows K_V gone (as
// S2's reveal reads it), and before V's gate closed after P. A write issued later, through a nexus
// registered before P, or through one that V registered again once it could know (an unfence or
// acquire after the fence: its REGISTER waits for V's writes in flight, docs/protocol.md, "Writes
// queued in the initiator"), is a violation.
//
// Shared mode (docs/protocol.md, "Shared mode"): every key has epoch 0, so no epoch outranks
// another and only the token rule names a fence: P is another node's PREEMPT or PREEMPT AND ABORT
// (fence_node) of K_V, which had opened V's gate since V's last unfence() call before P.at. (A
// registration of an unfence still running at P is a racer's, as above: that unfence, an order
// the cluster manager gave before the fence, may register again and succeed.) Every write of V
// carries epoch 0, so every write of V that lands on L after P is a violation, unless V's driver
// called unfence() after P.at and before V's writer issued W (an explicit unfence ends the fence:
// V registers K_V again and may write; a write issued before it is a stale one, which the
// unfence's REGISTER must not let land: it waits for V's writes in flight, docs/protocol.md,
// "Writes queued in the initiator"), or the late new-path registration above excuses it. An
// unreserved L excuses nothing: the All Registrants reservation stays while any member is
// registered, and a release moves the member's nexuses to its departed key instead of unregistering
// them (docs/protocol.md, "Shared mode"), so no release leaves L open to every nexus.
//
// Primary mode (shared mode with primary): as in shared mode, the token rule alone names a fence
// (the keys now have epochs, but a promote whose new key was preempted while it ran fails and stays
// a member, whose writes then land legitimately): P removed K_V after K_V had opened V's gate since
// V's last unfence() or promote() call before P.at; typically a promote's PREEMPT of the old
// primary's key. The same excuses hold: an unfence() or promote() of V after P.at and before W was
// issued, and the late new-path registration. An unreserved L excuses nothing here either: only a
// promote removes keys in primary mode (fence_node is refused), and it removes a key only from a
// LU it reserved or took. One more excuse is Linux's target's, not SPC-4's (which aborts the tasks
// of the preempted nexuses, 5.13.11.2.6): a W the target accepted before P while L's holder was no
// key of V's. LIO marks each command with the holder's key when it accepts it, and PREEMPT AND
// ABORT aborts the commands marked with the preempted key, so a write held from before the first
// promote or from when V was a member is not aborted (docs/protocol.md, "Primary mode"). A write
// marked with an older key of V's is no excuse: V re-keys its holding nexus only once its writes
// are done (marked_beyond_the_abort). The new-path
// window's "V knows" reads K_V's loss as the primary's monitor does (another holder, or K_V not
// registered) when K_V opened a gate as the primary's, and as a member's (K_V not registered)
// otherwise.

// Primary mode: whether the key opened a gate as the primary's (which the monitor fences when it
// is no longer the holder, as in exclusive mode), not as a member's.
bool opened_as_primary(const Run& run, std::uint64_t key) {
  return std::any_of(run.trace.begin(), run.trace.end(), [key](const Entry& entry) {
    return entry.kind == EntryKind::kGate && entry.open && entry.holds && entry.key == key;
  });
}

// The REGISTERs (and REGISTER AND IGNORE EXISTING KEYs) that registered `key` on the write's LU
// through the write's nexus, executed after the target's sequence `after` and before the write.
std::vector<const PrOutRecord*> registrations_between(const Run& run, std::uint64_t key,
                                                      std::uint64_t after,
                                                      const WriteRecord& write) {
  std::vector<const PrOutRecord*> found;
  for (const PrOutRecord& record : run.target->prouts) {
    const bool registration =
        record.service_action == static_cast<std::uint8_t>(PrOutAction::kRegister) ||
        record.service_action ==
            static_cast<std::uint8_t>(PrOutAction::kRegisterAndIgnoreExistingKey);
    if (registration && record.outcome.status == 0 && record.sa_key == key &&
        record.lu == write.lu && record.nexus == write.nexus && record.sequence > after &&
        record.sequence < write.sequence) {
      found.push_back(&record);
    }
  }
  return found;
}

// Whether a REGISTER from the write's nexus registered `key` there after the fence and before the
// write: the nexus then carries the fenced key although the fence did not remove it.
bool registered_after(const Run& run, const PrOutRecord& fence, std::uint64_t key,
                      const WriteRecord& write) {
  return !registrations_between(run, key, fence.sequence, write).empty();
}

// When node could first know that fence removed key: the end of its first round of reads
// submitted after the fence, all back, that reveals the loss, or its gate closing after the fence,
// whichever came first (run.end when neither did).
Time knows_of_the_fence(const Run& run, const PrOutRecord& fence, std::uint64_t key,
                        std::uint16_t node) {
  Time knows = run.end;
  for (const Round& round : rounds_of(run, node)) {
    if (round.reads.front()->submitted >= fence.at && round.ended() &&
        round.reveals_loss(key, shared(run) && !opened_as_primary(run, key)) != nullptr) {
      knows = std::min(knows, round.last().completed_at);
    }
  }
  for (const Entry& entry : run.trace) {
    if (entry.node == node && entry.kind == EntryKind::kGate && !entry.open &&
        entry.at >= fence.at) {
      knows = std::min(knows, entry.at);
      break;
    }
  }
  return knows;
}

bool late_registration_excuses(const Run& run, const PrOutRecord& fence, std::uint64_t key,
                               const WriteRecord& write, const WriteIssue& issue) {
  const auto registrations = registrations_between(run, key, fence.sequence, write);
  if (registrations.empty()) {
    return false;
  }
  const Time knows = knows_of_the_fence(run, fence, key, issue.node);
  if (issue.issued >= knows) {
    return false;
  }
  // The REGISTER must be the race SPC-4 forces, sent while V's reads still showed K_V: one that V
  // sent once it could know (an unfence, an acquire, a rejoin) is its own decision, and a write of
  // V's from before must not land through it (docs/protocol.md, "Writes queued in the initiator").
  return std::any_of(registrations.begin(), registrations.end(), [&](const PrOutRecord* record) {
    return std::any_of(run.commands.begin(), run.commands.end(), [&](const Command& command) {
      // The attempt that executed: still outstanding then, or without an answer (one that timed
      // out may execute late).
      return command.node == issue.node && command.registers() && command.sa_key == key &&
             command.lu == record->lu && command.nexus == record->nexus &&
             command.submitted <= record->at &&
             (!command.completed || record->at <= command.completed_at ||
              command.outcome == transport::Outcome::kIndeterminate) &&
             command.submitted < knows;
    });
  });
}

// Shared mode: whether the node's driver called unfence() at some moment in [from, to).
bool unfenced_between(const Run& run, std::uint16_t node, Time from, Time to) {
  return std::any_of(run.trace.begin(), run.trace.end(), [&](const Entry& entry) {
    return entry.node == node && entry.kind == EntryKind::kAcquireCalled && entry.at >= from &&
           entry.at < to;
  });
}

// Shared mode: whether the node's gate opened with `key` after its last unfence() call before `at`
// (or after its daemon adopted the key at start), at or before `at`.
bool opened_since_unfence(const Run& run, std::uint16_t node, std::uint64_t key, Time at) {
  bool opened = false;
  for (const Entry& entry : run.trace) {
    if (entry.at > at) {
      break;
    }
    if (entry.node == node && entry.kind == EntryKind::kAcquireCalled) {
      opened = false;
    } else if (entry.node == node && entry.kind == EntryKind::kGate && entry.open &&
               entry.key == key) {
      opened = true;
    }
  }
  return opened;
}

// The holder of a write's LU when the target accepted the write (passed its checks), which is the
// key LIO marks a held command with and PREEMPT AND ABORT aborts by.
std::optional<std::uint64_t> holder_when_accepted(const Run& run, const Replay& replayed,
                                                  const WriteRecord& write) {
  std::uint64_t after = 0;  // the first record after the acceptance
  for (const PrOutRecord& record : run.target->prouts) {
    if (record.lu == write.lu && record.at <= write.accepted_at) {
      after = record.sequence + 1;
    }
  }
  return replayed.holder_at(write.lu, after);
}

// Primary mode: a write accepted before the fence, marked with a key the fence's PREEMPT AND ABORT
// does not abort: none (the LU was unreserved), another node's (the victim was a member under that
// node's reservation), or a newer key of the victim's (a promote removes the old primary's stale
// keys before its holder key, and a write through a stale key's nexus is marked with the holder's).
// Never an older key of the victim's, or the removed one: the victim re-keys a holding nexus only
// once its writes under the older key are done (docs/protocol.md, "Re-keying a holding nexus").
bool marked_beyond_the_abort(const Run& run, const Replay& replayed, const WriteRecord& write,
                             std::uint16_t victim, std::uint64_t removed) {
  const auto mark = holder_when_accepted(run, replayed, write);
  return !mark || cluster_of_key(*mark) != run.cluster_id || node_of_key(*mark) != victim ||
         epoch_of_key(*mark) > epoch_of_key(removed);
}

// Whether the node's driver had an acquire (or unfence, or promote) running at `at` that was
// still running when the command was submitted: begun at or before `at`, and not ended (done, or
// the daemon dead or restarted) between its call and the command.
bool submitted_by_operation_running_at(const Run& run, const Command& command, Time at) {
  const Entry* called = nullptr;
  for (const Entry& entry : run.trace) {
    if (entry.seq >= command.submitted_seq) {
      break;
    }
    if (entry.node != command.node) {
      continue;
    }
    if (entry.kind == EntryKind::kAcquireCalled) {
      called = &entry;
    } else if (entry.kind == EntryKind::kOpDone || entry.kind == EntryKind::kCrash ||
               entry.kind == EntryKind::kBoot) {
      called = nullptr;
    }
  }
  return called != nullptr && called->at <= at;
}

// Whether the write's nexus was registered again with `key` after the power cycle, by a command
// of an operation of the node that was already running when the fence executed: an acquire begun
// before the fence and ended after the power loss, when nothing on the LU could show the newer key
// any more. A registration by anything else (a node repairing its own key after the power loss, a
// new path of a fenced node) excuses nothing.
bool reacquired_across(const Run& run, const PrOutRecord& fence, const PrOutRecord& power_cycle,
                       std::uint64_t key, const WriteRecord& write) {
  const std::uint16_t node = node_of(run, write.nexus);
  for (const PrOutRecord* record : registrations_between(run, key, power_cycle.sequence, write)) {
    for (const Command& command : run.commands) {
      if (command.node == node && command.registers() && command.sa_key == key &&
          command.lu == record->lu && command.nexus == record->nexus &&
          command.submitted <= record->at &&
          (!command.completed || record->at <= command.completed_at) &&
          submitted_by_operation_running_at(run, command, fence.at)) {
        return true;
      }
    }
  }
  return false;
}

// A target without APTPL lost power after the fence and forgot its PR state, the fence with it:
// the LU has had no reservation since, so every nexus may write until a node reserves it again,
// the fenced node's included until it notices; or the fenced node's acquire, under way when the
// fence executed, registered its key again after the power loss and took the LU
// (reacquired_across). That is the hazard docs/protocol.md ("Power loss and APTPL") states for such
// targets, which no initiator can close; S3 is still judged across it.
bool forgotten_since(const Run& run, const Replay& replayed, const PrOutRecord& fence,
                     std::uint64_t key, const WriteRecord& write) {
  const bool unreserved = !replayed.holder_at(write.lu, write.sequence);
  return std::any_of(
      run.target->prouts.begin(), run.target->prouts.end(), [&](const PrOutRecord& record) {
        return record.lu == write.lu && record.service_action == transport::kPowerCycleRecord &&
               record.sequence > fence.sequence && record.sequence < write.sequence &&
               (unreserved || reacquired_across(run, fence, record, key, write));
      });
}

// check_s1 puts the violations in `violations` and, under plain PREEMPT, the landings of writes
// held across the preempt in `held` (see above).
void check_s1(const Run& run, const Replay& replayed, std::vector<Violation>& violations,
              std::vector<Violation>& held) {
  const bool plain = !run.preempt_abort && !run.strict_s1;
  // (LU, victim node) -> the fencing removals, in target order.
  std::map<std::uint64_t, Time> opened;  // keys that opened a gate, and when they first did
  for (const Entry& entry : run.trace) {
    if (entry.kind == EntryKind::kGate && entry.open && entry.key) {
      opened.emplace(*entry.key, entry.at);
    }
  }
  std::map<std::pair<transport::LuId, std::uint16_t>, std::vector<const Replay::Removal*>> fences;
  for (const Replay::Removal& removal : replayed.removals) {
    // A power cycle that forgot the PR state fenced nobody: the LU is unreserved until a node
    // acquires, the holder that has not noticed yet is still the newest token, and once another
    // node reserves, the target refuses the unregistered nexus's writes itself.
    if (removal.record->service_action == transport::kPowerCycleRecord) {
      continue;
    }
    const std::uint16_t by = node_of(run, removal.record->nexus);
    const std::uint16_t victim = node_of(run, removal.nexus);
    const auto gate = opened.find(removal.key);
    const bool token = shared(run)
                           ? opened_since_unfence(run, victim, removal.key, removal.record->at)
                           : gate != opened.end() && gate->second <= removal.record->at;
    // Shared and primary mode: the token rule only (a promote whose key was preempted while it ran
    // may stay a member, and its node's writes then land legitimately).
    const bool outranked =
        !shared(run) && epoch_of_key(removal.record->key) > epoch_of_key(removal.key);
    if (by != victim && (outranked || token)) {
      fences[{removal.record->lu, victim}].push_back(&removal);
    }
  }
  for (const WriteRecord& write : run.target->writes) {
    if (!write.landed) {
      continue;
    }
    const auto issue = run.writes.find(write.lba);
    if (issue == run.writes.end()) {
      violations.push_back(
          {"checker", "a write landed that no writer issued", {describe(run, write)}});
      continue;
    }
    const auto found = fences.find({write.lu, issue->second.node});
    if (found == fences.end()) {
      continue;
    }
    for (const Replay::Removal* removal : found->second) {
      // Per I_T nexus: the removal fenced the nexus the write came through, or that nexus was
      // registered with the fenced key after it (a late registration, judged below).
      const bool this_nexus = removal->nexus == write.nexus ||
                              registered_after(run, *removal->record, removal->key, write);
      if (this_nexus && removal->record->sequence < write.sequence &&
          issue->second.epoch() <= epoch_of_key(removal->key) &&
          !(shared(run) &&
            (unfenced_between(run, issue->second.node, removal->record->at, issue->second.issued) ||
             (run.primary && write.accepted_at < removal->record->at &&
              marked_beyond_the_abort(run, replayed, write, issue->second.node, removal->key)))) &&
          !late_registration_excuses(run, *removal->record, removal->key, write, issue->second) &&
          !forgotten_since(run, replayed, *removal->record, removal->key, write)) {
        const auto holder = replayed.holder_at(write.lu, write.sequence);
        const bool held_across = plain && write.accepted_sequence <= removal->record->sequence;
        (held_across ? held : violations)
            .push_back({"S1",
                        "a write of node " + std::to_string(issue->second.node) +
                            " stamped epoch " + std::to_string(issue->second.epoch()) +
                            " landed on LU " + std::to_string(write.lu) + " after node " +
                            std::to_string(node_of(run, removal->record->nexus)) +
                            " removed its key " + format_key(removal->key) + " there" +
                            (holder ? "; the LU was reserved by " + format_key(*holder)
                                    : "; the LU had no reservation any more"),
                        {"removed by: " + describe(run, *removal->record),
                         "issued:     " + describe(issue->second),
                         "landed:     " + describe(run, write)}});
        break;
      }
    }
  }
}

std::string lu_state_text(const LuState& state) {
  std::string text = "holder " + (state.holder ? format_key(*state.holder) : "none") + ", keys {";
  for (std::size_t i = 0; i < state.registrations.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::string("nexus ") +
            std::to_string(state.registrations[i].nexus) + ": " +
            format_key(state.registrations[i].key);
  }
  return text + "}";
}

// Whether K is the holder and the only key registered.
bool sole_holder(const LuState& state, std::uint64_t key) {
  return state.holder == key && !state.registrations.empty() &&
         std::all_of(state.registrations.begin(), state.registrations.end(),
                     [key](const transport::SimRegistration& r) { return r.key == key; });
}

// Shared mode: whether K is registered and some key, any member's, holds the reservation.
bool registered_and_reserved(const LuState& state, std::uint64_t key) {
  return state.holder.has_value() &&
         std::any_of(state.registrations.begin(), state.registrations.end(),
                     [key](const transport::SimRegistration& r) { return r.key == key; });
}

bool registered(const LuState& state, std::uint64_t key) {
  return std::any_of(state.registrations.begin(), state.registrations.end(),
                     [key](const transport::SimRegistration& r) { return r.key == key; });
}

// What a gate's key must be on every LU while the gate is open: the sole holder, or in shared mode
// registered under a reservation; in primary mode a member's registered, the primary's the holder
// and registered.
bool gate_justified(const Run& run, const LuState& state, std::uint64_t key, bool holds) {
  switch (gauge_of(run, holds)) {
    case Gauge::kSole: return sole_holder(state, key);
    case Gauge::kPrimary: return state.holder == key && registered(state, key);
    case Gauge::kMember:
      return primary(run) ? registered(state, key) : registered_and_reserved(state, key);
  }
  return false;
}

// S2 (the gate is open only while our key is the verified holder on every LU), in two parts.
// At every gate opening, at time t with key K justified by a verify read issued at
// v = verified_since: on every LU, K is the holder and the only registered key at t (the
// target's state read directly in the on_gate callback), unless PR OUTs from other nodes' nexuses
// that executed (GOOD) on that LU in (v, t], which the read could not have seen, explain every
// difference: each other key registered was registered by one of them, K missing was removed by
// one (from a nexus of this node), another holder or none came from one that changed the
// reservation. A PR OUT of the node itself is no excuse: every one it sent for this key was
// answered before the verify read was issued. At the end of the quiet phase (no faults, every link
// up, nothing paused): at most one node's gate is open, and an open gate's key is the holder and
// only registrant on every LU (so every node whose key is not the holder has its gate closed).
//
// Shared mode: K must be registered on every LU, and every LU must have a reservation, whoever
// holds it (gate_justified); other members' registrations are no difference to explain, and the
// missing reservation is explained as the holder above is. Several gates may be open at once, at
// the end too, where each open gate's key is registered on every LU and every LU is reserved.
//
// Primary mode: a gate opened as a member's (any state but held) needs K registered on every LU,
// reserved or not (the members never reserve); one opened as the primary's (state held: a promote,
// an adoption, a reopening after lost contact) needs K the holder and registered on every LU,
// other members' registrations being no difference to explain. A member's gate stays open while
// its promote moves its nexuses to the new key: when that promote succeeds, the primary's gate
// begins then (node.cc records it: Resource::set_gate tells the observer nothing when the gate is
// open already) and is judged as an opening; when it fails, the member's gate goes on with the
// new key and is not a new opening. At the end at most one gate is open as the primary's.
void check_s2(const Run& run, const Replay& replayed, std::vector<Violation>& violations) {
  for (const Entry& entry : run.trace) {
    if (entry.kind != EntryKind::kGate || !entry.open || (entry.rekeyed && !entry.holds)) {
      continue;  // a member's key changed by its failed promote: the member's gate stays open
    }
    if (!entry.key) {
      violations.push_back({"S2", "a gate opened without a key", {describe(entry)}});
      continue;
    }
    for (std::size_t lu = 0; lu < entry.target.size(); ++lu) {
      if (gate_justified(run, entry.target[lu], *entry.key, entry.holds)) {
        continue;
      }
      std::vector<std::string> lines{describe(entry), "LU " + std::to_string(lu) + " then: " +
                                                          lu_state_text(entry.target[lu])};
      // What the verify read could not have seen must explain every difference: another node's
      // PR OUT that executed GOOD on the LU in (v, t] and made it.
      const LuState& state = entry.target[lu];
      const std::uint64_t key = *entry.key;
      const Gauge gauge = gauge_of(run, entry.holds);
      bool holder_explained =
          gauge == Gauge::kMember ? state.holder.has_value() || primary(run) : state.holder == key;
      bool key_explained =
          std::any_of(state.registrations.begin(), state.registrations.end(),
                      [key](const transport::SimRegistration& r) { return r.key == key; });
      std::set<std::uint64_t> intruders;
      for (const auto& registration : state.registrations) {
        if (registration.key != key && !shared(run)) {
          intruders.insert(registration.key);
        }
      }
      for (const PrOutRecord& record : run.target->prouts) {
        if (record.lu != lu || record.at > entry.at) {
          continue;
        }
        if (record.at + run.lease >= entry.verified_since) {
          lines.push_back(describe(run, record));
        }
        if (record.at <= entry.verified_since || record.outcome.status != 0 ||
            node_of(run, record.nexus) == entry.node) {
          continue;
        }
        const bool registration =
            record.service_action == static_cast<std::uint8_t>(PrOutAction::kRegister) ||
            record.service_action ==
                static_cast<std::uint8_t>(PrOutAction::kRegisterAndIgnoreExistingKey);
        if (registration) {
          intruders.erase(record.sa_key);
        }
        // It removed a registration of this node (K's), or it changed the reservation.
        if (std::any_of(
                record.unregistered.begin(), record.unregistered.end(),
                [&](transport::NexusId nexus) { return node_of(run, nexus) == entry.node; })) {
          key_explained = true;
        }
        const auto before = replayed.holder_before.find(record.sequence);
        const std::optional<std::uint64_t> after =
            record.reservation ? std::optional(record.reservation->key) : std::nullopt;
        if (before != replayed.holder_before.end() && before->second != after && after != key) {
          holder_explained = true;
        }
      }
      const bool excused = holder_explained && key_explained && intruders.empty();
      if (!excused) {
        violations.push_back(
            {"S2",
             "node " + std::to_string(entry.node) + " opened its gate with " +
                 format_key(*entry.key) + " while LU " + std::to_string(lu) +
                 (gauge == Gauge::kMember    ? primary(run) ? " did not have it registered"
                                                            : " did not have it registered under a "
                                                              "reservation"
                  : gauge == Gauge::kPrimary ? " did not have it as holder, registered"
                                             : " did not have it as sole holder"),
             lines});
      }
    }
  }
  std::vector<const NodeEnd*> open;
  std::size_t primaries = 0;
  for (const NodeEnd& node : run.final_nodes) {
    if (node.gate_open) {
      open.push_back(&node);
      primaries += node.state == "held" ? 1U : 0U;
    }
  }
  if ((open.size() > 1 && !shared(run)) || (primary(run) && primaries > 1)) {
    std::vector<std::string> lines;
    lines.reserve(open.size());
    for (const NodeEnd* node : open) {
      lines.push_back("node " + std::to_string(node->node) + " gate open with " +
                      (node->key ? format_key(*node->key) : "no key") + " (" + node->state + ")");
    }
    violations.push_back({"S2",
                          primary(run) ? "more than one gate is open as the primary at the end"
                                       : "more than one gate is open at the end",
                          lines});
  }
  for (const NodeEnd* node : open) {
    for (std::size_t lu = 0; lu < run.final_lus.size(); ++lu) {
      if (!node->key ||
          !gate_justified(run, run.final_lus[lu], *node->key, node->state == "held")) {
        violations.push_back(
            {"S2",
             "at the end node " + std::to_string(node->node) + "'s gate is open but its key is " +
                 (primary(run)  ? node->state == "held" ? "not the holder, registered, of LU "
                                                        : "not registered on LU "
                  : shared(run) ? "not registered under a reservation on LU "
                                : "not the sole holder of LU ") +
                 std::to_string(lu),
             {"node " + std::to_string(node->node) + " key " +
                  (node->key ? format_key(*node->key) : "none") + " (" + node->state + ")",
              "LU " + std::to_string(lu) + ": " + lu_state_text(run.final_lus[lu])}});
      }
    }
  }
}

// S2, continuously: a gate stays open only while the node's own reads keep showing its key as the
// holder, and closes at the first of its monitor's reads that shows otherwise. The checker reads
// the PR IN parameter data itself (answer.h). For each interval in which node N's gate is open
// with key K (from the gate's opening to its closing, or to the end of the run):
// (lease)  For every LU, let v(LU) be the submission time of the latest READ RESERVATION of N's
//          current daemon on that LU that completed GOOD showing K as the holder, among those
//          reaped so far. The gate is closed by D = min over the LUs of v(LU) + lease: at D
//          itself, or, when N is paused at D (its daemon cannot act), at the moment it resumes. A
//          read reaped at that moment still counts, as the daemon handles its answers before its
//          timers. A gate that opens with some LU lacking such a read breaks it at once.
// (reveal) A round of N's monitor (its PR INs submitted at one instant, each followed through the
//          engine's further attempts of its request: resends, the next path) whose reads are all
//          back, and one of which, answered GOOD, shows on some LU another holder or no reservation
//          (READ RESERVATION) or K missing (READ KEYS), closes the gate when it completes: the gate
//          is not open after the round's last answer was reaped. Its other reads may have failed: a
//          failed read proves nothing, but does not undo what another one showed. Rounds during
//          which an operation of the resource ran (kBusy) are its own reads, not the monitor's, and
//          are not judged.
// Together: a preempt of N's key is acted on within one check interval plus the round trip of the
// round that sees it, or, when no round gets through, within the lease of the last good one.
// Shared mode: the gate's key is registered, not the holder, so the lease runs from READ KEYS
// answers (GOOD) showing K registered, not READ RESERVATION answers showing K as holder; and a
// round reveals the loss only by a READ KEYS answer (GOOD) without K: a READ RESERVATION showing
// another member as holder, or none, is no loss (the monitor reserves again).
// Primary mode: a member's gate reads as in shared mode, except that any key its node registered
// while the gate was open counts as its key (its promote moved its nexuses to a new key, and the
// node stayed registered throughout; span_keys); the primary's gate reads as in exclusive mode
// (READ RESERVATION showing K as holder; a round reveals a loss by another holder, none, or K not
// registered), other members' registrations being none of its business.
struct GateSpan {
  const Entry* open = nullptr;
  const Entry* close = nullptr;  // nullptr: still open at the end
  Time until{0};
};

struct NodeRecord {
  std::vector<GateSpan> gates;
  std::vector<std::pair<Time, Time>> pauses;  // [paused, resumed)
  std::vector<const Entry*> busy;             // kBusy entries, in order
  std::vector<const Entry*> boots;
};

std::map<std::uint16_t, NodeRecord> node_records(const Run& run) {
  std::map<std::uint16_t, NodeRecord> out;
  std::map<std::uint16_t, std::optional<Time>> paused;
  for (const Entry& entry : run.trace) {
    NodeRecord& node = out[entry.node];
    switch (entry.kind) {
      case EntryKind::kGate:
        if (entry.open) {
          if (node.gates.empty() || node.gates.back().close != nullptr ||
              node.gates.back().open == nullptr) {
            node.gates.push_back(GateSpan{&entry, nullptr, run.end});
          } else if (primary(run) && node.gates.back().open->holds != entry.holds) {
            // Primary mode: a member became the primary with its gate open (a promote): a new
            // span. A member whose key changed (a failed promote) stays one span, which its
            // node's new registrations keep justified (span_keys).
            node.gates.back().close = &entry;
            node.gates.back().until = entry.at;
            node.gates.push_back(GateSpan{&entry, nullptr, run.end});
          }
        } else if (!node.gates.empty() && node.gates.back().close == nullptr) {
          node.gates.back().close = &entry;
          node.gates.back().until = entry.at;
        }
        break;
      case EntryKind::kPause: paused[entry.node] = entry.at; break;
      case EntryKind::kResume:
      case EntryKind::kCrash:
        if (paused[entry.node]) {
          node.pauses.emplace_back(*paused[entry.node], entry.at);
          paused[entry.node].reset();
        }
        break;
      case EntryKind::kBusy: node.busy.push_back(&entry); break;
      case EntryKind::kBoot: node.boots.push_back(&entry); break;
      default: break;
    }
  }
  for (auto& [node, record] : out) {
    if (paused[node]) {
      record.pauses.emplace_back(*paused[node], run.end);
    }
  }
  return out;
}

// The keys whose registration keeps a gate span justified: its key, and in primary mode, for a
// member, every key its node registered while the span lasted (a promote moves the member's
// nexuses to its new key, and the node stays registered throughout).
std::set<std::uint64_t> span_keys(const Run& run, std::uint16_t node_id, const GateSpan& span) {
  const std::uint64_t key = span.open->key.value_or(0);
  std::set<std::uint64_t> keys{key};
  if (gauge_of(run, span.open->holds) != Gauge::kMember || !primary(run)) {
    return keys;
  }
  for (const Command& command : run.commands) {
    if (command.node == node_id && command.registers() && command.submitted_seq > span.open->seq &&
        (span.close == nullptr || command.submitted_seq < span.close->seq)) {
      keys.insert(command.sa_key);
    }
  }
  return keys;
}

// When a daemon whose deadline is `at` acts on it: then, or when it resumes from a pause.
Time acts_at(const NodeRecord& node, Time at) {
  for (const auto& [from, to] : node.pauses) {
    if (from < at && at < to) {
      return to;
    }
  }
  return at;
}

// The latest kBoot of the node at or before the sequence number.
std::uint64_t boot_before(const NodeRecord& node, std::uint64_t seq) {
  std::uint64_t boot = 0;
  for (const Entry* entry : node.boots) {
    if (entry->seq <= seq) {
      boot = entry->seq;
    }
  }
  return boot;
}

void check_s2_lease(const Run& run, std::uint16_t node_id, const NodeRecord& node,
                    std::vector<Violation>& violations) {
  // The PR IN answers of the node, in reaping order; which of them count depends on the gate.
  std::vector<const Command*> reads;
  for (const Command& command : run.commands) {
    if (command.node == node_id && command.completed && answer::view_of(command)) {
      reads.push_back(&command);
    }
  }
  // Whether the answer shows the key as the holder (READ RESERVATION), or for a member's gate as
  // registered (READ KEYS: the key, or in primary mode a key its node registered meanwhile).
  const auto shows = [](const Command& read, std::uint64_t key, bool member,
                        const std::set<std::uint64_t>& keys) {
    const auto view = answer::view_of(read);
    return member ? view->shows_keys &&
                        std::any_of(view->keys.begin(), view->keys.end(),
                                    [&keys](std::uint64_t k) { return keys.contains(k); })
                  : view->shows_reservation && view->holder == key;
  };
  std::sort(reads.begin(), reads.end(),
            [](const Command* a, const Command* b) { return a->completed_seq < b->completed_seq; });
  for (const GateSpan& span : node.gates) {
    const std::uint64_t key = span.open->key.value_or(0);
    const bool member = gauge_of(run, span.open->holds) == Gauge::kMember;
    const std::set<std::uint64_t> keys = span_keys(run, node_id, span);
    const std::uint64_t boot = boot_before(node, span.open->seq);
    std::vector<std::optional<Time>> latest(run.lus);
    const auto deadline = [&]() -> std::optional<Time> {
      Time at = Time::max();
      for (const auto& v : latest) {
        if (!v) {
          return std::nullopt;
        }
        at = std::min(at, *v + run.lease);
      }
      return at;
    };
    const auto report = [&](const std::string& what, std::vector<std::string> lines) {
      lines.insert(lines.begin(), describe(*span.open));
      if (span.close != nullptr) {
        lines.push_back(describe(*span.close));
      }
      violations.push_back({"S2", "node " + std::to_string(node_id) + "'s gate " + what, lines});
    };
    std::size_t next = 0;
    for (; next < reads.size() && reads[next]->completed_seq < span.open->seq; ++next) {
      const Command& read = *reads[next];
      if (read.submitted_seq > boot && shows(read, key, member, keys) && read.lu < latest.size()) {
        latest[read.lu] = std::max(latest[read.lu].value_or(Time{0}), read.submitted);
      }
    }
    auto due = deadline();
    if (!due) {
      report("opened with " + format_key(key) +
                 " without a read of its own showing that key as the holder of every LU",
             {});
      continue;
    }
    for (; next < reads.size() && reads[next]->completed_at <= span.until; ++next) {
      const Command& read = *reads[next];
      if (read.completed_at > acts_at(node, *due)) {
        break;
      }
      if (shows(read, key, member, keys) && read.lu < latest.size()) {
        latest[read.lu] = std::max(latest[read.lu].value_or(Time{0}), read.submitted);
        due = deadline();
      }
    }
    if (span.until > acts_at(node, *due)) {
      report("stayed open until " + format_time(span.until) + ", past " +
                 format_time(acts_at(node, *due)) + ": the lease (" + format_time(run.lease) +
                 ") of its last read showing " + format_key(key) + " as the holder everywhere",
             {});
    }
  }
}

// Whether the resource ran an operation at some moment between two sequence numbers.
bool busy_between(const NodeRecord& node, std::uint64_t from, std::uint64_t to) {
  bool busy = false;
  for (const Entry* entry : node.busy) {
    if (entry->seq <= from) {
      busy = entry->open;
    } else if (entry->seq <= to && entry->open) {
      return true;
    }
  }
  return busy;
}

void check_s2_reveal(const Run& run, std::uint16_t node_id, const NodeRecord& node,
                     std::vector<Violation>& violations) {
  const std::vector<Round> rounds = rounds_of(run, node_id);
  for (const GateSpan& span : node.gates) {
    const std::uint64_t key = span.open->key.value_or(0);
    const bool member = gauge_of(run, span.open->holds) == Gauge::kMember;
    const std::set<std::uint64_t> keys = span_keys(run, node_id, span);
    for (const Round& round : rounds) {
      // A read that failed proves nothing, but what the others showed is proven: a round is
      // judged once all its reads are back, whatever became of them.
      if (round.first_seq < span.open->seq || !round.ended()) {
        continue;
      }
      const Command& last = round.last();
      const bool open_then = span.close == nullptr || span.close->seq > last.completed_seq;
      const Command* shown = round.reveals_loss(key, member, keys);
      if (!open_then || shown == nullptr || span.until <= last.completed_at ||
          busy_between(node, round.first_seq, last.completed_seq)) {
        continue;
      }
      std::vector<std::string> lines{describe(*span.open), describe(run, *shown, true),
                                     describe(run, last, true)};
      if (span.close != nullptr) {
        lines.push_back(describe(*span.close));
      }
      violations.push_back({"S2",
                            "node " + std::to_string(node_id) + "'s monitor read that " +
                                format_key(key) + " lost LU " + std::to_string(shown->lu) +
                                ", and its gate stayed open after the round ended, until " +
                                format_time(span.until),
                            lines});
      break;  // one report per gate
    }
  }
}

void check_s2_continuous(const Run& run, std::vector<Violation>& violations) {
  for (const auto& [node_id, node] : node_records(run)) {
    if (node_id == 0) {
      continue;  // the world's own entries (the quiet phase)
    }
    check_s2_lease(run, node_id, node, violations);
    check_s2_reveal(run, node_id, node, violations);
  }
}

// S3 (epochs never go backwards, across restarts and LUN resets), in three parts.
// (a) Each node's registrations: every acquire() call registers one key, and its epoch is greater
//     than every epoch the node registered before, whatever restarts happened in between (the
//     epoch store is the node's disk). A new path registered with the key of the node's open gate
//     (docs/protocol.md, paths) is that key again, not a new one.
// (b) Every fresh acquisition (an Acquired event with a key the node did not hold just before:
//     adopting one's own key at restart is not fresh) has an epoch greater than that of every
//     other node's acquired key (one that had opened a gate) that held the reservation of any LU
//     at some point between the acquire() call (or the daemon's start, for an adoption) and the
//     verify read that opened the gate: an acquisition takes over only from older tokens, and no
//     two holders ever open their gates with the same epoch (BLKFENCE_EPOCH is unique). (A newer
//     key may take over between that read and the gate opening; that is the newer acquisition's
//     business, and S2 excuses it.)
// (c) Every PR OUT that took the reservation from another node's holder key H (PREEMPT or PREEMPT
//     AND ABORT, GOOD, holder H before and the caller's key after) carries a key that outranks H
//     in the token order of docs/protocol.md (a greater epoch, or the same epoch and a greater
//     node id: two racers that read the same keys draw the same epoch), whether or not that
//     acquire went on to succeed; (b) makes sure such a tie never reaches two open gates.
// Not checked: an acquirer may also remove a racing acquirer's registration with an equal or
// greater epoch in its verify rounds; that key never held the reservation, so it never opened a
// gate ((b) and S2 see to that). With --strict-epochs also: the acquisitions of all nodes, in the
// order of the verify reads that opened their gates, have increasing epochs.
// Shared mode: every member registers epoch 0 (docs/protocol.md, "Shared mode"), no key outranks
// another and nothing takes the reservation by rank: S3 does not apply, --strict-epochs included.
// Primary mode: every unfence draws a new epoch as a promote does, so (a) reads the members' keys
// as it reads the promotes'; the promotes are the acquisitions of (b) (the verify read is the one
// its Acquired event reports: a member's promote opens no gate), and (c) holds as it is. The strict
// order always applies: the promotes' tokens, in the order of their verify reads, have strictly
// increasing epochs, so no two gates ever open as the primary's with one epoch.
// The keys a PR IN's parameter data shows, read from the bytes as the target sent them (SPC-4
// 6.16): READ KEYS lists them after the 8-byte header, READ RESERVATION shows the holder's there,
// READ FULL STATUS one per descriptor (24 bytes and its additional length).
std::vector<std::uint64_t> keys_shown(const Command& read) {
  const std::vector<std::uint8_t>& data = read.data_in;
  const auto be = [&](std::size_t at, std::size_t bytes) {
    std::uint64_t value = 0;
    for (std::size_t i = 0; i < bytes; ++i) {
      value = value << 8 | data[at + i];
    }
    return value;
  };
  std::vector<std::uint64_t> keys;
  if (!read.is_prin() || data.size() < 8) {
    return keys;
  }
  const std::size_t end = std::min<std::size_t>(data.size(), 8 + be(4, 4));
  const auto action = static_cast<codec::PrInAction>(read.action);
  if (action == codec::PrInAction::kReadKeys || action == codec::PrInAction::kReadReservation) {
    for (std::size_t at = 8; at + 8 <= end; at += 8) {
      keys.push_back(be(at, 8));
      if (action == codec::PrInAction::kReadReservation) {
        break;  // the key, then scope, type and obsolete bytes
      }
    }
  } else if (action == codec::PrInAction::kReadFullStatus) {
    for (std::size_t at = 8; at + 24 <= end; at += 24 + be(at + 20, 4)) {
      keys.push_back(be(at, 8));
    }
  }
  return keys;
}

// S3's documented gap (docs/protocol.md, "S3"): a target that forgot its PR state (a power cycle
// without APTPL) forgets the newest epoch with it, and a node that never saw that epoch may draw
// it again. Whether that explains `later` (an acquisition, its gate opened on the verify read at
// `verified`) drawing no higher than one verified at `earlier`: a forgotten power cycle between
// the two, and none of the node's reads before it drew (of any boot: its epoch file outlives
// them) showed a key of the cluster with its epoch or above. The draw comes before the first
// command of the acquisition (from `called`, the driver's call that began it) carrying the new
// key: a racer's key that a read shows after that (the acquire's reads between REGISTER and
// verify) could not have raised the draw.
bool forgotten_unseen(const Run& run, Time earlier, Time verified, Time called,
                      const Entry& later) {
  const bool forgotten = std::any_of(
      run.target->prouts.begin(), run.target->prouts.end(), [&](const PrOutRecord& record) {
        return record.service_action == transport::kPowerCycleRecord && record.at > earlier &&
               record.at < verified;
      });
  if (!forgotten || !later.key) {
    return false;
  }
  const std::uint32_t epoch = epoch_of_key(*later.key);
  Time drawn = later.at;
  for (const Command& command : run.commands) {
    if (command.node == later.node && command.is_prout() && command.submitted >= called &&
        (command.key == *later.key || command.sa_key == *later.key)) {
      drawn = std::min(drawn, command.submitted);
    }
  }
  return std::none_of(run.commands.begin(), run.commands.end(), [&](const Command& read) {
    if (read.node != later.node || !read.completed || read.completed_at > drawn) {
      return false;
    }
    const std::vector<std::uint64_t> keys = keys_shown(read);
    return std::any_of(keys.begin(), keys.end(), [&](std::uint64_t key) {
      return key != *later.key && cluster_of_key(key) == run.cluster_id &&
             epoch_of_key(key) >= epoch;
    });
  });
}

void check_s3(const Run& run, const Replay& replayed, const Steps& steps,
              std::vector<Violation>& violations) {
  if (shared(run) && !primary(run)) {
    return;
  }
  for (const auto& [node, node_steps] : steps) {
    std::optional<std::uint32_t> highest;
    // Key 0 is never registered by an acquire, so it stands for "none yet" (a plain integer:
    // GCC 12 at -O2 warns that an optional's value may be uninitialized here).
    std::uint64_t op_key = 0;
    std::uint64_t open_with = 0;  // the key of the open gate, 0 when closed
    const Command* last = nullptr;
    for (const Step& step : node_steps) {
      if (step.entry && step.entry->kind == EntryKind::kAcquireCalled) {
        op_key = 0;
        continue;
      }
      if (step.entry && step.entry->kind == EntryKind::kGate) {
        open_with = step.entry->open ? step.entry->key.value_or(0) : 0;
        continue;
      }
      if (!step.command || step.completion || !step.command->registers()) {
        continue;
      }
      const Command& command = *step.command;
      const std::uint32_t epoch = epoch_of_key(command.sa_key);
      if ((op_key != 0 && op_key == command.sa_key) ||
          (open_with != 0 && open_with == command.sa_key)) {
        continue;  // the same acquire (another path or a retry), or a new path of the held key
      }
      // Within one acquire a new key is allowed only above the last (a re-draw when a racer's
      // equal epoch holds, docs/protocol.md); highest covers both.
      if ((highest && epoch <= *highest) || node_of_key(command.sa_key) != node) {
        violations.push_back(
            {"S3",
             "node " + std::to_string(node) + " registered " + format_key(command.sa_key) +
                 (op_key != 0 ? " in the acquire that registered " + format_key(op_key)
                  : highest   ? " after having registered epoch " + std::to_string(*highest)
                              : std::string(", a key of another node")),
             {last ? describe(run, *last, false) : std::string("(no earlier registration)"),
              describe(run, command, false)}});
      }
      op_key = command.sa_key;
      highest = std::max(highest.value_or(0), epoch);
      last = &command;
    }
  }

  // The holder of each LU over time, from the target's records.
  std::map<transport::LuId, std::vector<const PrOutRecord*>> by_lu;
  for (const PrOutRecord& record : run.target->prouts) {
    by_lu[record.lu].push_back(&record);
  }
  std::map<std::uint64_t, Time> opened;  // every key that opened a gate, and when it first did
  for (const Entry& entry : run.trace) {
    if (entry.kind == EntryKind::kGate && entry.open && entry.key) {
      opened.emplace(*entry.key, entry.at);
    }
  }
  std::map<std::uint16_t, Time> window_start;
  std::map<std::uint16_t, Time> gate_verified;  // the node's last gate opening's verify read
  std::map<std::uint16_t, std::optional<std::uint64_t>> held;
  // Each fresh acquisition: its verify read, its epoch, its event, the start of its acquire.
  std::vector<std::tuple<Time, std::uint32_t, const Entry*, Time>> by_verify;
  for (const Entry& entry : run.trace) {
    if (entry.kind == EntryKind::kAcquireCalled || entry.kind == EntryKind::kBoot) {
      window_start[entry.node] = entry.at;
      continue;
    }
    if (entry.kind == EntryKind::kGate && entry.open) {
      gate_verified[entry.node] = entry.verified_since;  // just before its acquired event
      continue;
    }
    if (primary(run) && entry.kind == EntryKind::kEvent &&
        entry.event == fence::EventKind::kAcquired) {
      // A member's promote opens no gate (it is open already): the event carries the verify.
      gate_verified[entry.node] = entry.verified_since;
    }
    if (entry.kind != EntryKind::kEvent || entry.event != fence::EventKind::kAcquired ||
        !entry.key) {
      continue;
    }
    if (held[entry.node] == entry.key) {
      continue;  // adopted at restart
    }
    held[entry.node] = entry.key;
    const std::uint32_t epoch = epoch_of_key(*entry.key);
    const Time from = window_start[entry.node];
    const Time until = gate_verified[entry.node];  // later holders took over from this one
    for (const auto& [lu, records] : by_lu) {
      std::optional<std::uint64_t> at_start;                // the holder when the acquire began
      std::map<std::uint64_t, const PrOutRecord*> holders;  // and every one that followed
      for (const PrOutRecord* record : records) {
        if (record->at > until) {
          break;
        }
        const auto after =
            record->reservation ? std::optional(record->reservation->key) : std::nullopt;
        if (record->at <= from) {
          at_start = after;
        } else if (after) {
          holders.emplace(*after, record);
        }
      }
      if (at_start) {
        holders.emplace(*at_start, nullptr);
      }
      for (const auto& [holder, record] : holders) {
        const auto gate = opened.find(holder);
        if (cluster_of_key(holder) != run.cluster_id || node_of_key(holder) == entry.node ||
            epoch_of_key(holder) < epoch || gate == opened.end() || gate->second > entry.at) {
          continue;
        }
        // S3's documented gap: the LU forgot that holder (a power cycle without APTPL) before this
        // node's reads could show it, and none of its reads before the draw showed the epoch.
        if (forgotten_unseen(run, record ? record->at : from, until, from, entry)) {
          continue;
        }
        violations.push_back(
            {"S3",
             "node " + std::to_string(entry.node) + " acquired epoch " + std::to_string(epoch) +
                 " although " + format_key(holder) + " held LU " + std::to_string(lu) +
                 " during its acquire (from " + format_time(from) + ")",
             {describe(entry),
              record ? describe(run, *record) : "the holder when the acquire began"}});
      }
    }
    if (run.strict_epochs || primary(run)) {
      by_verify.push_back({until, epoch, &entry, from});
    }
  }
  // --strict-epochs: acquisitions of all nodes, in the order of the verify reads that opened their
  // gates (a node may reap its verify late, after a newer acquisition; S2 excuses that gate and
  // the monitor closes it), have increasing epochs.
  std::stable_sort(by_verify.begin(), by_verify.end(),
                   [](const auto& x, const auto& y) { return std::get<0>(x) < std::get<0>(y); });
  // The highest epoch verified so far: when its verify read was, the epoch, the acquisition.
  std::optional<std::tuple<Time, std::uint32_t, const Entry*>> latest;
  for (const auto& [verified, epoch, entry, called] : by_verify) {
    if (latest && epoch <= std::get<1>(*latest) &&
        !forgotten_unseen(run, std::get<0>(*latest), verified, called, *entry)) {
      violations.push_back({"S3",
                            std::string(primary(run) ? "a promote's token"
                                                     : "(strict) a fresh "
                                                       "acquisition") +
                                " with epoch " + std::to_string(epoch) +
                                " verified after one with epoch " +
                                std::to_string(std::get<1>(*latest)),
                            {describe(*std::get<2>(*latest)), describe(*entry)}});
    }
    if (!latest || epoch > std::get<1>(*latest)) {
      latest = {verified, epoch, entry};
    }
  }

  for (const PrOutRecord& record : run.target->prouts) {
    const bool take =
        (record.service_action == static_cast<std::uint8_t>(PrOutAction::kPreempt) ||
         record.service_action == static_cast<std::uint8_t>(PrOutAction::kPreemptAndAbort)) &&
        record.outcome.status == 0 && record.reservation && record.reservation->key == record.key;
    const auto before = replayed.holder_before.find(record.sequence);
    if (!take || before == replayed.holder_before.end() || !before->second ||
        *before->second == record.key || cluster_of_key(*before->second) != run.cluster_id ||
        node_of_key(*before->second) == node_of_key(record.key)) {
      continue;
    }
    const auto rank = [](std::uint64_t key) {
      return std::pair(epoch_of_key(key), node_of_key(key));
    };
    if (rank(record.key) <= rank(*before->second)) {
      violations.push_back({"S3",
                            format_key(record.key) + " took LU " + std::to_string(record.lu) +
                                " from " + format_key(*before->second) + ", which outranks it",
                            {describe(run, record)}});
    }
  }
}

// Whether a PR IN can reveal what a PR OUT did: READ KEYS shows registrations (REGISTER and its
// variants, PREEMPT, CLEAR), READ RESERVATION the reservation (RESERVE, RELEASE, PREEMPT, CLEAR),
// READ FULL STATUS both.
bool reveals(const Command& read, const Command& prout) {
  const bool registrations = !prout.is(PrOutAction::kReserve) && !prout.is(PrOutAction::kRelease);
  const bool reservation = !prout.is(PrOutAction::kRegister) &&
                           !prout.is(PrOutAction::kRegisterAndIgnoreExistingKey) &&
                           !prout.is(PrOutAction::kRegisterAndMove);
  switch (read.action) {
    case answer::kReadFullStatus: return true;
    case answer::kReadKeys: return registrations;
    case answer::kReadReservation: return reservation;
    default: return false;
  }
}

// S4 (after an indeterminate result, no decision is taken without re-reading). In each node's trace
// of commands: once a PR OUT on LU L completes (as the daemon reaped it) with anything but GOOD
// that does not say it did not execute (a timeout, RESERVATION CONFLICT, a transport or OS error,
// any other CHECK CONDITION; the checker reads the status and sense itself, answer.h), the node's
// next PR OUT on L is submitted only after a PR IN of L that was submitted after that completion,
// completed GOOD, and could reveal that PR OUT's effect (reveals()). (Persistent reservations are
// per LU: what happened on one LU decides nothing on another.) One decision needs
// less: unregistering the node's own key (REGISTER with SERVICE ACTION RESERVATION KEY 0) harms
// only where that key holds the reservation (it would drop it), so a READ RESERVATION of L suffices
// for it; in shared mode it needs no read at all: only a release unregisters there, and it gives
// up the reservation anyway (docs/protocol.md, "Release"), so all the unregister can drop is what
// the RELEASE before it meant to. A restart does not clear the duty: the new daemon reads at
// start. Sending the same bytes on the same nexus again after an answer that says the command did
// not execute is the same decision (the engine's retry), not a new one, as long as nothing else
// went out on that nexus in between.
void check_s4(const Run& run, const Steps& steps, std::vector<Violation>& violations) {
  struct Unread {
    const Command* prout = nullptr;
    bool holder_read = false;  // a READ RESERVATION of the LU since
  };
  for (const auto& [node, node_steps] : steps) {
    std::map<transport::LuId, Unread> pending;
    // (LU, nexus, bytes) of PR OUTs that did not execute, until resent or until another PR OUT
    // goes out on that nexus. (The engine resends them within the batch; other commands of the
    // batch may complete meanwhile, with any result.)
    std::set<std::tuple<transport::LuId, transport::NexusId, std::string>> resubmittable;
    for (const Step& step : node_steps) {
      if (step.entry) {
        if (step.entry->kind == EntryKind::kBoot) {
          resubmittable.clear();
        }
        continue;
      }
      const Command& command = *step.command;
      if (step.completion) {
        if (command.is_prout() && answer::did_not_execute(command)) {
          resubmittable.emplace(command.lu, command.nexus, command.bytes);
        } else if (command.is_prout() && wants_read(command)) {
          pending[command.lu] = Unread{&command, false};
        } else if (command.is_prin() && answer::good(command)) {
          const auto found = pending.find(command.lu);
          if (found == pending.end() ||
              command.submitted_seq < found->second.prout->completed_seq) {
            continue;
          }
          if (reveals(command, *found->second.prout)) {
            pending.erase(found);
          } else if (command.action == answer::kReadReservation) {
            found->second.holder_read = true;
          }
        }
        continue;
      }
      if (!command.is_prout()) {
        continue;
      }
      const bool resent = resubmittable.contains({command.lu, command.nexus, command.bytes});
      std::erase_if(resubmittable, [&](const auto& r) { return std::get<1>(r) == command.nexus; });
      if (resent) {
        continue;
      }
      const bool unregister = command.is(PrOutAction::kRegister) && command.sa_key == 0;
      const auto unread = pending.find(command.lu);
      if (unread != pending.end() && !(unregister && (unread->second.holder_read || shared(run)))) {
        const Command& prout = *unread->second.prout;
        violations.push_back({"S4",
                              "node " + std::to_string(node) + " sent a PR OUT on LU " +
                                  std::to_string(prout.lu) + " after one there completed " +
                                  std::string(transport::to_string(prout.outcome)) +
                                  " without a read of that LU that could show what it did",
                              {describe(run, prout, true), describe(run, command, false)}});
        pending.erase(unread);  // one report per lapse
      }
    }
  }
}

// S5 (a fenced node never re-registers by itself; docs/protocol.md). In each node's trace: after a
// Fenced event, and after every daemon start (whether it adopted its key or not), no REGISTER or
// REGISTER AND IGNORE EXISTING KEY that puts a key in place is submitted from its nexuses until the
// driver next calls acquire() (in shared mode unfence()) on it, except the registration of a new
// path with the key the node holds and has verified (its gate is open with that very key when the
// REGISTER goes out), and a shared-mode release's move to the departed key (departs).
// Shared mode: a release moving a nexus from the member's key to the departed key. A plain
// REGISTER with a key in the RESERVATION KEY field changes a registration that exists and registers
// no nexus that is not (RESERVATION CONFLICT, SPC-4 5.13.7): a fenced nexus stays unregistered.
bool departs(const Run& run, const Command& command) {
  return shared(run) && !run.primary && command.is(PrOutAction::kRegister) && command.key != 0 &&
         node_of_key(command.sa_key) == node_of_key(command.key) &&
         epoch_of_key(command.sa_key) == kDepartedEpoch;
}

void check_s5(const Run& run, const Steps& steps, std::vector<Violation>& violations) {
  for (const auto& [node, node_steps] : steps) {
    const Entry* since = nullptr;
    bool forbidden = true;
    std::optional<std::uint64_t> open_with;  // the key of the open gate
    for (const Step& step : node_steps) {
      if (step.entry) {
        const Entry& entry = *step.entry;
        if (entry.kind == EntryKind::kBoot ||
            (entry.kind == EntryKind::kEvent && entry.event == fence::EventKind::kFenced)) {
          forbidden = true;
          since = &entry;
        } else if (entry.kind == EntryKind::kAcquireCalled) {
          forbidden = false;
        } else if (entry.kind == EntryKind::kGate) {
          open_with = entry.open ? entry.key : std::nullopt;
        }
        continue;
      }
      const Command& command = *step.command;
      if (step.completion || !command.registers() || !forbidden || open_with == command.sa_key ||
          departs(run, command)) {
        continue;
      }
      violations.push_back({"S5",
                            "node " + std::to_string(node) + " registered " +
                                format_key(command.sa_key) + " without being asked to acquire",
                            {since ? describe(*since) : std::string("(never asked)"),
                             describe(run, command, false)}});
      forbidden = false;  // one report per lapse
    }
  }
}

// C1 (a cancelled operation takes nothing after its cancel; docs/protocol.md, Resource::cancel):
// once the driver called cancel() on a node while the acquire or promote it had asked for ran
// (kCancelCalled), until that operation ended (its kOpDone, or the daemon's death), the node
// submits no PR OUT that could take a LU: no PREEMPT, PREEMPT AND ABORT or RESERVE, and no
// REGISTER or REGISTER AND IGNORE EXISTING KEY that puts a key in place, except a new path's
// registration with the key of the node's open gate (held and verified, as S5 allows; not the
// cancelled operation's). A command of a request the engine had submitted before the cancel,
// sent again (a resend after an answer that says it did not execute, or the next path), is the
// same decision, taken before the cancel, not a new one.
void check_c1(const Run& run, const Steps& steps, std::vector<Violation>& violations) {
  for (const auto& [node, node_steps] : steps) {
    const Entry* cancel = nullptr;
    std::optional<std::uint64_t> open_with;
    std::set<std::pair<std::uint32_t, std::uint64_t>> before;  // (boot, request) sent so far
    for (const Step& step : node_steps) {
      if (step.entry) {
        const Entry& entry = *step.entry;
        if (entry.kind == EntryKind::kCancelCalled) {
          cancel = &entry;
        } else if (entry.kind == EntryKind::kOpDone || entry.kind == EntryKind::kCrash ||
                   entry.kind == EntryKind::kBoot) {
          cancel = nullptr;
        } else if (entry.kind == EntryKind::kGate) {
          open_with = entry.open ? entry.key : std::nullopt;
        }
        continue;
      }
      const Command& command = *step.command;
      if (step.completion || !command.is_prout()) {
        continue;
      }
      const bool resent = before.contains({command.boot, command.request});
      before.emplace(command.boot, command.request);
      const bool takes =
          command.is(PrOutAction::kPreempt) || command.is(PrOutAction::kPreemptAndAbort) ||
          command.is(PrOutAction::kReserve) || (command.registers() && open_with != command.sa_key);
      if (cancel == nullptr || resent || !takes) {
        continue;
      }
      violations.push_back({"C1",
                            "node " + std::to_string(node) + " sent " + prout_name(command.action) +
                                " after its operation was cancelled",
                            {describe(*cancel), describe(run, command, false)}});
      cancel = nullptr;  // one report per cancel
    }
  }
}

// R1 (stray registrations, docs/protocol.md): in exclusive mode, while a holder's monitor runs, no
// registration of the cluster but the holder's key outlives run.stray_bound. Judged in the quiet
// phase, where no fault keeps the monitor's commands from being answered: let G be a span in which
// node H's gate is open with key K_H (from its opening to its closing, or the run's end), and S a
// registration on LU L of a nexus with a key K != K_H (from the PR OUT that registered it to the
// one that removed it or replaced its key, or the run's end). With t0 the latest of S's
// registration, G's opening and the quiet phase's start, and d = t0 + run.stray_bound: if G is
// still open at d, K_H holds L at d, and S still exists at d, that is a violation.
void check_r1(const Run& run, std::vector<Violation>& violations) {
  if (run.stray_bound == Time{0} || shared(run)) {
    return;
  }
  const auto quiet = std::find_if(run.trace.begin(), run.trace.end(), [](const Entry& entry) {
    return entry.kind == EntryKind::kQuiet;
  });
  if (quiet == run.trace.end()) {
    return;
  }
  struct Span {
    std::uint16_t node = 0;
    std::uint64_t key = 0;
    Time from{0};
    Time to{0};
  };
  std::vector<Span> gates;
  std::map<std::uint16_t, std::size_t> open;  // node -> its open span in gates
  for (const Entry& entry : run.trace) {
    if (entry.kind != EntryKind::kGate) {
      continue;
    }
    if (const auto it = open.find(entry.node); it != open.end()) {
      gates[it->second].to = entry.at;
      open.erase(it);
    }
    if (entry.open && entry.key) {
      open[entry.node] = gates.size();
      gates.push_back({entry.node, *entry.key, entry.at, run.end});
    }
  }
  struct Registration {
    transport::LuId lu = 0;
    transport::NexusId nexus = 0;
    std::uint64_t key = 0;
    const PrOutRecord* by = nullptr;
    Time to{0};
  };
  std::vector<Registration> registrations;
  std::map<std::pair<transport::LuId, transport::NexusId>, std::size_t> live;
  const auto end_of = [&](transport::LuId lu, transport::NexusId nexus, Time at) {
    if (const auto it = live.find({lu, nexus}); it != live.end()) {
      registrations[it->second].to = at;
      live.erase(it);
    }
  };
  for (const PrOutRecord& record : run.target->prouts) {
    for (const transport::NexusId nexus : record.unregistered) {
      end_of(record.lu, nexus, record.at);
    }
    const bool registration =
        record.service_action == static_cast<std::uint8_t>(PrOutAction::kRegister) ||
        record.service_action ==
            static_cast<std::uint8_t>(PrOutAction::kRegisterAndIgnoreExistingKey);
    if (registration && record.outcome.status == 0 && record.sa_key != 0) {
      const auto it = live.find({record.lu, record.nexus});
      if (it != live.end() && registrations[it->second].key == record.sa_key) {
        continue;  // the same key again: the same registration
      }
      end_of(record.lu, record.nexus, record.at);
      live[{record.lu, record.nexus}] = registrations.size();
      registrations.push_back({record.lu, record.nexus, record.sa_key, &record, run.end});
    }
  }
  // The holder of a LU at a moment: the reservation after the last PR OUT there at or before it.
  const auto holder_at = [&run](transport::LuId lu, Time at) {
    std::optional<std::uint64_t> holder;
    for (const PrOutRecord& record : run.target->prouts) {
      if (record.at > at) {
        break;
      }
      if (record.lu == lu) {
        holder = record.reservation ? std::optional(record.reservation->key) : std::nullopt;
      }
    }
    return holder;
  };
  for (const Span& gate : gates) {
    for (const Registration& stray : registrations) {
      if (stray.key == gate.key || cluster_of_key(stray.key) != run.cluster_id) {
        continue;
      }
      const Time t0 = std::max({stray.by->at, gate.from, quiet->at});
      const Time deadline = t0 + run.stray_bound;
      if (gate.to <= deadline || stray.to <= deadline ||
          holder_at(stray.lu, deadline) != gate.key) {
        continue;
      }
      violations.push_back(
          {"R1",
           "a registration of " + format_key(stray.key) + " on LU " + std::to_string(stray.lu) +
               " outlived the stray bound (" + format_time(run.stray_bound) + ") beside holder " +
               format_key(gate.key) + " of node " + std::to_string(gate.node) +
               ", whose gate stayed open",
           {"registered: " + describe(run, *stray.by),
            "gate open:  " + format_time(gate.from) + " node " + std::to_string(gate.node) +
                " with " + format_key(gate.key),
            "deadline:   " + format_time(deadline) + ", still registered" +
                (stray.to < run.end ? " until " + format_time(stray.to) : " at the end")}});
    }
  }
}

// L1 (liveness, beyond S1-S5): the acquire (in shared mode the unfence) the driver makes in the
// quiet phase, with no faults, every link up and every daemon running, succeeds.
void check_l1(const Run& run, std::vector<Violation>& violations) {
  const std::string final_op = primary(run)  ? "final promote"
                               : shared(run) ? "final unfence"
                                             : "final acquire";
  for (const Entry& entry : run.trace) {
    if (entry.kind == EntryKind::kOpDone && entry.detail.rfind(final_op, 0) == 0 && !entry.ok) {
      violations.push_back(
          {"L1", "the " + final_op + " in the quiet phase failed", {describe(entry)}});
    }
  }
}

}  // namespace

std::string format_time(Time time) {
  const auto ns = time.count();
  char text[48];
  (void)std::snprintf(text, sizeof text, "%" PRId64 ".%06" PRId64 "s",
                      static_cast<std::int64_t>(ns / 1'000'000'000),
                      static_cast<std::int64_t>((ns % 1'000'000'000) / 1000));
  return text;
}

std::string format_key(std::uint64_t key) {
  if (key == 0) {
    return "0";
  }
  char text[64];
  (void)std::snprintf(text, sizeof text, "0x%016" PRIx64 " (n%u e%u)", key, node_of_key(key),
                      epoch_of_key(key));
  return text;
}

std::string describe(const Run& run, const Command& command, bool completion) {
  std::string text = format_time(completion ? command.completed_at : command.submitted) + " node " +
                     std::to_string(command.node) + " (boot " + std::to_string(command.boot) +
                     ") " + (completion ? "reaped   " : "submitted") + " ";
  if (command.is_prout()) {
    text += prout_name(command.action) + " key " + format_key(command.key) + " sa " +
            format_key(command.sa_key);
  } else if (command.is_prin()) {
    text += prin_name(command.action);
  } else {
    text += "opcode " + std::to_string(command.opcode);
  }
  text += " on LU " + std::to_string(command.lu) + " nexus " + std::to_string(command.nexus);
  if (completion) {
    text += ": " + std::string(transport::to_string(command.outcome));
    if (const auto sense = answer::sense_of(command)) {
      char text_sense[32];
      (void)std::snprintf(text_sense, sizeof text_sense, " %x/%02x/%02x", sense->key, sense->asc,
                          sense->ascq);
      text += text_sense;
    }
  }
  (void)run;
  return text;
}

std::string describe(const Entry& entry) {
  std::string text = format_time(entry.at) + " node " + std::to_string(entry.node) + " ";
  switch (entry.kind) {
    case EntryKind::kBoot: text += "daemon boots, start()"; break;
    case EntryKind::kCrash: text += "daemon dies"; break;
    case EntryKind::kPause: text += "pauses"; break;
    case EntryKind::kResume: text += "resumes"; break;
    case EntryKind::kLink: text += "links"; break;
    case EntryKind::kAcquireCalled:
      text += entry.detail.find("unfence") != std::string::npos   ? "driver: unfence()"
              : entry.detail.find("promote") != std::string::npos ? "driver: promote()"
                                                                  : "driver: acquire()";
      break;
    case EntryKind::kCancelCalled: text += "driver: cancel()"; break;
    case EntryKind::kFenceCalled: text += "driver: fence_node()"; break;
    case EntryKind::kReleaseCalled: text += "driver: release()"; break;
    case EntryKind::kOpDone:
      text += std::string("operation done: ") +
              (entry.ok ? std::string("ok") : std::string(to_string(entry.code)));
      break;
    case EntryKind::kRefused: text += "driver: refused"; break;
    case EntryKind::kGate:
      text += std::string("gate ") + (entry.open ? "OPEN" : "closed") + " verified_since " +
              format_time(entry.verified_since);
      break;
    case EntryKind::kEvent: text += "event " + std::string(fence::to_string(entry.event)); break;
    case EntryKind::kQuiet: text = format_time(entry.at) + " quiet phase"; break;
    case EntryKind::kBusy: text += entry.open ? "operation running" : "no operation running"; break;
    case EntryKind::kPaths: text += "driver: update_paths()"; break;
    case EntryKind::kPowerCycle: text = format_time(entry.at) + " target power cycle"; break;
  }
  if (entry.key) {
    text += " key " + format_key(*entry.key);
  }
  if (entry.other_key) {
    text += " other " + format_key(*entry.other_key);
  }
  if (!entry.detail.empty()) {
    text += ": " + entry.detail;
  }
  return text;
}

std::string describe(const Run& run, const PrOutRecord& record) {
  std::string text = format_time(record.at) + " target LU " + std::to_string(record.lu) + " #" +
                     std::to_string(record.sequence) + " " + prout_name(record.service_action) +
                     " from nexus " + std::to_string(record.nexus) + " (node " +
                     std::to_string(node_of(run, record.nexus)) + ") key " +
                     format_key(record.key) + " sa " + format_key(record.sa_key) + ": " +
                     outcome_text(record.outcome);
  if (!record.unregistered.empty()) {
    text += ", removed nexus";
    for (const auto nexus : record.unregistered) {
      text += " " + std::to_string(nexus);
    }
  }
  text += ", holder now " + (record.reservation ? format_key(record.reservation->key) : "none");
  return text;
}

std::string describe(const Run& run, const WriteRecord& record) {
  std::string text = format_time(record.at) + " target LU " + std::to_string(record.lu) + " #" +
                     std::to_string(record.sequence) + " WRITE id " + std::to_string(record.lba) +
                     " from nexus " + std::to_string(record.nexus) + " (node " +
                     std::to_string(node_of(run, record.nexus)) + "), accepted " +
                     format_time(record.accepted_at) + ": " +
                     (record.landed ? "LANDED" : outcome_text(record.outcome));
  if (const auto issue = run.writes.find(record.lba); issue != run.writes.end()) {
    text += ", stamped epoch " + std::to_string(issue->second.epoch());
  }
  return text;
}

std::string describe(const WriteIssue& write) {
  return format_time(write.issued) + " node " + std::to_string(write.node) +
         " writer issues write " + std::to_string(write.id) + " to LU " + std::to_string(write.lu) +
         " via nexus " + std::to_string(write.nexus) + " with token " + format_key(write.key);
}

std::vector<std::string> timeline(const Run& run) {
  // (time, rank, order): the driver's record before the target's at one instant.
  std::vector<std::tuple<Time, int, std::uint64_t, std::string>> lines;
  for (const Entry& entry : run.trace) {
    lines.emplace_back(entry.at, 0, entry.seq, describe(entry));
  }
  for (const Command& command : run.commands) {
    lines.emplace_back(command.submitted, 0, command.submitted_seq, describe(run, command, false));
    if (command.completed) {
      lines.emplace_back(command.completed_at, 0, command.completed_seq,
                         describe(run, command, true));
    }
  }
  for (const auto& [id, write] : run.writes) {
    lines.emplace_back(write.issued, 1, id, describe(write));
  }
  for (const PrOutRecord& record : run.target->prouts) {
    lines.emplace_back(record.at, 2, record.sequence, describe(run, record));
  }
  for (const WriteRecord& record : run.target->writes) {
    lines.emplace_back(record.at, 2, record.sequence, describe(run, record));
  }
  std::sort(lines.begin(), lines.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a), std::get<2>(a)) <
           std::tie(std::get<0>(b), std::get<1>(b), std::get<2>(b));
  });
  std::vector<std::string> out;
  out.reserve(lines.size());
  for (auto& line : lines) {
    out.push_back(std::move(std::get<3>(line)));
  }
  return out;
}

std::vector<Violation> check(const Run& run) {
  std::vector<Violation> violations;
  const Replay replayed = replay(run, violations);
  std::vector<Violation> held;
  check_s1(run, replayed, violations, held);
  check_s2(run, replayed, violations);
  check_s2_continuous(run, violations);
  Steps steps;
  for (const std::uint16_t node : nodes_of(run)) {
    steps.emplace(node, collect_steps(run, node));
  }
  check_s3(run, replayed, steps, violations);
  check_s4(run, steps, violations);
  check_s5(run, steps, violations);
  check_c1(run, steps, violations);
  check_l1(run, violations);
  check_r1(run, violations);
  return violations;
}

std::vector<Violation> held_across_plain_preempt(const Run& run) {
  std::vector<Violation> ignored;
  std::vector<Violation> held;
  const Replay replayed = replay(run, ignored);
  check_s1(run, replayed, ignored, held);
  return held;
}

}  // namespace blkfence::sim
