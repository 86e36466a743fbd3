/*
 * forgekit runtime C API: open a compiled forgekit artifact, describe, feed and run it.
 *
 * The library (libforgekit_runtime.so) drives TVM's Relax VM through the C ABI of the TVM runtime
 * (libtvm_runtime.so + libtvm_ffi.so); it needs neither Python nor the TVM compiler.  It does what
 * forgekit.runtime.Engine does: reads metadata.json next to the library, refuses an artifact built for
 * another architecture or for CPU features this CPU lacks (before any of its code runs), picks the best
 * level of a portable artifact, decrypts an encrypted library into an anonymous memory file (the
 * plaintext never touches a disk) and checks inputs against the metadata.
 *
 * A CUDA artifact (compiled with -t cuda/sm_XY) runs on an NVIDIA GPU: fk_open_ex picks the device (by default
 * the one metadata.json names), loads TVM's CUDA runtime (libtvm_runtime_cuda.so, which needs libcudart.so.13
 * and the driver's libcuda.so.1) and copies host inputs to the GPU and outputs back; fk_set_input_device and
 * fk_get_output_device pass GPU memory without copies.
 *
 * Status codes are forgekit's CLI exit codes (docs: "Errors"), so a program can exit with them.
 * Every failing call leaves a one-line message in fk_last_error() (per thread).
 * A model handle is not thread-safe: use one handle per thread, or lock around fk_set_input/fk_run.
 */
#ifndef FORGEKIT_RUNTIME_H_
#define FORGEKIT_RUNTIME_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FK_API __declspec(dllexport)
#else
#define FK_API __attribute__((visibility("default")))
#endif

typedef enum {
  FK_OK = 0,
  FK_ERR_RUNTIME = 1,      /* the model failed while running (a message from TVM) */
  FK_ERR_USAGE = 2,        /* a bad argument: NULL handle, index out of range, unknown dtype */
  FK_ERR_ARTIFACT = 7,     /* missing, incomplete or unloadable artifact */
  FK_ERR_INPUT = 9,        /* input count, dtype or shape does not match the model */
  FK_ERR_ENCRYPTION = 11,  /* no key/password, wrong password, foreign key file, tampered library */
  FK_ERR_NOT_AVAILABLE = 12, /* built without OpenSSL (encrypted artifacts), no memfd_create, or no NVIDIA GPU /
                                CUDA driver / libcudart.so.13 / libtvm_runtime_cuda.so for a CUDA artifact */
  FK_ERR_INCOMPATIBLE = 16 /* built for another architecture/OS, for CPU features this CPU lacks, for a newer GPU
                              than this one, or for another device than the one asked for */
} fk_status;

/* Where a model runs: DLPack's device type codes (kDLCPU = 1, kDLCUDA = 2), so they pass to DLDevice as is. */
typedef enum {
  FK_DEVICE_DEFAULT = 0, /* what metadata.json says the artifact was compiled for: build.device.kind "cuda" ->
                            CUDA device 0, else the CPU */
  FK_DEVICE_CPU = 1,
  FK_DEVICE_CUDA = 2
} fk_device_kind;

/* An opened model (opaque). */
typedef struct fk_model fk_model;

/* What the metadata says about one input or output.  Pointers stay valid until fk_close. */
typedef struct {
  const char* name;
  const char* dtype;  /* numpy's name: "float32", "int64", "uint8", "bool", ... */
  const char* layout; /* the model's layout from the metadata ("NCHW", "NHWC") for tensors of its rank, else "" */
  int32_t ndim;
  const int64_t* shape;          /* ndim dims; a dynamic dim is -1 */
  const char* const* dim_names;  /* the symbol of each dynamic dim ("N", "W"), NULL for static dims */
  const int64_t* dim_min;        /* static dims: the dim; dynamic: the smallest served (1 if unbounded) */
  const int64_t* dim_max;        /* static dims: the dim; dynamic: the largest served, -1 if unbounded */
  const int64_t* dim_step;       /* 1, or the multiple a stepped dynamic dim must be (--dynamic H=32..2048:32) */
} fk_tensor_info;

/* An output of the last fk_run.  data stays valid until the next fk_run or fk_close. */
typedef struct {
  const void* data;
  const char* dtype;
  int32_t ndim;
  const int64_t* shape;
  size_t nbytes;
} fk_tensor;

/*
 * Open an artifact: its directory (model_library.so + metadata.json) or its library file.
 * key_file / password: for encrypted artifacts; NULL means modelKey.bin next to the library and the
 * environment variable FORGEKIT_ENCRYPT_PASSWORD (as forgekit.runtime.Engine).  The password is used as
 * given (UTF-8 bytes; forgekit NFC-normalises passwords it is given as text).
 * On failure *model is NULL, the message goes to errbuf (may be NULL) and fk_last_error().
 */
FK_API int fk_open(const char* path, const char* key_file, const char* password, fk_model** model, char* errbuf,
                   size_t errbuf_size);
FK_API void fk_close(fk_model* model);

/* fk_open_ex's options.  Always start from fk_open_options_init (it sets `size`, so a library newer than the
 * caller's header reads only the fields the caller knows about). */
typedef struct {
  size_t size;                /* sizeof(fk_open_options), set by fk_open_options_init */
  const char* key_file;       /* as fk_open's key_file / password (NULL: the defaults) */
  const char* password;
  int32_t device_kind;        /* an fk_device_kind; FK_DEVICE_DEFAULT: the artifact's device */
  int32_t device_id;          /* which GPU (0 = the first); 0 for the CPU */
  /* libtvm_runtime_cuda.so to load for a CUDA model.  NULL: $FORGEKIT_TVM_RUNTIME_CUDA, else the file next to
   * libtvm_runtime.so, else next to libforgekit_runtime.so, else the dynamic loader's search path. */
  const char* cuda_runtime;
} fk_open_options;

FK_API void fk_open_options_init(fk_open_options* options);
/* fk_open with a device (and room for more options): options NULL means fk_open's defaults.  A CUDA artifact
 * asked to run on the CPU, or a CPU artifact on a GPU, is FK_ERR_INCOMPATIBLE; no GPU, driver or CUDA runtime
 * library is FK_ERR_NOT_AVAILABLE with one line naming what is missing. */
FK_API int fk_open_ex(const char* path, const fk_open_options* options, fk_model** model, char* errbuf,
                      size_t errbuf_size);
/* "cpu", "cuda", "cuda:N" (or "" / "default") -> kind and id; FK_ERR_USAGE for anything else. */
FK_API int fk_parse_device(const char* text, int32_t* kind, int32_t* id);
/* The device the model runs on (an fk_device_kind other than FK_DEVICE_DEFAULT, and its id). */
FK_API int fk_model_device(const fk_model* model, int32_t* kind, int32_t* id);

FK_API int fk_num_inputs(const fk_model* model);
FK_API int fk_num_outputs(const fk_model* model);
/* Index of the input named name, -1 when there is none. */
FK_API int fk_input_index(const fk_model* model, const char* name);
FK_API int fk_input_info(const fk_model* model, int index, fk_tensor_info* info);
/* The output as the metadata describes it (before any run); fk_get_output gives the computed shape. */
FK_API int fk_output_info(const fk_model* model, int index, fk_tensor_info* info);

/*
 * Copy a C-contiguous array into input `index`.  dtype is numpy's name; the dtype, rank, static dims,
 * dynamic ranges and steps are checked here, dims sharing a symbol across inputs at fk_run.
 */
FK_API int fk_set_input(fk_model* model, int index, const void* data, const char* dtype, const int64_t* shape,
                        int32_t ndim);
/*
 * Like fk_set_input, without a copy: data is memory on the model's device (a CUDA device pointer for a CUDA
 * model, host memory for a CPU one), C-contiguous and 64-byte aligned.  The model reads it in place: it must
 * stay valid and unchanged until the fk_run that uses it has returned (or the input is set again).
 */
FK_API int fk_set_input_device(fk_model* model, int index, void* data, const char* dtype, const int64_t* shape,
                               int32_t ndim);
/* Runs the model; on a GPU it returns once the results are computed (the stream is synchronized). */
FK_API int fk_run(fk_model* model);
/* The output in host memory (a CUDA model's is copied from the GPU on the first call after each fk_run). */
FK_API int fk_get_output(fk_model* model, int index, fk_tensor* out);
/* The output where the model computed it, without a copy: a CUDA device pointer for a CUDA model (host memory for
 * a CPU model, as fk_get_output).  data stays valid until the next fk_run or fk_close. */
FK_API int fk_get_output_device(fk_model* model, int index, fk_tensor* out);

/* The message of the last call on this thread ("" when it succeeded); valid until the next call. */
FK_API const char* fk_last_error(void);
/* The CPU level a portable artifact runs at ("avx512", ...), "" for single-level artifacts. */
FK_API const char* fk_level(const fk_model* model);

#ifdef __cplusplus
}
#endif

#endif /* FORGEKIT_RUNTIME_H_ */
