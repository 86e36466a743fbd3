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
  FK_ERR_NOT_AVAILABLE = 12, /* built without OpenSSL (encrypted artifacts) or no memfd_create */
  FK_ERR_INCOMPATIBLE = 16 /* built for another architecture/OS or for CPU features this CPU lacks */
} fk_status;

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
FK_API int fk_run(fk_model* model);
FK_API int fk_get_output(fk_model* model, int index, fk_tensor* out);

/* The message of the last call on this thread ("" when it succeeded); valid until the next call. */
FK_API const char* fk_last_error(void);
/* The CPU level a portable artifact runs at ("avx512", ...), "" for single-level artifacts. */
FK_API const char* fk_level(const fk_model* model);

#ifdef __cplusplus
}
#endif

#endif /* FORGEKIT_RUNTIME_H_ */
