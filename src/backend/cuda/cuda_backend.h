// The CUDA backend: runs model::Model::forward on one NVIDIA GPU. The model loads (and quantizes)
// on the host as always; the backend uploads every weight once, keeps the KV cache on the GPU
// (bf16, in the KvCache's backend_state) and runs the decoder with the kernels of
// src/kernels/cuda, fusing what crosses memory: RMSNorm writes the next linear's input directly
// (bf16, or int8 + per-token scale for the W*A8 modes), SiLU·mul likewise, gate|up is one GEMM.
#pragma once
#include <memory>
#include <string>

#include "model/model.h"

namespace perry::cuda {

struct CudaBackendOptions {
  int device = 0;
  // Capture the decode step (every sequence one token) as a CUDA graph and replay it.
  bool cuda_graphs = true;
};

// Uploads `model`'s weights (the model must outlive the backend) and returns the backend to pass to
// Model::set_backend. Throws perry::Error (no GPU / driver, out of memory with the sizes) otherwise.
std::unique_ptr<model::ForwardBackend> make_cuda_backend(const model::Model& model, const CudaBackendOptions& opts,
                                                         const std::function<void(int64_t, int64_t, const std::string&)>& progress = {});

// One line on the GPU for `perry info` (or why none can be used).
std::string cuda_device_report(int device);

// Throws perry::Error saying what to do when `device` cannot run perry's CUDA kernels (no driver,
// no GPU, no such index, compute capability below 8.0) — called before a model is loaded, so a
// wrong --device fails at once, not after minutes of loading and quantizing.
void require_cuda_device(int device);

// Milliseconds the linear layers of one M-row forward take alone (CUDA events, median of 3), so a
// benchmark can report the time a prefill spends outside the GEMMs. 0 when not a CUDA backend.
double cuda_linears_ms(model::ForwardBackend* backend, int M);

// Peak device memory perry held (weights + cache + scratch), bytes; 0 when no backend ran.
size_t cuda_peak_memory(const model::ForwardBackend* backend);

}  // namespace perry::cuda
