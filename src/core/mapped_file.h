// Read-only memory-mapped file. Weights are used straight from the mapping where the stored
// dtype is the compute dtype; madvise asks for huge pages and read-ahead.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace perry {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws perry::Error naming the path
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

std::string read_text_file(const std::string& path);  // throws perry::Error naming the path

}  // namespace perry
