/* The TIDL-RT mock: TI's TIDL-RT call sequence and argument checks, with a host callback as the network.
 * See tidlrt_mock.h for why; build: cc -shared -fPIC -O1 -o libtidlrt_mock.so tidlrt_mock.c */
#include "tidlrt_mock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HANDLE_MAGIC 0x4c444954u /* "TIDL": catches a stale or foreign handle before it is used */
#define MAX_BUFFERS 16           /* TIDL's limit on a subgraph's inputs and on its outputs */

typedef struct {
    uint32_t magic;
    void *net;          /* a private copy: the real library also copies the net into its own memory */
    int32_t net_size;
    int32_t num_in, num_out;
    int64_t invocations;
} Instance;

static tidlrt_mock_compute_fn g_compute;
static int32_t g_live;
static char g_error[256];

static int32_t fail(const char *what) {
    snprintf(g_error, sizeof g_error, "%s", what);
    return -1;
}

const char *tidlrt_mock_last_error(void) { return g_error; }
void tidlrt_mock_set_compute(tidlrt_mock_compute_fn compute) { g_compute = compute; }
int32_t tidlrt_mock_live_handles(void) { return g_live; }

int64_t tidlrt_mock_invocations(void *handle) {
    Instance *inst = handle;
    return inst && inst->magic == HANDLE_MAGIC ? inst->invocations : -1;
}

int32_t TIDLRT_setParamsDefault(sTIDLRT_Params_t *params) {
    if (!params) return fail("TIDLRT_setParamsDefault: params is NULL");
    memset(params, 0, sizeof *params);
    params->quantRangeExpansionFactor = 1.0f;
    params->quantRangeUpdateFactor = -1.0f;
    params->maxPreEmptDelay = 3.4e38f; /* no pre-emption */
    return 0;
}

int32_t TIDLRT_setTensorDefault(sTIDLRT_Tensor_t *tensor) {
    if (!tensor) return fail("TIDLRT_setTensorDefault: tensor is NULL");
    memset(tensor, 0, sizeof *tensor);
    tensor->elementType = TIDLRT_Float32;
    tensor->numDim = TIDLRT_DIM_MAX;
    tensor->layout = TIDLRT_LT_NCHW;
    tensor->scale = 1.0f;
    tensor->memType = TIDLRT_MEM_USER_SPACE;
    return 0;
}

int32_t TIDLRT_create(sTIDLRT_Params_t *params, void **handle) {
    if (!params || !handle) return fail("TIDLRT_create: params or handle is NULL");
    if (!params->netPtr || params->net_capacity <= 0) return fail("TIDLRT_create: no network (netPtr/net_capacity)");
    const char *io = params->ioBufDescPtr;
    size_t magic = strlen(TIDLRT_MOCK_IO_MAGIC);
    if (!io || params->io_capacity < (int32_t)(magic + 8) || memcmp(io, TIDLRT_MOCK_IO_MAGIC, magic) != 0)
        return fail("TIDLRT_create: the I/O descriptor is not the mock's (TI's *_tidl_io_1.bin needs TI's library)");
    int32_t counts[2];
    memcpy(counts, io + magic, sizeof counts);
    if (counts[0] < 1 || counts[0] > MAX_BUFFERS || counts[1] < 1 || counts[1] > MAX_BUFFERS)
        return fail("TIDLRT_create: input/output counts must be 1-16");
    Instance *inst = calloc(1, sizeof *inst);
    if (!inst || !(inst->net = malloc((size_t)params->net_capacity))) {
        free(inst);
        return fail("TIDLRT_create: out of memory");
    }
    memcpy(inst->net, params->netPtr, (size_t)params->net_capacity);
    inst->magic = HANDLE_MAGIC;
    inst->net_size = params->net_capacity;
    inst->num_in = counts[0];
    inst->num_out = counts[1];
    *handle = inst;
    g_live++;
    return 0;
}

static int32_t check_tensor(const sTIDLRT_Tensor_t *t, const char *side, int32_t k) {
    static char why[160];
    if (!t) snprintf(why, sizeof why, "%s[%d] is NULL", side, k);
    else if (!t->ptr) snprintf(why, sizeof why, "%s[%d] has no buffer", side, k);
    else if (t->elementType < TIDLRT_Uint8 || t->elementType > TIDLRT_Int64)
        snprintf(why, sizeof why, "%s[%d] has element type %d", side, k, t->elementType);
    else if (t->numDim < 1 || t->numDim > TIDLRT_DIM_MAX)
        snprintf(why, sizeof why, "%s[%d] has %d dimensions (1-%d)", side, k, t->numDim, TIDLRT_DIM_MAX);
    else if (t->layout != TIDLRT_LT_NCHW && t->layout != TIDLRT_LT_NHWC)
        snprintf(why, sizeof why, "%s[%d] has layout %u", side, k, t->layout);
    else {
        for (int d = 0; d < TIDLRT_DIM_MAX; d++)
            if (t->dimValues[d] < 1) {
                snprintf(why, sizeof why, "%s[%d] dimension %d is %d", side, k, d, t->dimValues[d]);
                return fail(why);
            }
        return 0;
    }
    return fail(why);
}

int32_t TIDLRT_invoke(void *handle, sTIDLRT_Tensor_t *in[], sTIDLRT_Tensor_t *out[]) {
    Instance *inst = handle;
    if (!inst || inst->magic != HANDLE_MAGIC) return fail("TIDLRT_invoke: not a live TIDL-RT handle");
    if (!in || !out) return fail("TIDLRT_invoke: in or out is NULL");
    for (int32_t k = 0; k < inst->num_in; k++)
        if (check_tensor(in[k], "in", k)) return -1;
    for (int32_t k = 0; k < inst->num_out; k++)
        if (check_tensor(out[k], "out", k)) return -1;
    if (!g_compute) return fail("TIDLRT_invoke: no compute function registered (tidlrt_mock_set_compute)");
    int32_t status = g_compute(inst->net, inst->net_size, inst->num_in, in, inst->num_out, out);
    if (status != 0) return fail("TIDLRT_invoke: the compute function failed");
    inst->invocations++;
    return 0;
}

int32_t TIDLRT_delete(void *handle) {
    Instance *inst = handle;
    if (!inst || inst->magic != HANDLE_MAGIC) return fail("TIDLRT_delete: not a live TIDL-RT handle");
    inst->magic = 0;
    free(inst->net);
    free(inst);
    g_live--;
    return 0;
}
