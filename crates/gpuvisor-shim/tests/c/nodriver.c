/* A program on a machine with no libcuda.so.1 that looks for the driver the way libraries do:
 * dlopen, then dlsym in the global scope. With the shim preloaded it must find nothing (the
 * shim's own exports are not a driver). Prints one line and exits 0. */
#include <dlfcn.h>
#include <stdio.h>

int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    const char *names[] = {"cuInit", "cuMemAlloc_v2", "cuGetProcAddress_v2", "cuMemcpy"};
    printf("libcuda=%s", lib ? "found" : "none");
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
        printf(" %s=%s", names[i], dlsym(RTLD_DEFAULT, names[i]) ? "found" : "none");
    printf("\n");
    return 0;
}
