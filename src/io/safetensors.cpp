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

void SafetensorsWriter::write(const std::string& path) const {
  json h = json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  uint64_t off = 0;
  std::vector<uint64_t> begins;
  for (const auto& e : entries_) {
    begins.push_back(off);
    h[e.name] = {{"dtype", std::string(dtype_name(e.dtype))}, {"shape", e.shape},
                 {"data_offsets", {off, off + e.nbytes}}};
    off += e.nbytes;
  }
  std::string hs = h.dump();
  while ((hs.size() + 8) % 8) hs.push_back(' ');  // data section 8-byte aligned
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("cannot create {}: {}", path, std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(hs.size()) >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(hs.data(), 1, hs.size(), f) == hs.size();
  for (const auto& e : entries_)
    ok = ok && (e.nbytes == 0 || std::fwrite(e.data, 1, e.nbytes, f) == e.nbytes);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) fail("failed writing {} (disk full?)", path);
}

}  // namespace perry::io
