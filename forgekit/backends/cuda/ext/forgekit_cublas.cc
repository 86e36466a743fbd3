// forgekit's cuBLAS matmul for CUDA artifacts: compiled into the artifact's library when the build routes matmuls
// to cuBLAS (forgekit/backends/cuda/cublas.py, --gpu-kernels vendor), found by the Relax VM as the library's own
// symbol `__tvm_ffi_forgekit_cublas_matmul` (two artifacts in one process never clash over a global name).
//
//   forgekit_cublas_matmul(a, b, attrs: Shape, y)
//   attrs = [math (0: fp32 FMA only, 1: tensor cores allowed)]
//   a: [..., M, K], row-major; b: [K, N] (one GEMM over all of a's leading dims) or [..., K, N] with a's batch
//   dims (a strided batched GEMM); y: a's leading dims + [M, N], accumulated in fp32, rounded once to y's dtype
//   (a's and b's).  The epilogue is TVM's, fused into one kernel.
//
// Row-major Y = A B is column-major Y^T = B^T A^T: cuBLAS is called with B as its first operand (N x K, ld N) and
// A as its second (K x M, ld K), no transposes.  fp32 uses CUBLAS_COMPUTE_32F with the default math mode (FMA, no
// TF32: what PyTorch does with allow_tf32 off); fp16 uses CUBLAS_COMPUTE_32F with fp16 data (tensor cores, fp32
// accumulation).  Each device's handle gets a workspace of its own at its first call, so a CUDA graph captured
// after that call (forgekit.runtime.cuda_graph) allocates nothing inside the capture.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include "forgekit_ext.h"

#include <map>
#include <mutex>

namespace {

#define FK_CUBLAS(expr)                                                                                \
  do {                                                                                                 \
    cublasStatus_t status_ = (expr);                                                                   \
    if (status_ != CUBLAS_STATUS_SUCCESS)                                                              \
      TVM_FFI_THROW(RuntimeError) << "cuBLAS " << #expr << ": " << cublasGetStatusString(status_);      \
  } while (0)

// cuBLAS's recommended workspace for Hopper (cuBLAS docs, cublasSetWorkspace: 32 MiB on sm_90)
constexpr size_t kWorkspace = size_t(32) << 20;

struct Handle {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
};

std::mutex mutex;  // one handle per device; calls on a device are serialized, as on a stream

Handle& HandleOf(int device) {
  static std::map<int, Handle> handles;
  Handle& h = handles[device];
  if (!h.handle) {
    FK_CUDA(cudaSetDevice(device));
    FK_CUBLAS(cublasCreate(&h.handle));
    FK_CUDA(cudaMalloc(&h.workspace, kWorkspace));
    FK_CUBLAS(cublasSetWorkspace(h.handle, h.workspace, kWorkspace));
  }
  return h;
}

cudaDataType_t DataType(const DLTensor* t) {
  if (t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->dtype.lanes == 1) return CUDA_R_32F;
  if (t->dtype.code == kDLFloat && t->dtype.bits == 16 && t->dtype.lanes == 1) return CUDA_R_16F;
  TVM_FFI_THROW(TypeError) << "forgekit_cublas_matmul: unsupported dtype code " << int(t->dtype.code) << " bits "
                           << int(t->dtype.bits);
  return CUDA_R_32F;  // not reached
}

using forgekit::Data;

int64_t Product(const DLTensor* t, int from, int to) {
  int64_t n = 1;
  for (int i = from; i < to; ++i) n *= t->shape[i];
  return n;
}

void Matmul(tvm::ffi::PackedArgs args, tvm::ffi::Any* rv) {
  if (args.size() != 4) TVM_FFI_THROW(TypeError) << "forgekit_cublas_matmul: expected a, b, attrs, y";
  tvm::ffi::Shape attrs = args[2].cast<tvm::ffi::Shape>();
  if (attrs.size() != 1) TVM_FFI_THROW(ValueError) << "forgekit_cublas_matmul: " << attrs.size() << " attrs";
  DLTensor* a = args[0].cast<DLTensor*>();
  DLTensor* b = args[1].cast<DLTensor*>();
  DLTensor* y = args[3].cast<DLTensor*>();
  if (a->ndim < 2 || b->ndim < 2 || y->ndim != a->ndim)
    TVM_FFI_THROW(ValueError) << "forgekit_cublas_matmul: ranks " << a->ndim << ", " << b->ndim << " -> " << y->ndim;
  const int64_t m = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1], n = b->shape[b->ndim - 1];
  const int64_t batch = b->ndim == 2 ? 1 : Product(a, 0, a->ndim - 2);
  const int64_t rows = b->ndim == 2 ? Product(a, 0, a->ndim - 1) : m;  // a weight: one GEMM over all rows
  if (b->shape[b->ndim - 2] != k || y->shape[y->ndim - 1] != n || y->shape[y->ndim - 2] != m ||
      (b->ndim != 2 && (b->ndim != a->ndim || Product(b, 0, b->ndim - 2) != batch)))
    TVM_FFI_THROW(ValueError) << "forgekit_cublas_matmul: shapes do not multiply";
  cudaDataType_t type = DataType(a);
  if (DataType(b) != type || DataType(y) != type)
    TVM_FFI_THROW(TypeError) << "forgekit_cublas_matmul: a, b and y must share one dtype";
  if (rows == 0 || n == 0) return;
  if (rows > INT32_MAX || n > INT32_MAX || k > INT32_MAX || batch > INT32_MAX)
    TVM_FFI_THROW(ValueError) << "forgekit_cublas_matmul: a dimension over 2^31";

  int device = a->device.device_id;
  std::lock_guard<std::mutex> lock(mutex);
  Handle& h = HandleOf(device);
  FK_CUBLAS(cublasSetStream(h.handle, static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device))));
  // default math: FMA in fp32 (TF32 only with CUBLAS_TF32_TENSOR_OP_MATH or COMPUTE_32F_FAST_TF32), tensor
  // cores for fp16 data
  FK_CUBLAS(cublasSetMathMode(h.handle, CUBLAS_DEFAULT_MATH));
  const float one = 1.0f, zero = 0.0f;
  if (k == 0) {  // an empty sum: zeros, which a GEMM with k = 0 leaves to beta (0)
    FK_CUDA(cudaMemsetAsync(Data(y), 0, size_t(rows) * n * batch * (y->dtype.bits / 8),
                            static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device))));
    return;
  }
  FK_CUBLAS(cublasGemmStridedBatchedEx(h.handle, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(rows), int(k), &one,
                                       Data(b), type, int(n), b->ndim == 2 ? 0 : k * n,
                                       Data(a), type, int(k), rows * k, &zero,
                                       Data(y), type, int(n), rows * n, int(batch), CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
}

}  // namespace

extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_forgekit_cublas_matmul(void* self, const TVMFFIAny* args, int32_t num_args,
                                                                TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  Matmul(tvm::ffi::PackedArgs(reinterpret_cast<const tvm::ffi::AnyView*>(args), num_args),
         reinterpret_cast<tvm::ffi::Any*>(result));
  TVM_FFI_SAFE_CALL_END();
}
