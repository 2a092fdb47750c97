/* One process's first CUDA use: cuInit, a context, one allocation and its free. The start-up
 * benchmark runs 256 of these at once, with and without the shim (which registers each one in
 * the ledger on first use). */
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr ptr);

int main(void) {
    CUdevice device;
    CUcontext context;
    CUdeviceptr ptr;
    if (cuInit(0) || cuDeviceGet(&device, 0) || cuDevicePrimaryCtxRetain(&context, device)) return 1;
    if (cuCtxSetCurrent(context) || cuMemAlloc_v2(&ptr, 1 << 20) || cuMemFree_v2(ptr)) return 1;
    return 0;
}
