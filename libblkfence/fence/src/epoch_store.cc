// The persisted epochs of each resource (fence layer). See epoch_store.h.
#include "blkfence/fence/epoch_store.h"

#include <cerrno>
#include <charconv>
#include <optional>
#include <string_view>

#include <fcntl.h>
#include <unistd.h>

#include "blkfence/assert.h"
#include "blkfence/unique_fd.h"

namespace blkfence::fence {
namespace {

int or_errno(int result) {
  return result < 0 ? -errno : result;
}

std::optional<std::uint32_t> parse_epoch(std::string_view text) {
  std::uint32_t epoch = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), epoch);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) {
    return std::nullopt;
  }
  return epoch;
}

constexpr std::string_view kRegistering = " registering";

// "USED SEEN registering\n", "USED SEEN\n" or "USED\n"; a missing newline is forgiven (a file
// written by hand).
std::optional<StoredEpochs> parse(std::string_view text) {
  if (!text.empty() && text.back() == '\n') {
    text.remove_suffix(1);
  }
  const bool registering = text.ends_with(kRegistering);
  if (registering) {
    text.remove_suffix(kRegistering.size());
  }
  const std::size_t space = text.find(' ');
  const auto used = parse_epoch(text.substr(0, space));
  const auto seen = space == std::string_view::npos ? used : parse_epoch(text.substr(space + 1));
  if (!used || !seen || *seen < *used || (registering && space == std::string_view::npos)) {
    return std::nullopt;
  }
  return StoredEpochs{.used = *used, .seen = *seen, .registering = registering};
}

class FileEpochStore final : public EpochStore {
 public:
  FileEpochStore(std::string dir, EpochFileCalls calls)
      : dir_(std::move(dir)), calls_(std::move(calls)) {}

  std::string where(const std::string& resource) const override {
    return dir_ + "/" + resource + ".epoch";
  }

  Result<std::optional<StoredEpochs>> load(const std::string& resource) override {
    const std::string path = where(resource);
    const int opened = calls_.open(path, O_RDONLY | O_CLOEXEC, 0);
    if (opened == -ENOENT) {
      return std::nullopt;
    }
    if (opened < 0) {
      return tl::unexpected(Error::os(-opened, "open " + path));
    }
    const UniqueFd fd(opened);
    // One read: the file is a few bytes written whole by store(); a longer one is not ours.
    char text[48];
    const ssize_t got = calls_.read(fd.get(), text, sizeof text);
    if (got < 0) {
      return tl::unexpected(Error::os(static_cast<int>(-got), "read " + path));
    }
    const auto parsed = parse(std::string_view(text, static_cast<std::size_t>(got)));
    if (!parsed) {
      return fail(ErrorCode::kInvalidArgument,
                  path + (got == 0 ? ": empty" : ": truncated or not epochs") +
                      " (expected one or two decimal numbers 0..4294967295, the second not below "
                      "the first, the word registering after two, and a newline); it holds the "
                      "highest epochs of this resource the "
                      "node used and saw: restore it, or remove it while the LUs still carry this "
                      "cluster's keys (the daemon then stores the highest epoch they show; "
                      "docs/operations.md)");
    }
    return *parsed;
  }

  Result<void> store(const std::string& resource, StoredEpochs epochs) override {
    const std::string path = where(resource);
    BLKFENCE_ASSERT(epochs.seen >= epochs.used);
    const std::string temporary = path + ".new";
    std::string text = std::to_string(epochs.used);
    if (epochs.seen != epochs.used || epochs.registering) {
      text += " " + std::to_string(epochs.seen);
    }
    if (epochs.registering) {
      text += kRegistering;
    }
    if (auto written = write_durably(temporary, text + "\n"); !written) {
      (void)calls_.unlink(temporary);  // the old file is intact; the temporary is litter
      return written;
    }
    if (const int renamed = calls_.rename(temporary, path); renamed < 0) {
      (void)calls_.unlink(temporary);
      return tl::unexpected(Error::os(-renamed, "rename " + temporary + " to " + path));
    }
    // The rename is durable only once the directory is (rename(2) is atomic, not synchronous).
    const int opened = calls_.open(dir_, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (opened < 0) {
      return tl::unexpected(Error::os(-opened, "open directory " + dir_));
    }
    const UniqueFd dir(opened);
    if (const int synced = calls_.fsync(dir.get()); synced < 0) {
      return tl::unexpected(Error::os(-synced, "fsync directory " + dir_));
    }
    return {};
  }

 private:
  Result<void> write_durably(const std::string& temporary, const std::string& text) {
    const int opened = calls_.open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (opened < 0) {
      return tl::unexpected(Error::os(-opened, "create " + temporary));
    }
    const UniqueFd fd(opened);
    std::size_t done = 0;
    while (done < text.size()) {  // a short write is retried; no progress at all is a full disk
      const ssize_t wrote = calls_.write(fd.get(), text.data() + done, text.size() - done);
      if (wrote <= 0) {
        return tl::unexpected(
            Error::os(wrote == 0 ? ENOSPC : static_cast<int>(-wrote), "write " + temporary));
      }
      done += static_cast<std::size_t>(wrote);
    }
    if (const int synced = calls_.fsync(fd.get()); synced < 0) {
      return tl::unexpected(Error::os(-synced, "fsync " + temporary));
    }
    return {};
  }

  std::string dir_;
  EpochFileCalls calls_;
};

}  // namespace

EpochFileCalls EpochFileCalls::system() {
  return EpochFileCalls{
      .open = [](const std::string& path, int flags,
                 mode_t mode) { return or_errno(::open(path.c_str(), flags, mode)); },
      .read =
          [](int fd, void* buffer, std::size_t size) {
            const ssize_t got = ::read(fd, buffer, size);
            return got < 0 ? -static_cast<ssize_t>(errno) : got;
          },
      .write =
          [](int fd, const void* buffer, std::size_t size) {
            const ssize_t wrote = ::write(fd, buffer, size);
            return wrote < 0 ? -static_cast<ssize_t>(errno) : wrote;
          },
      .fsync = [](int fd) { return or_errno(::fsync(fd)); },
      .rename = [](const std::string& from,
                   const std::string& to) { return or_errno(::rename(from.c_str(), to.c_str())); },
      .unlink = [](const std::string& path) { return or_errno(::unlink(path.c_str())); },
  };
}

std::unique_ptr<EpochStore> make_file_epoch_store(std::string dir, EpochFileCalls calls) {
  return std::make_unique<FileEpochStore>(std::move(dir), std::move(calls));
}

Result<std::optional<StoredEpochs>> MemoryEpochStore::load(const std::string& resource) {
  const auto it = epochs_.find(resource);
  return it == epochs_.end() ? std::nullopt : std::optional(it->second);
}

Result<void> MemoryEpochStore::store(const std::string& resource, StoredEpochs epochs) {
  BLKFENCE_ASSERT(epochs.seen >= epochs.used);
  epochs_[resource] = epochs;
  return {};
}

std::string MemoryEpochStore::where(const std::string& resource) const {
  return "memory:" + resource + ".epoch";
}

}  // namespace blkfence::fence
