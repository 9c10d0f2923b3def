// safetensors reader (memory-mapped, validated) and writer.
//
// Layout: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section; offsets are relative to the data section. Every header is validated
// before any tensor is touched: a lying header is an error naming the file, never a crash.
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace perry::io {

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping (or an owned buffer elsewhere)
  size_t nbytes = 0;
  int64_t numel() const;
  std::string shape_str() const;  // "[2048, 512]"
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // maps and validates; throws perry::Error
  // Validates a header + data buffer already in memory (the fuzz target's entry point).
  static std::map<std::string, TensorView> parse(const uint8_t* bytes, size_t size,
                                                 const std::string& origin,
                                                 std::map<std::string, std::string>* metadata = nullptr);
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writer: collects tensors (the bytes are copied at write time from the given pointers, which
// must stay valid until write()), then writes header + data with 8-byte aligned offsets.
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data, size_t nbytes);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  void write(const std::string& path) const;  // throws perry::Error on I/O failure

 private:
  struct Entry { std::string name; DType dtype; std::vector<int64_t> shape; const void* data; size_t nbytes; };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Streaming writer for files larger than memory: the tensor list (names, dtypes, shapes) is fixed
// up front and the header written at once; then each tensor's bytes are appended, in that order,
// one call per tensor, so the caller can produce and drop one tensor at a time. finish() checks
// that every tensor was written; a writer destroyed before finish() deletes its partial file.
class SafetensorsStreamWriter {
 public:
  struct Spec { std::string name; DType dtype; std::vector<int64_t> shape; };
  static size_t spec_bytes(const Spec& s);  // numel * dtype bits / 8
  SafetensorsStreamWriter(std::string path, std::vector<Spec> specs,
                          const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;
  // The next tensor in spec order; `name` and `nbytes` must match it (perry::Error otherwise).
  void write_next(const std::string& name, const void* data, size_t nbytes);
  void finish();
  size_t data_bytes() const { return total_; }

 private:
  std::string path_;
  std::vector<Spec> specs_;
  std::FILE* f_ = nullptr;
  size_t next_ = 0, total_ = 0;
};

}  // namespace perry::io
