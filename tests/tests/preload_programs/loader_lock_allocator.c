/* An allocator preloaded after memsight's library (LD_PRELOAD=libmemsight_preload.so:this.so) that
 * refuses an allocation made while the dynamic loader's lock is held, inside dl_iterate_phdr's
 * callback: tcmalloc takes that lock under its own (its stack walker iterates the loaded objects as
 * its heap grows), so such an allocation deadlocks a job preloaded with tcmalloc. Here it prints
 * one line and aborts, every time. Otherwise it serves the C library's allocator. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

typedef int (*callback)(struct dl_phdr_info *, size_t, void *);

static __thread int in_iterate;
static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static void (*next_free)(void *);
static size_t (*next_usable)(void *);
static int (*next_posix_memalign)(void **, size_t, size_t);
static int (*next_iterate)(callback, void *);

/* Calls made while the next functions are looked up are served from here, never freed. */
static char boot[1 << 16];
static size_t boot_used;
static int resolving;

static void *boot_alloc(size_t n) {
    size_t at = (boot_used + 15) & ~(size_t)15;
    if (at + n > sizeof boot) return NULL;
    boot_used = at + n;
    return boot + at;
}

static int resolve(void) {
    if (next_malloc) return 1;
    if (resolving) return 0;
    resolving = 1;
    next_calloc = dlsym(RTLD_NEXT, "calloc");
    next_realloc = dlsym(RTLD_NEXT, "realloc");
    next_free = dlsym(RTLD_NEXT, "free");
    next_usable = dlsym(RTLD_NEXT, "malloc_usable_size");
    next_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    next_iterate = dlsym(RTLD_NEXT, "dl_iterate_phdr");
    next_malloc = dlsym(RTLD_NEXT, "malloc");
    resolving = 0;
    return 1;
}

static void refuse_under_loader_lock(void) {
    if (in_iterate) {
        static const char msg[] = "loader_lock_allocator: an allocation under the loader's lock\n";
        write(2, msg, sizeof msg - 1);
        _exit(86);
    }
}

int dl_iterate_phdr(callback cb, void *data) {
    resolve();
    in_iterate++;
    int r = next_iterate(cb, data);
    in_iterate--;
    return r;
}

void *malloc(size_t n) {
    refuse_under_loader_lock();
    if (!resolve()) return boot_alloc(n);
    return next_malloc(n);
}

void *calloc(size_t a, size_t b) {
    refuse_under_loader_lock();
    if (!resolve()) {
        void *p = boot_alloc(a * b);
        if (p) memset(p, 0, a * b);
        return p;
    }
    return next_calloc(a, b);
}

void *realloc(void *p, size_t n) {
    refuse_under_loader_lock();
    if (!resolve()) return boot_alloc(n);
    return next_realloc(p, n);
}

void free(void *p) {
    if ((char *)p >= boot && (char *)p < boot + sizeof boot) return;
    if (resolve()) next_free(p);
}

int posix_memalign(void **out, size_t align, size_t n) {
    refuse_under_loader_lock();
    resolve();
    return next_posix_memalign(out, align, n);
}

size_t malloc_usable_size(void *p) {
    if (p == NULL || ((char *)p >= boot && (char *)p < boot + sizeof boot)) return 0;
    resolve();
    return next_usable(p);
}
