/* Checks that the shim's dlsym keeps RTLD_NEXT relative to the real caller. Built three ways:
 *   -DLIB_A: libnext_a.so, an interposer of value() whose probe() looks up the next value()
 *   -DLIB_B: libnext_b.so, the real value() (42)
 *   -DMAIN:  links both (A first) and prints probe()'s result: "next=42" when RTLD_NEXT means
 *            "after libnext_a", "next=1" if it were resolved relative to the shim. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#if defined(LIB_A)
int value(void) { return 1; }
int probe(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "value");
    return next ? next() : -1;
}
#elif defined(LIB_B)
int value(void) { return 42; }
#else
int probe(void);
int main(void) {
    printf("next=%d\n", probe());
    return 0;
}
#endif
