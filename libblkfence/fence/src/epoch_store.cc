// The persisted high-water epoch (fence layer). See epoch_store.h.
#include "blkfence/fence/epoch_store.h"

#include <cerrno>
#include <charconv>
#include <string_view>

#include <fcntl.h>
#include <unistd.h>

#include "blkfence/unique_fd.h"

namespace blkfence::fence {
namespace {

class FileEpochStore final : public EpochStore {
 public:
  explicit FileEpochStore(std::string dir) : dir_(std::move(dir)) {}

  Result<std::uint32_t> load(const std::string& resource) override {
    const std::string path = dir_ + "/" + resource + ".epoch";
    const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT) {
        return 0U;
      }
      return tl::unexpected(Error::os(errno, "open " + path));
    }
    char text[32];
    const ssize_t got = ::read(fd.get(), text, sizeof text - 1);
    if (got < 0) {
      return tl::unexpected(Error::os(errno, "read " + path));
    }
    std::string_view view(text, static_cast<std::size_t>(got));
    while (!view.empty() && (view.back() == '\n' || view.back() == ' ')) {
      view.remove_suffix(1);
    }
    std::uint32_t epoch = 0;
    const auto [end, ec] = std::from_chars(view.data(), view.data() + view.size(), epoch);
    if (ec != std::errc{} || end != view.data() + view.size() || view.empty()) {
      return fail(ErrorCode::kInvalidArgument,
                  path +
                      ": not an epoch (expected a decimal number 0..4294967295); it holds the "
                      "highest epoch this node used, so fix or remove it only knowing that");
    }
    return epoch;
  }

  Result<void> store(const std::string& resource, std::uint32_t epoch) override {
    const std::string path = dir_ + "/" + resource + ".epoch";
    const std::string temporary = path + ".new";
    {
      const UniqueFd fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
      if (!fd.valid()) {
        return tl::unexpected(Error::os(errno, "create " + temporary));
      }
      const std::string text = std::to_string(epoch) + "\n";
      if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
        return tl::unexpected(Error::os(errno == 0 ? EIO : errno, "write " + temporary));
      }
      if (::fsync(fd.get()) != 0) {
        return tl::unexpected(Error::os(errno, "fsync " + temporary));
      }
    }
    if (::rename(temporary.c_str(), path.c_str()) != 0) {
      return tl::unexpected(Error::os(errno, "rename " + temporary));
    }
    const UniqueFd dir(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid() || ::fsync(dir.get()) != 0) {
      return tl::unexpected(Error::os(errno, "fsync " + dir_));
    }
    return {};
  }

 private:
  std::string dir_;
};

}  // namespace

std::unique_ptr<EpochStore> make_file_epoch_store(std::string dir) {
  return std::make_unique<FileEpochStore>(std::move(dir));
}

Result<std::uint32_t> MemoryEpochStore::load(const std::string& resource) {
  const auto it = epochs_.find(resource);
  return it == epochs_.end() ? 0U : it->second;
}

Result<void> MemoryEpochStore::store(const std::string& resource, std::uint32_t epoch) {
  epochs_[resource] = epoch;
  return {};
}

}  // namespace blkfence::fence
