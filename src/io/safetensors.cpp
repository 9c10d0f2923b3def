#include "io/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace perry::io {

using nlohmann::json;

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {
// The format caps headers at 100 MB; anything larger is corrupt (and would be a huge allocation).
constexpr uint64_t kMaxHeader = 100ull << 20;
}  // namespace

std::map<std::string, TensorView> SafetensorsFile::parse(const uint8_t* bytes, size_t size,
                                                         const std::string& origin,
                                                         std::map<std::string, std::string>* metadata) {
  if (size < 8) fail("{}: not a safetensors file (only {} bytes, the 8-byte header length is missing)", origin, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > kMaxHeader) fail("{}: corrupt safetensors header: header length {} exceeds the 100 MB limit", origin, n);
  if (n > size - 8)
    fail("{}: truncated safetensors file: header length {} runs past the end of the file ({} bytes)", origin, n, size);
  json h;
  try {
    h = json::parse(bytes + 8, bytes + 8 + n);
  } catch (const json::exception& e) {
    fail("{}: safetensors header is not valid JSON: {}", origin, e.what());
  }
  if (!h.is_object()) fail("{}: safetensors header must be a JSON object", origin);
  const uint8_t* data = bytes + 8 + n;
  const uint64_t data_size = size - 8 - n;

  std::map<std::string, TensorView> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) fail("{}: __metadata__ must be an object of strings", origin);
      if (metadata)
        for (auto m = e.begin(); m != e.end(); ++m)
          if (m.value().is_string()) (*metadata)[m.key()] = m.value().get<std::string>();
      continue;
    }
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      fail("{}: tensor '{}': entry must have dtype, shape and data_offsets", origin, name);
    TensorView t;
    t.name = name;
    if (!e["dtype"].is_string() || !parse_safetensors_dtype(e["dtype"].get<std::string>(), &t.dtype))
      fail("{}: tensor '{}': unsupported dtype {}", origin, name, e["dtype"].dump());
    const json& shape = e["shape"];
    if (!shape.is_array()) fail("{}: tensor '{}': shape must be an array", origin, name);
    uint64_t numel = 1;
    for (const json& d : shape) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        fail("{}: tensor '{}': shape entries must be non-negative integers, got {}", origin, name, shape.dump());
      uint64_t v = d.get<uint64_t>();
      if (v != 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / v)
        fail("{}: tensor '{}': shape {} overflows", origin, name, shape.dump());
      numel *= v;
      t.shape.push_back(int64_t(v));
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail("{}: tensor '{}': data_offsets must be two non-negative integers", origin, name);
    uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en) fail("{}: tensor '{}': data_offsets [{}, {}] are reversed", origin, name, b, en);
    if (en > data_size)
      fail("{}: tensor '{}': data_offsets [{}, {}] run past the end of the data section ({} bytes) — the file is truncated or the header lies",
           origin, name, b, en, data_size);
    uint64_t expect = numel * dtype_bits(t.dtype) / 8;
    if (en - b != expect)
      fail("{}: tensor '{}': {} bytes for shape {} of {} (expected {})", origin, name, en - b,
           t.shape_str(), dtype_name(t.dtype), expect);
    t.data = data + b;
    t.nbytes = size_t(en - b);
    if (t.nbytes) ranges.emplace_back(b, en);
    out.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      fail("{}: tensor data ranges overlap ([{}, {}) and [{}, {})) — corrupt header", origin,
           ranges[i - 1].first, ranges[i - 1].second, ranges[i].first, ranges[i].second);
  return out;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  tensors_ = parse(file_.data(), file_.size(), path, &metadata_);
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            const void* data, size_t nbytes) {
  entries_.push_back({name, dtype, std::move(shape), data, nbytes});
}

namespace {
// Header JSON for tensors laid out back to back in the given order, padded with spaces so the
// data section starts 8-byte aligned.
struct HeaderEntry { const std::string* name; DType dtype; const std::vector<int64_t>* shape; size_t nbytes; };
std::string make_header(const std::vector<HeaderEntry>& entries, const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& e : entries) {
    h[*e.name] = {{"dtype", std::string(dtype_name(e.dtype))}, {"shape", *e.shape},
                  {"data_offsets", {off, off + e.nbytes}}};
    off += e.nbytes;
  }
  std::string hs = h.dump();
  while ((hs.size() + 8) % 8) hs.push_back(' ');
  return hs;
}

bool write_header(std::FILE* f, const std::string& hs) {
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(hs.size()) >> (8 * i));
  return std::fwrite(len, 1, 8, f) == 8 && std::fwrite(hs.data(), 1, hs.size(), f) == hs.size();
}
}  // namespace

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<HeaderEntry> he;
  for (const auto& e : entries_) he.push_back({&e.name, e.dtype, &e.shape, e.nbytes});
  const std::string hs = make_header(he, metadata_);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("cannot create {}: {}", path, std::strerror(errno));
  bool ok = write_header(f, hs);
  for (const auto& e : entries_)
    ok = ok && (e.nbytes == 0 || std::fwrite(e.data, 1, e.nbytes, f) == e.nbytes);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) fail("failed writing {} (disk full?)", path);
}

size_t SafetensorsStreamWriter::spec_bytes(const Spec& s) {
  uint64_t n = 1;
  for (int64_t d : s.shape) n *= uint64_t(d);
  return size_t(n * dtype_bits(s.dtype) / 8);
}

SafetensorsStreamWriter::SafetensorsStreamWriter(std::string path, std::vector<Spec> specs,
                                                 const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), specs_(std::move(specs)) {
  std::vector<HeaderEntry> he;
  for (const auto& s : specs_) {
    for (int64_t d : s.shape) PERRY_CHECK(d >= 0, "{}: tensor '{}' has a negative dimension", path_, s.name);
    he.push_back({&s.name, s.dtype, &s.shape, spec_bytes(s)});
  }
  const std::string hs = make_header(he, metadata);
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) fail("cannot create {}: {}", path_, std::strerror(errno));
  if (!write_header(f_, hs)) {
    std::fclose(f_);
    f_ = nullptr;
    std::remove(path_.c_str());
    fail("failed writing {} (disk full?)", path_);
  }
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (f_) {  // not finished: an incomplete file must not look like a checkpoint
    std::fclose(f_);
    std::remove(path_.c_str());
  }
}

void SafetensorsStreamWriter::write_next(const std::string& name, const void* data, size_t nbytes) {
  PERRY_CHECK(f_ != nullptr, "{}: write after finish()", path_);
  PERRY_CHECK(next_ < specs_.size(), "{}: tensor '{}' is beyond the {} declared tensors", path_, name, specs_.size());
  const Spec& s = specs_[next_];
  PERRY_CHECK(name == s.name, "{}: expected tensor '{}' next, got '{}'", path_, s.name, name);
  PERRY_CHECK(nbytes == spec_bytes(s), "{}: tensor '{}': {} bytes given, {} declared", path_, name, nbytes,
              spec_bytes(s));
  if (nbytes && std::fwrite(data, 1, nbytes, f_) != nbytes) fail("failed writing {} (disk full?)", path_);
  total_ += nbytes;
  ++next_;
}

void SafetensorsStreamWriter::finish() {
  PERRY_CHECK(f_ != nullptr, "{}: finish() called twice", path_);
  PERRY_CHECK(next_ == specs_.size(), "{}: only {} of {} tensors were written", path_, next_, specs_.size());
  const bool ok = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok) {
    std::remove(path_.c_str());
    fail("failed writing {} (disk full?)", path_);
  }
}

}  // namespace perry::io
