/*
 * A C99 program over the C API (it also proves forgekit_runtime.h is plain C): prints what the model
 * describes, runs it once on zeros (dynamic dims at their smallest served size) and exercises the error
 * paths.  tests/unit/test_capi.py parses its lines:
 *   model <num inputs> <num outputs>
 *   input|output <i> <name> <dtype> <layout> shape=<d,..> names=<sym|-,..> min=<..> max=<..> step=<..>
 *   status <what> <code> <message>   (bad-index, no-run, not-set, dtype, run, reopen)
 *   result <i> <dtype> shape=<d,..> nbytes=<n> sum=<sum of the float32 values>
 * With FK_CHECK_RELOAD set it then prints "ready", keeps a handle open, waits for a line on stdin (the test
 * replaces the artifact meanwhile), opens the same path again and prints "reload <code> sum=<first output's sum>".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forgekit_runtime.h"

static void print_dims(const char* label, const int64_t* dims, int32_t n) {
  int32_t i;
  printf(" %s=", label);
  for (i = 0; i < n; ++i) printf("%s%lld", i ? "," : "", (long long)dims[i]);
}

static void describe(const char* kind, const fk_tensor_info* t, int index) {
  int32_t i;
  printf("%s %d %s %s %s", kind, index, t->name, t->dtype, t->layout[0] ? t->layout : "-");
  print_dims("shape", t->shape, t->ndim);
  printf(" names=");
  for (i = 0; i < t->ndim; ++i) printf("%s%s", i ? "," : "", t->dim_names[i] ? t->dim_names[i] : "-");
  print_dims("min", t->dim_min, t->ndim);
  print_dims("max", t->dim_max, t->ndim);
  print_dims("step", t->dim_step, t->ndim);
  printf("\n");
}

static size_t item_size(const char* dtype) {
  if (strstr(dtype, "64")) return 8;
  if (strstr(dtype, "32")) return 4;
  if (strstr(dtype, "16")) return 2;
  return 1;
}

/* Set every input to zeros (dynamic dims at their smallest served size) and run. */
static double first_sum(fk_model* model) {
  fk_tensor out;
  double sum = 0;
  size_t k;
  if (fk_get_output(model, 0, &out) == FK_OK && strcmp(out.dtype, "float32") == 0) {
    for (k = 0; k < out.nbytes / 4; ++k) sum += ((const float*)out.data)[k];
  }
  return sum;
}

static int run_zeros(fk_model* model) {
  fk_tensor_info info;
  int i, status;
  for (i = 0; i < fk_num_inputs(model); ++i) {
    int64_t shape[16];
    size_t count = 1;
    int32_t d;
    void* zeros;
    fk_input_info(model, i, &info);
    for (d = 0; d < info.ndim && d < 16; ++d) {
      shape[d] = info.shape[d] >= 0 ? info.shape[d] : info.dim_min[d];
      count *= (size_t)shape[d];
    }
    zeros = calloc(count ? count : 1, item_size(info.dtype));
    status = fk_set_input(model, i, zeros, info.dtype, shape, info.ndim);
    free(zeros);
    if (status != FK_OK) return status;
  }
  return fk_run(model);
}

int main(int argc, char** argv) {
  char errbuf[512];
  fk_model* model = NULL;
  fk_tensor_info info;
  fk_tensor out;
  int i, n_in, n_out, status;
  if (argc < 2) {
    fprintf(stderr, "usage: capi_check ARTIFACT [KEY PASSWORD]\n");
    return 2;
  }
  status = fk_open(argv[1], argc > 2 ? argv[2] : NULL, argc > 3 ? argv[3] : NULL, &model, errbuf, sizeof errbuf);
  if (status != FK_OK) {
    printf("status open %d %s\n", status, errbuf);
    return status;
  }
  n_in = fk_num_inputs(model);
  n_out = fk_num_outputs(model);
  printf("model %d %d\n", n_in, n_out);
  for (i = 0; i < n_in; ++i) {
    fk_input_info(model, i, &info);
    describe("input", &info, i);
  }
  for (i = 0; i < n_out; ++i) {
    fk_output_info(model, i, &info);
    describe("output", &info, i);
  }
  /* each status is taken before fk_last_error() is read: C leaves the order of arguments unspecified */
  status = fk_input_info(model, n_in, &info);
  printf("status bad-index %d %s\n", status, fk_last_error());
  status = fk_get_output(model, 0, &out);
  printf("status no-run %d %s\n", status, fk_last_error());
  status = fk_run(model);
  printf("status not-set %d %s\n", status, fk_last_error());
  if (n_in > 0) {
    fk_input_info(model, 0, &info);
    status = fk_set_input(model, 0, NULL, "complex128", info.shape, info.ndim);
    printf("status dtype %d %s\n", status, fk_last_error());
  }
  status = run_zeros(model);
  printf("status run %d %s\n", status, fk_last_error());
  for (i = 0; status == FK_OK && fk_get_output(model, i, &out) == FK_OK; ++i) {
    double sum = 0;
    size_t k;
    if (strcmp(out.dtype, "float32") == 0) {
      for (k = 0; k < out.nbytes / 4; ++k) sum += ((const float*)out.data)[k];
    }
    printf("result %d %s", i, out.dtype);
    print_dims("shape", out.shape, out.ndim);
    printf(" nbytes=%zu sum=%g\n", out.nbytes, sum);
  }
  fk_close(model);
  /* two handles at once, opened after the first was closed: the library is loaded again (for an encrypted
     artifact through another memfd path) and both run */
  if (status == FK_OK) {
    fk_model* pair[2] = {NULL, NULL};
    for (i = 0; i < 2 && status == FK_OK; ++i) {
      status = fk_open(argv[1], argc > 2 ? argv[2] : NULL, argc > 3 ? argv[3] : NULL, &pair[i], errbuf, sizeof errbuf);
    }
    for (i = 0; i < 2 && status == FK_OK; ++i) status = run_zeros(pair[i]);
    printf("status reopen %d %s\n", status, fk_last_error());
    fk_close(pair[1]);
    if (status == FK_OK && getenv("FK_CHECK_RELOAD")) {  /* pair[0] stays open: its library stays loaded */
      char line[16];
      printf("ready\n");
      fflush(stdout);
      if (fgets(line, sizeof line, stdin)) {
        status = fk_open(argv[1], NULL, NULL, &model, errbuf, sizeof errbuf);
        if (status == FK_OK) status = run_zeros(model);
        printf("reload %d sum=%g\n", status, status == FK_OK ? first_sum(model) : 0.0);
        fflush(stdout);
        if (status == FK_OK) fk_close(model);
      }
    }
    fk_close(pair[0]);
  }
  return status;
}
