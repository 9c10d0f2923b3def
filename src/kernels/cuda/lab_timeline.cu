// The decode timeline lab's host side (lab_timeline.h): the device log and its file.
#include "kernels/cuda/lab_timeline.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_error.h"

namespace perry::cuda {

LabTimeline::LabTimeline(std::string path, size_t capacity) : path_(std::move(path)), capacity_(capacity) {
  if (capacity_ == 0) throw Error("lab timeline: capacity must be positive");
  check_cuda(cudaMalloc(&log_, sizeof(TimelineLog) + capacity_ * sizeof(TimelineRecord)), "cudaMalloc (lab timeline)");
  const TimelineLog head{0, capacity_};
  check_cuda(cudaMemcpy(log_, &head, sizeof head, cudaMemcpyHostToDevice), "cudaMemcpy (lab timeline)");
  gemv_decode_set_lab_timeline(log_);
  attention_decode_set_lab_timeline(log_);
}

LabTimeline::~LabTimeline() {
  // (Destructors do not throw: a failure here only loses the lab's pointer reset.)
  try {
    gemv_decode_set_lab_timeline(nullptr);
    attention_decode_set_lab_timeline(nullptr);
  } catch (...) {
  }
  cudaFree(log_);
}

size_t LabTimeline::write() const {
  TimelineLog head{};
  check_cuda(cudaMemcpy(&head, log_, sizeof head, cudaMemcpyDeviceToHost), "cudaMemcpy (lab timeline)");
  const size_t n = size_t(std::min<unsigned long long>(head.count, capacity_));
  std::vector<TimelineRecord> rows(n);
  if (n)
    check_cuda(cudaMemcpy(rows.data(), log_ + 1, n * sizeof(TimelineRecord), cudaMemcpyDeviceToHost),
               "cudaMemcpy (lab timeline)");
  std::FILE* f = std::fopen(path_.c_str(), "wb");
  if (!f) throw Error("lab timeline: cannot write " + path_);
  const uint64_t count = n, missed = head.count - n;
  const bool ok = std::fwrite("perrytl1", 1, 8, f) == 8 && std::fwrite(&count, 8, 1, f) == 1 &&
                  std::fwrite(&missed, 8, 1, f) == 1 && (n == 0 || std::fwrite(rows.data(), sizeof(TimelineRecord), n, f) == n);
  if (std::fclose(f) != 0 || !ok) throw Error("lab timeline: writing " + path_ + " failed");
  return n;
}

}  // namespace perry::cuda
