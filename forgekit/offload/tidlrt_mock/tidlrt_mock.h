/* A stand-in for TI's TIDL-RT library (libvx_tidl_rt.so), for testing forgekit's Arm-side glue off the board.
 *
 * The entry points are named as in TI's itidl_rt.h (edgeai-tidl-tools / PSDK-RTOS 08.x: TIDLRT_create,
 * TIDLRT_invoke, TIDLRT_delete, TIDLRT_setParamsDefault, TIDLRT_setTensorDefault) and the two structs
 * below keep the field order and C types of TI's sTIDLRT_Params_t / sTIDLRT_Tensor_t of that version, so
 * the same ctypes declarations (forgekit/offload/tidl_rt.py) drive the mock and the real library.  The
 * text here is ours, not TI's header.
 *
 * What a C7x/MMA would compute cannot run here, so the mock's "network" is a function the host process
 * registers (tidlrt_mock_set_compute): TIDLRT_invoke hands it the net blob given to TIDLRT_create and the
 * input/output tensor structs exactly as the caller filled them.
 */
#ifndef FORGEKIT_TIDLRT_MOCK_H
#define FORGEKIT_TIDLRT_MOCK_H

#include <stdarg.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIDLRT_STRING_SIZE 512 /* bytes of a tensor name */
#define TIDLRT_DIM_MAX 4       /* N, C, H, W */
#define TIDLRT_PAD_DIM_MAX 4   /* left, right, top, bottom */

/* element types (TI's numbering) */
enum { TIDLRT_Uint8 = 0, TIDLRT_Int8, TIDLRT_Uint16, TIDLRT_Int16, TIDLRT_Uint32, TIDLRT_Int32, TIDLRT_Float32,
       TIDLRT_Uint64, TIDLRT_Int64 };
enum { TIDLRT_LT_NCHW = 0, TIDLRT_LT_NHWC = 1 };
enum { TIDLRT_MEM_USER_SPACE = 0, TIDLRT_MEM_SHARED = 1 };

typedef struct {
    int8_t name[TIDLRT_STRING_SIZE];   /* the model's tensor name: how TIDL matches buffers to its I/O */
    int32_t elementType;
    int32_t numDim;
    int32_t dimValues[TIDLRT_DIM_MAX]; /* always N, C, H, W: lower ranks are padded with leading 1s */
    int32_t pitch[TIDLRT_DIM_MAX - 1]; /* elements between ROIs, channels, lines */
    int32_t padValues[TIDLRT_PAD_DIM_MAX];
    void *ptr;
    int32_t dataOffset;                /* elements from ptr to the first (unpadded) element */
    uint32_t layout;
    int32_t zeroPoint;
    float scale;
    uint32_t memType;
} sTIDLRT_Tensor_t;

typedef struct {
    uint64_t copy_in_start, copy_in_end, process_start, process_end, copy_out_start, copy_out_end;
} sTIDLRT_PerfStats_t;

typedef struct {
    void *netPtr;        /* the *_tidl_net.bin contents */
    void *ioBufDescPtr;  /* the *_tidl_io_1.bin contents */
    int32_t net_capacity;
    int32_t io_capacity;
    int32_t flowCtrl;
    int32_t traceLogLevel;
    int32_t traceWriteLevel;
    void *traceBaseName;
    float quantRangeExpansionFactor;
    float quantRangeUpdateFactor;
    float maxPreEmptDelay;
    int32_t (*TIDLVprintf)(const char *format, va_list args);
    int32_t (*TIDLWriteBinToFile)(const char *file, void *addr, int32_t size, void *trace);
    int32_t (*TIDLReadBinFromFile)(const char *file, void *addr, int32_t size);
    sTIDLRT_PerfStats_t *stats;
    int32_t targetPriority;
} sTIDLRT_Params_t;

int32_t TIDLRT_setParamsDefault(sTIDLRT_Params_t *params);
int32_t TIDLRT_setTensorDefault(sTIDLRT_Tensor_t *tensor);
int32_t TIDLRT_create(sTIDLRT_Params_t *params, void **handle);
int32_t TIDLRT_invoke(void *handle, sTIDLRT_Tensor_t *in[], sTIDLRT_Tensor_t *out[]);
int32_t TIDLRT_delete(void *handle);

/* ---- the mock's own additions (not in TI's library) ---- */

/* The mock's I/O descriptor: TI's *_tidl_io_1.bin is a large SDK-specific struct; the mock's is this magic
 * followed by the input and output counts (int32 each), which is all it needs to read in[] and out[]. */
#define TIDLRT_MOCK_IO_MAGIC "FKTIDLIO"

typedef int32_t (*tidlrt_mock_compute_fn)(const void *net, int32_t net_size, int32_t num_in,
                                           sTIDLRT_Tensor_t **in, int32_t num_out, sTIDLRT_Tensor_t **out);

void tidlrt_mock_set_compute(tidlrt_mock_compute_fn compute);
int64_t tidlrt_mock_invocations(void *handle); /* TIDLRT_invoke calls on this handle that reached compute */
int32_t tidlrt_mock_live_handles(void);        /* created and not yet deleted */
const char *tidlrt_mock_last_error(void);      /* why the last call returned -1 */

#ifdef __cplusplus
}
#endif
#endif
