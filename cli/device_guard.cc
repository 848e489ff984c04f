// blkfencectl device's guard against acting behind a local blkfenced: see device_guard.h.
#include "device_guard.h"

#include <algorithm>
#include <cctype>
#include <cerrno>

#include "control_client.h"

namespace blkfence::cli {
namespace {

using Clock = std::chrono::steady_clock;

// WWNs compare without regard to case: the daemon and this program read them the same way today
// (pr::discover), but a designator's hex digits mean the same in either case.
bool same_wwn(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string ms_text(std::chrono::milliseconds ms) {
  return std::to_string(ms.count()) + " ms";
}

std::string target_text(const Target& target) {
  return target.device + " (wwn " + target.wwn + ")";
}

constexpr const char* kForce =
    "add --force to send it anyway: nothing then stops it from removing or replacing the daemon's "
    "key and reservation, or from registering a key on a node that was fenced";

}  // namespace

bool changes_reservations(DeviceAction action) {
  switch (action) {
    case DeviceAction::kKeys:
    case DeviceAction::kReservation:
    case DeviceAction::kStatus:
    case DeviceAction::kCapabilities: return false;
    case DeviceAction::kRegister:
    case DeviceAction::kUnregister:
    case DeviceAction::kReserve:
    case DeviceAction::kRelease:
    case DeviceAction::kPreempt:
    case DeviceAction::kPreemptAbort:
    case DeviceAction::kClear: return true;
  }
  return true;  // an action added without a decision is refused, not let through
}

std::string_view action_name(DeviceAction action) {
  switch (action) {
    case DeviceAction::kKeys: return "keys";
    case DeviceAction::kReservation: return "reservation";
    case DeviceAction::kStatus: return "status";
    case DeviceAction::kCapabilities: return "capabilities";
    case DeviceAction::kRegister: return "register";
    case DeviceAction::kUnregister: return "unregister";
    case DeviceAction::kReserve: return "reserve";
    case DeviceAction::kRelease: return "release";
    case DeviceAction::kPreempt: return "preempt";
    case DeviceAction::kPreemptAbort: return "preempt-abort";
    case DeviceAction::kClear: return "clear";
  }
  return "?";
}

Verdict judge(DeviceAction action, bool force, const DaemonAnswer& daemon,
              const std::vector<Target>& targets) {
  Verdict verdict;
  if (force || !changes_reservations(action)) {
    return verdict;
  }
  switch (daemon.kind) {
    case DaemonAnswer::Kind::kAbsent: return verdict;
    case DaemonAnswer::Kind::kSilent: verdict.kind = Verdict::Kind::kUnanswered; return verdict;
    case DaemonAnswer::Kind::kAnswered: break;
  }
  for (const auto& resource : daemon.resources) {
    if (resource.lus.empty()) {
      verdict.waiting.push_back(resource.name);
    }
    for (const auto& target : targets) {
      const bool held = std::any_of(resource.lus.begin(), resource.lus.end(),
                                    [&](const auto& lu) { return same_wwn(lu.wwn, target.wwn); });
      if (held) {
        verdict.managed.push_back(
            {.target = target, .resource = resource.name, .state = resource.state});
      }
    }
  }
  if (!verdict.managed.empty()) {
    verdict.kind = Verdict::Kind::kManaged;
  } else if (!verdict.waiting.empty()) {
    verdict.kind = Verdict::Kind::kWaiting;
  }
  return verdict;
}

std::string refusal_message(DeviceAction action, const Verdict& verdict, const DaemonAnswer& daemon,
                            const std::vector<Target>& targets, const std::string& socket) {
  const std::string what = "device " + std::string(action_name(action)) + " refused, nothing sent";
  switch (verdict.kind) {
    case Verdict::Kind::kProceed: return "";
    case Verdict::Kind::kManaged: {
      std::string text = what + ": blkfenced (socket " + socket + ") manages";
      for (const auto& match : verdict.managed) {
        text += "\n  " + target_text(match.target) + ": resource " + match.resource + ", state " +
                match.state;
      }
      return text +
             "\n  a PR OUT from this host goes out on the daemon's own I_T nexuses and acts on its "
             "key behind its back.\n  To change these LUs, stop blkfenced first (or remove the "
             "resource from blkfence.toml and restart it), or " +
             kForce + ".";
    }
    case Verdict::Kind::kWaiting: {
      std::string names;
      for (const auto& name : verdict.waiting) {
        names += (names.empty() ? "" : ", ") + name;
      }
      std::string text = what + ": blkfenced (socket " + socket + ") has resource(s) " + names +
                         " waiting for devices, and cannot say yet whether they include";
      for (const auto& target : targets) {
        text += "\n  " + target_text(target);
      }
      return text + "\n  Wait until 'blkfencectl status' lists their LUs, or " + kForce + ".";
    }
    case Verdict::Kind::kUnanswered: {
      std::string text = what + ": blkfenced (socket " + socket + ") " + daemon.why +
                         ", so it cannot say whether it manages";
      for (const auto& target : targets) {
        text += "\n  " + target_text(target);
      }
      return text + "\n  See 'systemctl status blkfenced', or " + kForce + ".";
    }
  }
  return what + ".";
}

DaemonAnswer ask_daemon(const std::string& socket, std::chrono::milliseconds bound) {
  const auto silent = [](std::string why) {
    return DaemonAnswer{
        .kind = DaemonAnswer::Kind::kSilent, .why = std::move(why), .resources = {}};
  };
  const auto deadline = Clock::now() + bound;
  auto client = ControlClient::connect(socket);
  if (!client) {
    // No socket, or a socket nobody listens on (a daemon that died): no daemon. Anything else
    // (EACCES on its directory, say) cannot tell, and fails closed.
    const int error = client.error().errno_value();
    if (error == ENOENT || error == ECONNREFUSED) {
      return {};
    }
    return silent("cannot be reached (" + client.error().message() + ")");
  }
  if (auto sent = client->send(
          {.id = 1, .op = control::Op::kStatus, .resource = {}, .node = {}, .timeout = {}});
      !sent) {
    return silent("took no request (" + sent.error().message() + ")");
  }
  for (;;) {
    auto reply = client->next(deadline);
    if (!reply) {
      if (reply.error().code() == ErrorCode::kIndeterminate) {
        return silent("did not answer within " + ms_text(bound));
      }
      return silent("did not answer (" + reply.error().message() + ")");
    }
    if (reply->is_event) {
      continue;
    }
    if (!reply->ok) {
      return silent("answered " + std::string(control::to_string(reply->error->code)) + " (" +
                    reply->error->message + ")");
    }
    DaemonAnswer answer{.kind = DaemonAnswer::Kind::kAnswered, .why = {}, .resources = {}};
    const auto& list = reply->body["resources"];
    if (!list.is_array()) {
      return silent("answered a status without resources");
    }
    for (const auto& json : list) {
      auto status = control::resource_status_from_json(json);
      if (!status) {
        return silent("answered an unreadable status (" + status.error() + ")");
      }
      answer.resources.push_back(std::move(*status));
    }
    return answer;
  }
}

}  // namespace blkfence::cli
