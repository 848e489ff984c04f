// Whether `blkfencectl device` may send a PR OUT to LUs that a local blkfenced manages (cli layer;
// docs/blkfencectl.md, "LUs that blkfenced manages"). Every path of a LU on this host is an I_T
// nexus that the daemon registered its key on, so a REGISTER, UNREGISTER, RESERVE, RELEASE, PREEMPT
// or CLEAR sent from here acts on the daemon's own registration and reservation behind its back:
// it can remove or replace the holder, or put a fenced node's nexus back among the registrants
// (S1, S5 in docs/protocol.md). The device mode asks the daemon at its control socket which LUs its
// resources hold (`status`, open to every user: lus[].wwn) and refuses such an action on any of
// them unless --force. judge() is the decision, a pure function; ask_daemon() is the question,
// one blocking request with a bound. Single-threaded.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "blkfence/control/protocol.h"

#include "device.h"

namespace blkfence::cli {

// How long the device mode waits for blkfenced's answer before refusing (fail closed): the daemon
// answers `status` at once from its event loop, so a daemon that takes this long is stopped or
// wedged, and cannot vouch for anything.
inline constexpr std::chrono::milliseconds kDaemonAnswerBound{2000};

// Whether the action sends a PR OUT (and so is refused on a managed LU); the PR IN actions (keys,
// reservation, status, capabilities) never ask the daemon.
bool changes_reservations(DeviceAction action);
// "clear", "preempt-abort", ...: the action's name on the command line.
std::string_view action_name(DeviceAction action);

// What the local blkfenced said when asked which LUs it manages.
struct DaemonAnswer {
  enum class Kind : std::uint8_t {
    kAbsent,    // no daemon: the socket does not exist, or nobody listens on it (ECONNREFUSED)
    kSilent,    // cannot tell: no answer within the bound, an error or unreadable reply, ...
    kAnswered,  // resources holds its resources' statuses
  };
  Kind kind = Kind::kAbsent;
  std::string why;  // kSilent: what happened, as a phrase ("did not answer within 2000 ms")
  std::vector<control::ResourceStatus> resources;
};

// A LU the command would act on: the name it was given by and its WWN.
struct Target {
  std::string device;
  std::string wwn;
};

struct Verdict {
  enum class Kind : std::uint8_t {
    kProceed,
    kManaged,     // a resource of the daemon has a target among its LUs
    kWaiting,     // a resource of the daemon does not know its LUs yet (waiting for its devices)
    kUnanswered,  // a daemon may run, but it did not say what it manages
  };
  struct Match {
    Target target;
    std::string resource;
    std::string state;
  };
  Kind kind = Kind::kProceed;
  std::vector<Match> managed;        // kManaged: each target that a resource holds
  std::vector<std::string> waiting;  // kWaiting: the resources without LUs
};

// The decision: read-only actions and --force proceed without looking at the daemon; a PR OUT
// proceeds when no daemon runs or when none of the daemon's resources lists a target's WWN, and
// is refused when one does, when a resource does not know its LUs yet, or when the daemon did not
// answer.
Verdict judge(DeviceAction action, bool force, const DaemonAnswer& daemon,
              const std::vector<Target>& targets);

// The message for a refusal (several lines, no trailing newline): what was refused, on which LU
// (device and WWN), which resource of the daemon at socket manages it and how to go on, --force
// included. "" for kProceed.
std::string refusal_message(DeviceAction action, const Verdict& verdict, const DaemonAnswer& daemon,
                            const std::vector<Target>& targets, const std::string& socket);

// Asks the daemon at socket for its status: kAbsent when nothing listens there, kSilent when
// it does not answer with a readable status within bound.
DaemonAnswer ask_daemon(const std::string& socket, std::chrono::milliseconds bound);

}  // namespace blkfence::cli
