// forgekit's cuDNN convolution for CUDA artifacts: compiled into the artifact's library when the build routes
// convolutions to cuDNN (forgekit/backends/cuda/cudnn.py), found by the Relax VM as the library's own symbol
// `__tvm_ffi_forgekit_cudnn_conv2d` (so two artifacts in one process never clash over a global name).
//
//   forgekit_cudnn_conv2d(x, w, attrs: Shape, y)
//   attrs = [layout (0 NCHW/OIHW, 1 NHWC/OHWI), pad_h, pad_w, stride_h, stride_w, dil_h, dil_w, groups,
//            math (0: fp32 FMA only, 1: tensor cores allowed)]
//   y = conv(x, w), accumulated in fp32 and rounded once to y's dtype (x's).  The epilogue is TVM's, fused into
//   one kernel: cudnnConvolutionBiasActivationForward ran without tensor cores (forgekit/backends/cuda/cudnn.py).
//
// Why not TVM's own cuDNN support: the apache-tvm wheel is built without it (no relax.ext.cudnn, no
// tvm.contrib.cudnn.* functions), and its JSON-runtime route would need a TVM runtime built from source.
// The legacy convolution API is used (not cuDNN's graph API) for its small surface: one call per convolution and
// cudnnFind's measured choice of kernel (like torch.backends.cudnn.benchmark).  PyTorch goes through the graph
// API (cudnn-frontend), which can also fuse epilogues on tensor cores: the next step (docs/gpu.md).
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include "forgekit_ext.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

#define FK_CUDNN(expr)                                                                              \
  do {                                                                                              \
    cudnnStatus_t status_ = (expr);                                                                 \
    if (status_ != CUDNN_STATUS_SUCCESS)                                                            \
      TVM_FFI_THROW(RuntimeError) << "cuDNN " << #expr << ": " << cudnnGetErrorString(status_);    \
  } while (0)

enum Attr { kLayout, kPadH, kPadW, kStrideH, kStrideW, kDilH, kDilW, kGroups, kMath, kNumAttrs };

cudnnDataType_t DataType(const DLTensor* t) {
  if (t->dtype.code == kDLFloat && t->dtype.bits == 32) return CUDNN_DATA_FLOAT;
  if (t->dtype.code == kDLFloat && t->dtype.bits == 16) return CUDNN_DATA_HALF;
  if (t->dtype.code == kDLBfloat && t->dtype.bits == 16) return CUDNN_DATA_BFLOAT16;
  TVM_FFI_THROW(TypeError) << "forgekit_cudnn_conv2d: unsupported dtype code " << int(t->dtype.code) << " bits "
                           << int(t->dtype.bits);
  return CUDNN_DATA_FLOAT;  // not reached
}

using forgekit::Data;

// One convolution shape's descriptors and the algorithm cudnnFind chose for it, kept for the process.
struct Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  cudnnMathType_t math = CUDNN_FMA_MATH;
  size_t workspace = 0;
  std::string found;  // what cudnnFind measured, "algo:math:ms" fastest first (for benchmark reports)
  ~Plan() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

struct DeviceState {
  cudnnHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_size = 0;
  std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans;
};

std::mutex mutex;  // one cuDNN handle per device; calls on a device are serialized, as on a stream

std::map<int, std::unique_ptr<DeviceState>>& States() {
  static std::map<int, std::unique_ptr<DeviceState>> states;
  return states;
}

DeviceState& State(int device) {
  auto& state = States()[device];
  if (!state) {
    state = std::make_unique<DeviceState>();
    FK_CUDNN(cudnnCreate(&state->handle));
  }
  return *state;
}

void SetTensor(cudnnTensorDescriptor_t* desc, bool nhwc, cudnnDataType_t type, const DLTensor* t) {
  int n = t->shape[0], c = t->shape[nhwc ? 3 : 1], h = t->shape[nhwc ? 1 : 2], w = t->shape[nhwc ? 2 : 3];
  FK_CUDNN(cudnnCreateTensorDescriptor(desc));
  FK_CUDNN(cudnnSetTensor4dDescriptor(*desc, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, type, n, c, h, w));
}

Plan* MakePlan(DeviceState& state, const std::vector<int64_t>& key, const int64_t* a, const DLTensor* x,
               const DLTensor* w, const DLTensor* y) {
  auto plan = std::make_unique<Plan>();
  bool nhwc = a[kLayout] == 1;
  cudnnDataType_t type = DataType(x);
  SetTensor(&plan->x, nhwc, type, x);
  SetTensor(&plan->y, nhwc, type, y);
  int k = w->shape[0], cg = w->shape[nhwc ? 3 : 1], r = w->shape[nhwc ? 1 : 2], s = w->shape[nhwc ? 2 : 3];
  FK_CUDNN(cudnnCreateFilterDescriptor(&plan->w));
  FK_CUDNN(cudnnSetFilter4dDescriptor(plan->w, type, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, k, cg, r, s));
  FK_CUDNN(cudnnCreateConvolutionDescriptor(&plan->conv));
  FK_CUDNN(cudnnSetConvolution2dDescriptor(plan->conv, a[kPadH], a[kPadW], a[kStrideH], a[kStrideW], a[kDilH],
                                           a[kDilW], CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  FK_CUDNN(cudnnSetConvolutionGroupCount(plan->conv, a[kGroups]));
  // fp32 stays exact: FMA kernels only (CUDNN_DEFAULT_MATH lets Ampere+ GPUs use TF32 tensor cores)
  cudnnMathType_t math = a[kMath] ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
  FK_CUDNN(cudnnSetConvolutionMathType(plan->conv, math));

  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int found = 0;
  FK_CUDNN(cudnnFindConvolutionForwardAlgorithm(state.handle, plan->x, plan->w, plan->conv, plan->y,
                                                CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf));
  for (int i = 0; i < found; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    plan->found += (plan->found.empty() ? "" : " ") + std::to_string(int(perf[i].algo)) + ":" +
                   std::to_string(int(perf[i].mathType)) + ":" + std::to_string(perf[i].time);
  }
  // fastest first; an exact (fp32) build never takes a tensor-op result, whatever cudnnFind measured
  int best = -1;
  for (int i = 0; i < found && best < 0; ++i) {
    bool exact_ok = a[kMath] || perf[i].mathType == CUDNN_FMA_MATH || perf[i].mathType == CUDNN_DEFAULT_MATH;
    if (perf[i].status == CUDNN_STATUS_SUCCESS && exact_ok) best = i;
  }
  if (best < 0) TVM_FFI_THROW(RuntimeError) << "cuDNN found no convolution algorithm for this shape";
  plan->algo = perf[best].algo;
  plan->workspace = perf[best].memory;
  plan->math = a[kMath] ? perf[best].mathType : CUDNN_FMA_MATH;
  FK_CUDNN(cudnnSetConvolutionMathType(plan->conv, plan->math));
  Plan* out = plan.get();
  state.plans.emplace(key, std::move(plan));
  return out;
}

void Conv2d(tvm::ffi::PackedArgs args, tvm::ffi::Any* rv) {
  if (args.size() != 4) TVM_FFI_THROW(TypeError) << "forgekit_cudnn_conv2d: expected x, w, attrs, y";
  tvm::ffi::Shape attrs = args[2].cast<tvm::ffi::Shape>();
  if (attrs.size() != kNumAttrs) TVM_FFI_THROW(ValueError) << "forgekit_cudnn_conv2d: " << attrs.size() << " attrs";
  const int64_t* a = attrs.data();
  DLTensor* x = args[0].cast<DLTensor*>();
  DLTensor* w = args[1].cast<DLTensor*>();
  DLTensor* y = args[3].cast<DLTensor*>();

  std::vector<int64_t> key(a, a + kNumAttrs);
  for (const DLTensor* t : {x, w, y}) {
    key.push_back(t->dtype.code * 256 + t->dtype.bits);
    key.insert(key.end(), t->shape, t->shape + t->ndim);
  }
  int device = x->device.device_id;
  std::lock_guard<std::mutex> lock(mutex);
  DeviceState& state = State(device);
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));
  FK_CUDNN(cudnnSetStream(state.handle, stream));
  auto found = state.plans.find(key);
  Plan* plan = found != state.plans.end() ? found->second.get() : MakePlan(state, key, a, x, w, y);
  if (plan->workspace > state.workspace_size) {
    if (state.workspace) FK_CUDA(cudaFree(state.workspace));
    FK_CUDA(cudaMalloc(&state.workspace, plan->workspace));
    state.workspace_size = plan->workspace;
  }
  const float one = 1.0f, zero = 0.0f;  // float scaling for fp32 and fp16 data alike (cuDNN: double only for double)
  FK_CUDNN(cudnnConvolutionForward(state.handle, &one, plan->x, Data(x), plan->w, Data(w), plan->conv, plan->algo,
                                   state.workspace, plan->workspace, &zero, plan->y, Data(y)));
}

// One line per planned shape, for benchmark reports: the shape (attrs, then x, w, y as dtype code*256+bits and
// dims), the algorithm and math type chosen, its workspace, and all cudnnFind measured ("algo:math:ms")
tvm::ffi::String Plans() {
  std::lock_guard<std::mutex> lock(mutex);
  std::string out;
  for (auto& [device, state] : States()) {
    for (auto& [key, plan] : state->plans) {
      out += "shape";
      for (int64_t v : key) out += " " + std::to_string(v);
      out += " | algo " + std::to_string(int(plan->algo)) + " math " + std::to_string(int(plan->math)) + " ws " +
             std::to_string(plan->workspace) + " | found " + plan->found + "\n";
    }
  }
  return tvm::ffi::String(out);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(forgekit_cudnn_plans, Plans);

extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_forgekit_cudnn_conv2d(void* self, const TVMFFIAny* args, int32_t num_args,
                                                               TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  Conv2d(tvm::ffi::PackedArgs(reinterpret_cast<const tvm::ffi::AnyView*>(args), num_args),
         reinterpret_cast<tvm::ffi::Any*>(result));
  TVM_FFI_SAFE_CALL_END();
}
