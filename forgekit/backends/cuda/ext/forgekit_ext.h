// What forgekit's CUDA library extensions (forgekit_cudnn.cc, forgekit_cublas.cc) share: a CUDA runtime call
// checked into a TVM FFI error (one line, raised to the VM's caller), and a DLTensor's first element.
#ifndef FORGEKIT_EXT_H_
#define FORGEKIT_EXT_H_

#include <cuda_runtime_api.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#define FK_CUDA(expr)                                                                               \
  do {                                                                                              \
    cudaError_t error_ = (expr);                                                                    \
    if (error_ != cudaSuccess) TVM_FFI_THROW(RuntimeError) << "CUDA " << #expr << ": " << cudaGetErrorString(error_); \
  } while (0)

namespace forgekit {

inline void* Data(const DLTensor* t) { return static_cast<char*>(t->data) + t->byte_offset; }

}  // namespace forgekit

#endif  // FORGEKIT_EXT_H_
