// Lab only (PERRY_LAB_DECODE_TIMELINE=file): when each block of a decode kernel started, passed its
// programmatic-dependent-launch wait, had its input row, and ended. The s16 floor split left
// ~0.5 ms of a 2.2 ms w4a8-g128 token to GEMV kernels that read and compute nothing after their
// wait (~3.9 µs each, against ~0.3 µs for a small empty kernel); whether that is the next
// block's launch behind the last one's exit on the same SM, the wait, or the block's own work is
// what these records say (tools/gpu/timeline_report.py reads the file).
//
// One record a block: SM clock cycles (clock64, exact within an SM and comparable between the
// blocks that ran on the same SM) and the global timer (ns, comparable across SMs, coarser).
// The marks live in separate instantiations of the kernels (BlockMarks<true>), launched only while
// a log is installed: with none, the real kernels run without any trace of the lab.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace perry::cuda {

enum class TimelineKernel : uint32_t { GemvDecode = 1, AttentionPartial = 2, AttentionCombine = 3 };

struct TimelineRecord {
  uint32_t kernel;  // TimelineKernel
  uint32_t smid;
  uint32_t block;   // blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)
  uint32_t arg;     // gemv_decode: K << 8 | input kind << 4 | output kind; attention: 0
  uint64_t g_start, g_end;                          // %globaltimer, ns
  // clock64 of the block's SM; c_input: gemv_decode's input row built, attention's work done
  uint64_t c_start, c_waited, c_input, c_end;
};
static_assert(sizeof(TimelineRecord) == 64, "the file format is the raw records");

// Device memory: a counter, the capacity, then the records (slots past the capacity are counted
// but not written, so a short log says how much it missed).
struct TimelineLog {
  unsigned long long count, capacity;
};

// The log that the decode kernels of gemv_decode.cu and attention_decode.cu write into (nullptr:
// off). Not thread-safe against kernels in flight: install before the first decode step.
void gemv_decode_set_lab_timeline(TimelineLog* log);
void attention_decode_set_lab_timeline(TimelineLog* log);

// Owns a device log of `capacity` records, installed into both kernel files while it lives; its
// records go to `path`: the magic "perrytl1", the records written and the records missed (uint64
// each), then the TimelineRecord rows.
class LabTimeline {
 public:
  LabTimeline(std::string path, size_t capacity);
  ~LabTimeline();
  LabTimeline(const LabTimeline&) = delete;
  LabTimeline& operator=(const LabTimeline&) = delete;
  // Copies the records written so far to the file; returns how many (the device must be idle).
  size_t write() const;
  TimelineLog* device_log() const { return log_; }

 private:
  std::string path_;
  size_t capacity_;
  TimelineLog* log_ = nullptr;
};

}  // namespace perry::cuda
