/*
 * A C99 program over the C API's device entry points, for runtime/tests/gpu_check.sh on a GPU machine (no CUDA
 * headers or toolkit needed: libcudart.so.13 is opened with dlopen, as the runtime does).
 *
 *   capi_cuda_check ARTIFACT DEVICE OUTPREFIX IN0.bin [IN1.bin ...]
 *
 * DEVICE is "cpu", "cuda", "cuda:N" or "default".  Each INi.bin holds input i's raw bytes (numpy's tofile) at the
 * shape metadata.json gives (dynamic dims at their smallest).  It runs the model twice and writes every output's
 * raw bytes:
 *   1. host memory in and out (fk_set_input, fk_get_output: the runtime copies to and from the GPU)
 *      -> OUTPREFIX.host.<i>.bin
 *   2. on a CUDA model, GPU memory in and out without the runtime's copies (cudaMalloc + fk_set_input_device,
 *      fk_get_output_device + cudaMemcpy) -> OUTPREFIX.device.<i>.bin
 * and prints "device <kind> <id>", "output <i> <nbytes>" and "ms_per_run <median of 20 fk_run>".
 * Exit status: an fk_status (one line on stderr), or 3 when libcudart.so.13 cannot be opened for step 2.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c99 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "forgekit_runtime.h"

typedef int (*malloc_fn)(void**, size_t);
typedef int (*memcpy_fn)(void*, const void*, size_t, int);
typedef int (*free_fn)(void*);

static int fail(int status, const char* what) {
  fprintf(stderr, "capi_cuda_check: %s: %s\n", what, fk_last_error());
  return status;
}

static size_t item_size(const char* dtype) {
  if (strstr(dtype, "64")) return 8;
  if (strstr(dtype, "32")) return 4;
  if (strstr(dtype, "16")) return 2;
  return 1;
}

static void* read_file(const char* path, size_t want) {
  FILE* f = fopen(path, "rb");
  void* data = malloc(want ? want : 1);
  size_t got = f ? fread(data, 1, want, f) : 0;
  if (f) fclose(f);
  if (got != want) {
    fprintf(stderr, "capi_cuda_check: '%s' does not hold %zu bytes\n", path, want);
    free(data);
    return NULL;
  }
  return data;
}

static int write_outputs(fk_model* model, const char* prefix, const char* kind, const void* const* data) {
  int i;
  fk_tensor out;
  for (i = 0; i < fk_num_outputs(model); ++i) {
    char path[4096];
    FILE* f;
    if (fk_get_output(model, i, &out) != FK_OK) return fail(FK_ERR_RUNTIME, "fk_get_output");
    snprintf(path, sizeof path, "%s.%s.%d.bin", prefix, kind, i);
    f = fopen(path, "wb");
    if (!f || fwrite(data ? data[i] : out.data, 1, out.nbytes, f) != out.nbytes) {
      fprintf(stderr, "capi_cuda_check: cannot write '%s'\n", path);
      return 15;
    }
    fclose(f);
    printf("output %d %zu\n", i, out.nbytes);
  }
  return FK_OK;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int compare_doubles(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  fk_open_options options;
  fk_model* model = NULL;
  char errbuf[512];
  int i, n_in, status, n_out;
  int32_t kind, id;
  void* inputs[16];
  int64_t shapes[16][16];
  fk_tensor_info infos[16];
  size_t sizes[16];
  double times[20];
  if (argc < 4) {
    fprintf(stderr, "usage: capi_cuda_check ARTIFACT DEVICE OUTPREFIX IN0.bin [IN1.bin ...]\n");
    return FK_ERR_USAGE;
  }
  fk_open_options_init(&options);
  if (fk_parse_device(argv[2], &options.device_kind, &options.device_id) != FK_OK) return fail(FK_ERR_USAGE, "device");
  status = fk_open_ex(argv[1], &options, &model, errbuf, sizeof errbuf);
  if (status != FK_OK) {
    fprintf(stderr, "capi_cuda_check: %s\n", errbuf);
    return status;
  }
  fk_model_device(model, &kind, &id);
  printf("device %d %d\n", kind, id);
  n_in = fk_num_inputs(model);
  if (n_in != argc - 4 || n_in > 16) {
    fprintf(stderr, "capi_cuda_check: the model takes %d input(s), got %d files\n", n_in, argc - 4);
    return FK_ERR_INPUT;
  }
  for (i = 0; i < n_in; ++i) {
    int32_t d;
    fk_input_info(model, i, &infos[i]);
    sizes[i] = item_size(infos[i].dtype);
    for (d = 0; d < infos[i].ndim && d < 16; ++d) {
      shapes[i][d] = infos[i].shape[d] >= 0 ? infos[i].shape[d] : infos[i].dim_min[d];
      sizes[i] *= (size_t)shapes[i][d];
    }
    inputs[i] = read_file(argv[4 + i], sizes[i]);
    if (!inputs[i]) return FK_ERR_INPUT;
    if (fk_set_input(model, i, inputs[i], infos[i].dtype, shapes[i], infos[i].ndim) != FK_OK) {
      return fail(FK_ERR_INPUT, "fk_set_input");
    }
  }
  if ((status = fk_run(model)) != FK_OK) return fail(status, "fk_run");
  if ((status = write_outputs(model, argv[3], "host", NULL)) != FK_OK) return status;
  if (kind == FK_DEVICE_CUDA) {
    void* cudart = dlopen("libcudart.so.13", RTLD_NOW);
    malloc_fn cuda_malloc;
    memcpy_fn cuda_memcpy;
    free_fn cuda_free;
    void* on_gpu[16];
    void* back[16];
    fk_tensor out;
    if (!cudart) {
      fprintf(stderr, "capi_cuda_check: %s\n", dlerror());
      return 3;
    }
    /* POSIX's way to take a function from dlsym (ISO C has no object-to-function pointer cast) */
    *(void**)(&cuda_malloc) = dlsym(cudart, "cudaMalloc");
    *(void**)(&cuda_memcpy) = dlsym(cudart, "cudaMemcpy");
    *(void**)(&cuda_free) = dlsym(cudart, "cudaFree");
    for (i = 0; i < n_in; ++i) {
      /* 1 = cudaMemcpyHostToDevice */
      if (cuda_malloc(&on_gpu[i], sizes[i] ? sizes[i] : 1) != 0 ||
          cuda_memcpy(on_gpu[i], inputs[i], sizes[i], 1) != 0) {
        fprintf(stderr, "capi_cuda_check: cudaMalloc/cudaMemcpy failed\n");
        return FK_ERR_RUNTIME;
      }
      if (fk_set_input_device(model, i, on_gpu[i], infos[i].dtype, shapes[i], infos[i].ndim) != FK_OK) {
        return fail(FK_ERR_INPUT, "fk_set_input_device");
      }
    }
    if ((status = fk_run(model)) != FK_OK) return fail(status, "fk_run (device inputs)");
    n_out = fk_num_outputs(model);
    for (i = 0; i < n_out && i < 16; ++i) {
      if (fk_get_output_device(model, i, &out) != FK_OK) return fail(FK_ERR_RUNTIME, "fk_get_output_device");
      back[i] = malloc(out.nbytes ? out.nbytes : 1);
      /* 2 = cudaMemcpyDeviceToHost */
      if (cuda_memcpy(back[i], out.data, out.nbytes, 2) != 0) {
        fprintf(stderr, "capi_cuda_check: cudaMemcpy of output %d failed (not a device pointer?)\n", i);
        return FK_ERR_RUNTIME;
      }
    }
    if ((status = write_outputs(model, argv[3], "device", (const void* const*)back)) != FK_OK) return status;
    for (i = 0; i < 20; ++i) {  /* inputs already on the GPU: the model's time plus the stream sync */
      double start = now_ms();
      if ((status = fk_run(model)) != FK_OK) return fail(status, "fk_run (timed)");
      times[i] = now_ms() - start;
    }
    qsort(times, 20, sizeof times[0], compare_doubles);
    printf("ms_per_run %.4f\n", (times[9] + times[10]) / 2);
    fk_close(model);  /* before the buffers the model read */
    for (i = 0; i < n_in; ++i) cuda_free(on_gpu[i]);
    return FK_OK;
  }
  fk_close(model);
  return FK_OK;
}
