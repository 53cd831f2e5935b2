/* The CUDA driver entry points service/engine/cuda_ipc.py and client/cuda_shm.py call, with
 * their real C signatures (cuda.h) and trivial bodies, so the ctypes declarations (a
 * 64-byte handle passed by value, pointers out, 64-bit device pointers) are checked on a
 * machine without a GPU: test_cuda_ipc.py builds this with the system's C compiler. */
#include <stdlib.h>
#include <string.h>

typedef struct { char reserved[64]; } CUipcMemHandle;
typedef unsigned long long CUdeviceptr;

static char memory[65536];          /* what an opened handle maps */
static unsigned char seen[64];      /* the last handle cuIpcOpenMemHandle was given */
static int pushed, popped, closed, freed;

int cuInit(unsigned int flags) { return flags == 0 ? 0 : 1; }
int cuDeviceGet(int *device, int ordinal) {
    if (ordinal < 0 || ordinal > 1) return 101;  /* CUDA_ERROR_INVALID_DEVICE */
    *device = ordinal;
    return 0;
}
int cuDevicePrimaryCtxRetain(void **ctx, int device) {
    *ctx = (void *)(long)(0x1000 + device);
    return 0;
}
int cuCtxPushCurrent_v2(void *ctx) { pushed++; return ctx ? 0 : 201; }
int cuCtxPopCurrent_v2(void **ctx) { popped++; *ctx = 0; return 0; }
int cuIpcOpenMemHandle_v2(CUdeviceptr *pointer, CUipcMemHandle handle, unsigned int flags) {
    memcpy(seen, handle.reserved, 64);
    if (handle.reserved[0] == 7 || flags != 1) return 1;  /* CUDA_ERROR_INVALID_VALUE */
    *pointer = (CUdeviceptr)(memory + 256);
    return 0;
}
int cuIpcCloseMemHandle(CUdeviceptr pointer) {
    closed += pointer == (CUdeviceptr)(memory + 256);
    return 0;
}
int cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr pointer) {
    *base = (CUdeviceptr)memory;
    *size = sizeof memory;
    return pointer >= (CUdeviceptr)memory ? 0 : 1;
}
int cuGetErrorName(int code, const char **name) {
    *name = code == 1 ? "CUDA_ERROR_INVALID_VALUE"
          : code == 101 ? "CUDA_ERROR_INVALID_DEVICE" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
int cuMemAlloc_v2(CUdeviceptr *pointer, size_t size) {
    *pointer = (CUdeviceptr)malloc(size);
    return *pointer ? 0 : 2;  /* CUDA_ERROR_OUT_OF_MEMORY */
}
int cuMemFree_v2(CUdeviceptr pointer) { free((void *)pointer); freed++; return 0; }
int cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr pointer) {
    for (int i = 0; i < 64; i++) handle->reserved[i] = i % 3 ? (char)(i + 1) : 0;
    return pointer ? 0 : 1;
}

/* What the tests read back. */
const unsigned char *fake_seen(void) { return seen; }
const char *fake_memory(void) { return memory; }
int fake_count(int which) {
    return which == 0 ? pushed : which == 1 ? popped : which == 2 ? closed : freed;
}
