/* Time GPU memory allocation: N pairs of alloc + free of SIZE bytes in a tight loop.
 *
 *   alloc_pairs driver  LIBCUDA  PAIRS REPEATS SIZE   cuMemAlloc_v2 / cuMemFree_v2
 *   alloc_pairs runtime LIBCUDART PAIRS REPEATS SIZE  cudaMalloc / cudaFree
 *
 * The library is dlopen'd and its entry points found with dlsym, the way JAX's plugin reaches
 * the driver, so gpuvisor's shim (LD_PRELOAD) sees the same calls a framework makes. No CUDA
 * headers are needed: the few prototypes are declared here. Prints one line,
 *   RESULT {"api":...,"pairs":...,"size":...,"wall_ns":[per pair, one per repeat],"cpu_ns":[...]}
 * and exits 0, or prints what failed on stderr and exits 1.
 * Build: cc -O2 -o alloc_pairs alloc_pairs.c -ldl
 */
#define _POSIX_C_SOURCE 199309L
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int status_t; /* CUresult and cudaError_t are both C enums: int */
typedef unsigned long long device_ptr_t;

static double now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void *need(void *library, const char *name) {
    void *symbol = dlsym(library, name);
    if (!symbol) {
        fprintf(stderr, "alloc_pairs: %s not found: %s\n", name, dlerror());
        exit(1);
    }
    return symbol;
}

static void check(status_t status, const char *what) {
    if (status != 0) {
        fprintf(stderr, "alloc_pairs: %s failed with status %d\n", what, status);
        exit(1);
    }
}

/* One API behind two function pointers, so the timed loop is the same for both. */
static status_t (*driver_alloc)(device_ptr_t *, size_t);
static status_t (*driver_free)(device_ptr_t);
static status_t (*runtime_alloc)(void **, size_t);
static status_t (*runtime_free)(void *);

static status_t pair(int runtime, size_t size) {
    status_t status;
    if (runtime) {
        void *pointer = NULL;
        status = runtime_alloc(&pointer, size);
        return status ? status : runtime_free(pointer);
    }
    device_ptr_t pointer = 0;
    status = driver_alloc(&pointer, size);
    return status ? status : driver_free(pointer);
}

int main(int argc, char **argv) {
    if (argc != 6 || (strcmp(argv[1], "driver") && strcmp(argv[1], "runtime"))) {
        fprintf(stderr, "usage: alloc_pairs driver|runtime LIBRARY PAIRS REPEATS SIZE\n");
        return 1;
    }
    int runtime = strcmp(argv[1], "runtime") == 0;
    long pairs = atol(argv[3]), repeats = atol(argv[4]);
    size_t size = (size_t)atoll(argv[5]);
    if (pairs <= 0 || repeats <= 0 || repeats > 100 || size == 0) {
        fprintf(stderr, "alloc_pairs: PAIRS and SIZE must be > 0, REPEATS 1..100\n");
        return 1;
    }
    void *library = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL);
    if (!library) {
        fprintf(stderr, "alloc_pairs: cannot load %s: %s\n", argv[2], dlerror());
        return 1;
    }
    if (runtime) {
        status_t (*set_device)(int) = (status_t(*)(int))need(library, "cudaSetDevice");
        runtime_alloc = (status_t(*)(void **, size_t))need(library, "cudaMalloc");
        runtime_free = (status_t(*)(void *))need(library, "cudaFree");
        check(set_device(0), "cudaSetDevice(0)");
        check(runtime_free(NULL), "cudaFree(NULL) (context creation)");
    } else {
        status_t (*init)(unsigned) = (status_t(*)(unsigned))need(library, "cuInit");
        status_t (*device_get)(int *, int) = (status_t(*)(int *, int))need(library, "cuDeviceGet");
        status_t (*retain)(void **, int) = (status_t(*)(void **, int))need(library, "cuDevicePrimaryCtxRetain");
        status_t (*set_current)(void *) = (status_t(*)(void *))need(library, "cuCtxSetCurrent");
        driver_alloc = (status_t(*)(device_ptr_t *, size_t))need(library, "cuMemAlloc_v2");
        driver_free = (status_t(*)(device_ptr_t))need(library, "cuMemFree_v2");
        int device = 0;
        void *context = NULL;
        check(init(0), "cuInit");
        check(device_get(&device, 0), "cuDeviceGet");
        check(retain(&context, device), "cuDevicePrimaryCtxRetain");
        check(set_current(context), "cuCtxSetCurrent");
    }
    /* Warm-up: first-touch costs (pool set-up, page tables, the shim's tables) stay out. */
    long warm_up = pairs / 10 < 1000 ? pairs / 10 : 1000;
    for (long i = 0; i < warm_up; i++) check(pair(runtime, size), "warm-up pair");

    printf("RESULT {\"api\":\"%s\",\"impl\":\"c\",\"pairs\":%ld,\"size\":%zu,", argv[1], pairs, size);
    double wall[100], cpu[100];
    for (long r = 0; r < repeats; r++) {
        double wall_start = now_ns(CLOCK_MONOTONIC), cpu_start = now_ns(CLOCK_PROCESS_CPUTIME_ID);
        for (long i = 0; i < pairs; i++) {
            status_t status = pair(runtime, size);
            if (status) {
                fprintf(stderr, "alloc_pairs: pair %ld failed with status %d\n", i, status);
                return 1;
            }
        }
        wall[r] = (now_ns(CLOCK_MONOTONIC) - wall_start) / (double)pairs;
        cpu[r] = (now_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu_start) / (double)pairs;
    }
    printf("\"wall_ns\":[");
    for (long r = 0; r < repeats; r++) printf("%s%.1f", r ? "," : "", wall[r]);
    printf("],\"cpu_ns\":[");
    for (long r = 0; r < repeats; r++) printf("%s%.1f", r ? "," : "", cpu[r]);
    printf("]}\n");
    return 0;
}
