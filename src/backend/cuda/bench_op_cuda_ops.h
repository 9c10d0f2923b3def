// The operations `perry bench-op --device cuda` times, one call each: perry's linear layer in
// every mode exactly as CudaLinear::forward (cuda_linear.cpp) runs it — the kernels of
// linear_path(mode, M, K), the choice CudaLinear makes, called with CudaLinear::run's arguments —
// the activation quantizations on their own (int8 and e4m3), and the library peers
// (bench_peers.h); plus their host references, used to check the timed outputs so that a broken
// kernel cannot post a fast time.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/device_memory.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/bench_peers.h"
#include "quant/quant.h"

namespace perry::cuda::benchop {

enum class Op : uint8_t {
  Quantize,     // quantize_per_token of the bf16 activation, alone
  QuantizeFp8,  // quantize_per_token_fp8 of it, alone (timed only next to w8a8-fp8)
  Bf16, W8A16, W4A16, W8A8, W8A8Mma, W8A8G128, W8A8G64, W4A8, W4A8G128, W8A8Fp8,  // perry
  CublasBf16, LtI8I32, LtI8I8, LtE4M3,                                               // peers
};
enum class Kind : uint8_t { Quantize, Perry, Peer };
enum class WFmt : uint8_t { None, BF16, I8, I4, E4M3 };  // how the op's weight is stored

struct OpInfo {
  Op op;
  const char* name;  // the row name: "w8a8-g128", "cublaslt-i8-i32", ...
  Kind kind;
  WFmt fmt;
  quant::QuantMode mode;  // perry ops: the mode; others: unused (BF16)
};
const OpInfo& op_info(Op op);
// The perry op of a quantized mode (w8a8: Op::W8A8, never the comparison row W8A8Mma).
Op perry_op(quant::QuantMode mode);
// The kernels a perry op runs for M rows of K inputs: CudaLinear's own choice,
// linear_path(mode, M, K; w4a8-g128 with two-level scales, as bench-op's weights have them),
// except w8a8-mma (Op::W8A8Mma), which forces gemm_w8a8 (mma.sync): the comparison row for where w8a8 takes the sm_90 wgmma kernel — the same data on the kernel a
// non-Hopper GPU, or PERRY_NO_WGMMA=1, would run there.
// N: the layer's outputs (0: unknown; linear_path's short-prompt rule needs it).
LinearPath op_path(Op op, int M, int K, int N = 0);
// Whether `op` has a row at M: all but w8a8-mma, timed only where w8a8 runs wgmma (elsewhere it
// would repeat w8a8's row, or time gemm_w8a8 at an M where the model runs another kernel).
bool has_row(Op op, int M, int K);
// Whether perry's row of op at M rows times the decode step's kernel (gemv_decode) — M = 1, every
// mode the decode step fuses — instead of the CudaLinear path (linear_path).
bool decode_kernel_row(Op op, int M, int K);
// perry's quantized modes: weights with scales [N, G] in the layout of scale_group(op).
bool has_weight_scales(Op op);
// Int8 per-token activations (the W*A8 modes, the cuBLASLt int8 peers). Not w8a8-fp8.
bool reads_int8_activations(Op op);
// The perry ops whose call starts with a per-token quantization of the bf16 activation (the W*A8
// modes: int8; w8a8-fp8: e4m3): run_op(quantize = false) skips it, and quantize_op(op) times it
// alone.
bool quantizes_activations(Op op);
Op quantize_op(Op op);
// Group size of the op's weight scales: 0 = per channel (w8a8-fp8) or no scales (float weights,
// the fp8 peer).
int scale_group(Op op);
// The output of op's call: the peers' own (cuBLAS bf16: bf16; cuBLASLt: int32, int8, bf16), perry's
// layers OpContext::float_out (F32 below, for ops that take no context) — except where the layer's
// kernel writes fp32 only: the decode step's kernel (M = 1, it adds to y), gemm_small_m, gemv_quant.
DType output_dtype(Op op);
DType output_dtype(Op op, int M, int K, int N, DType float_out);
// Bytes of the weight row of `fmt` for K inputs.
size_t weight_row_bytes(WFmt fmt, int K);

// Device pointers of one call. Every op reads the bf16 activation x [M, K] or what is derived
// from it: xq / sa (written by the W*A8 ops' quantization step, read by the cuBLASLt int8 peers),
// xf8 / sf8 (e4m3 codes and fp32 scales of x, written by w8a8-fp8's own quantization step) and x8
// (the fp8 peer's input: random e4m3 bytes of their own, not derived from x, so the two e4m3
// buffers are kept apart). y [M, N] in output_dtype(op).
struct OpArgs {
  const void* w = nullptr;
  const float* scales = nullptr;  // [N, G] in the op's scale layout (quantized modes)
  // w4a8-g128: the two-level factors of `scales` (quant/two_level_scales.h), channel fp32 [N] and
  // multipliers int8 [N, G], which its prefill path runs on (bench-op's weights always have them).
  const float* channel_scales = nullptr;
  const int8_t* multipliers = nullptr;
  const uint16_t* x = nullptr;
  const float* x32 = nullptr;  // x's first row as fp32: the input of the decode step's kernel at M = 1
  int8_t* xq = nullptr;
  float* sa = nullptr;
  const uint8_t* x8 = nullptr;
  uint8_t* xf8 = nullptr;
  float* sf8 = nullptr;
  void* y = nullptr;
  int M = 0, N = 0, K = 0;
};

struct OpContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;       // set to `stream`
  uint16_t* dequant_scratch = nullptr;  // bf16 [N, K] (w8a16 / w4a16 on LinearPath::DequantCublas)
  void* lt_workspace = nullptr;
  const LtGemm* lt_i8_i32 = nullptr;
  const LtGemm* lt_i8_i8 = nullptr;
  const LtGemm* lt_e4m3 = nullptr;
  int32_t* splitk = nullptr;  // sm_90: the split-K partial sums of gemm_w8a8_wgmma / gemm_quant_wgmma, as CudaLinear
  size_t splitk_bytes = 0;
  uint32_t* splitk_flags = nullptr;  // gemm_w8a8_wgmma's split-K tile counters (zeroed), as CudaLinear
  // perry's layers' output (F32 or BF16; see output_dtype): bf16 is what the model's linears write,
  // and what the cuBLAS bf16 baseline writes.
  DType float_out = DType::F32;
};

// Waits for `stream` like cudaStreamSynchronize, but gives up after `seconds`: a kernel that
// hangs (an experimental one waiting on a barrier forever) then throws HangError naming `what`.
// After a HangError the process cannot clean up CUDA (that would wait forever): write what you
// have and std::_Exit.
struct HangError : Error {
  using Error::Error;
};
void sync_or_hang(cudaStream_t stream, double seconds, const std::string& what);

// One call on ctx.stream. quantize = false: the ops of quantizes_activations() skip their
// activation quantization (the GEMM alone, reading xq / sa or xf8 / sf8 as they are).
void run_op(Op op, const OpArgs& a, bool quantize, const OpContext& ctx);
// Which kernels run_op launches for M rows of K inputs (perry ops: linear_path_name's words).
std::string kernel_name(Op op, int M, int K, const OpContext& ctx, int N = 0);

// One weight row on the host (copied from the device): the raw row bytes in the op's format and
// the row's scales (G of them; none for float weights and the peers).
struct HostRow {
  const uint8_t* w = nullptr;
  const float* scales = nullptr;
};
// Activation row m on the host: x as floats (the bf16 values), its per-token quantization
// (quant::quantize_row_ref), the fp8 peer's e4m3 bytes, and x's own e4m3 form by w8a8-fp8's rule
// (quant::quantize_row_fp8_ref: codes and the row's scale).
struct HostAct {
  const float* x = nullptr;
  const int8_t* xq = nullptr;
  float sa = 0;
  const uint8_t* x8 = nullptr;
  const uint8_t* xf8 = nullptr;
  float sf8 = 0;
};
// The exact result of output element (m, n) in float64 (the int8 peers: the integer result; the
// int8-output peer: its saturated rounding of alpha·acc; w8a8-fp8: Σ_k e4m3(x)·e4m3(w) · sf8 · sw
// over the decoded codes).
double reference(Op op, const HostRow& w, const HostAct& x, int K, float lt_alpha);
double e4m3_to_double(uint8_t b);
// Element n of a downloaded output row of dtype `out` (output_dtype(op, M, K, N, float_out)).
double output_value(DType out, const void* row, int n);

// Output check: err = max |got − ref| / rms(ref) over the compared elements (NaN/inf → inf).
// Integer outputs must match exactly (int32) or within 1 (int8, rounding mode); float outputs
// need err <= kErrLimit (bf16 output rounding is ~0.004 of the largest values).
// The fp8 GEMMs (w8a8-fp8, the cuBLASLt fast-accumulation peer) are not exact even in fp32:
// Hopper's fp8 MMA adds a k-step's products at ~13-14 bits. Their error should stay below the
// limit: the e4m3 peer (fast accumulation: no promotion to fp32 registers, like gemm_fp8_wgmma,
// which keeps one wgmma accumulator for all of K) measured 0.004-0.007 at K = 4096 on the
// H200 (docs/perf/cuda/bench-op-cuda-quick.json), no more than cuBLAS bf16's bf16 output rounding
// next to it, so its accumulation error is <= ~0.003 of rms there. Random rounding errors add up
// ~sqrt(K) relative to rms (≈ 0.006 at K = 14336), a fully biased one ~K (≈ 0.011); w8a8-fp8's
// per-channel scales (bench weights: sw in [1e-3, 2e-2]) can put the largest error in a column
// with ~1.7× the rms scale: ≤ ~0.02 in the worst case. (The kernel test's bound, 1.6e-3 of
// Σ|x·w| on random full-range codes, says less here: Σ|x·w| ≈ 0.75·sqrt(K)·rms for these data.)
constexpr double kErrLimit = 3e-2;
struct Verdict {
  bool ok = true;
  double err = 0;
  std::string what;  // "max err 2.1e-07" / "FAIL ..."
};
Verdict judge(Op op, const std::vector<double>& got, const std::vector<double>& ref);

// The startup check's row counts: at K = 1024 they reach every path of linear_path — gemv_quant
// (1, 3), gemm_small_m (5, 16; w4a16 5; weight-only without the fused GEMM 5-48), the mma.sync GEMMs
// (48, 100), dequantize + cuBLAS (100, 200 without sm_90) and, on sm_90, the wgmma GEMMs (200;
// w8a8-mma's only row), the fused weight-only GEMM (5 / 16-300, split: N 384 is 3 weight tiles) and the int4 prefill
// paths past their crossovers at 257 rows (300: w4a8 expanded, w4a8-g128 two-level).
inline constexpr int kStartupCheckMs[] = {1, 3, 5, 16, 48, 100, 200, 300};
inline constexpr int kStartupCheckN = 384;
// The weight-only ops' second case: the fused GEMM takes layers narrower than
// kWeightOnlyWgmmaMinN only where its split-K plan splits them, so at N 3072 (24 weight tiles) it
// takes 200 rows (48 tiles for 132 SMs: split) and leaves 300 (72 tiles) to dequantize + cuBLAS.
inline constexpr int kStartupCheckWeightOnlyN = 3072;
inline constexpr int kStartupCheckWeightOnlyMs[] = {200, 300};
// The startup check: every perry op in `ops` at N = kStartupCheckN, K = 1024, M in kStartupCheckMs
// (where has_row; the weight-only ops also at kStartupCheckWeightOnlyN × kStartupCheckWeightOnlyMs,
// with the fused GEMM's split-K workspace), with weights from quant::quantize_weight (perry's CPU quantizer), against float64 of
// the mode's math (quant::dequantize_weight, quant::quantize_row_ref; w8a8-fp8: the decoded e4m3 codes of
// quantize_weight and quant::quantize_row_fp8_ref, and the device's e4m3 activations must equal
// the host's byte for byte); the error against the unquantized float product is reported
// alongside (the mode's quantization error, information only).
struct StartupCheck {
  std::string op;
  int M = 0;
  int N = 0;
  std::string kernel;  // kernel_name: which path this M checked
  Verdict verdict;
  double err_float = 0;
};
std::vector<StartupCheck> startup_checks(const std::vector<Op>& ops, DevicePool& pool, cudaStream_t stream,
                                         cublasHandle_t blas);

}  // namespace perry::cuda::benchop
