/*
 * cpu_scratch.c - scratch memory for the CPU kernel, cached per calling thread.
 *
 * Why: the kernel needs ~16 bytes per point of temporary memory, and first touch of fresh
 * pages costs 0.4-2 GB/s on these VMs (docs/design.md section 6) - as much as the whole
 * decimation of a cloud. A worker thread that decimates frame after frame reuses one buffer.
 */
#include "cpu_internal.h"

#define SBV_SCRATCH_KEEP_DEFAULT ((size_t)64 << 20)

typedef struct {
    void *p;
    size_t size;
} scratch_t;

/* Per calling thread: pool threads each reuse their own buffers (first touch of fresh
 * memory is slow on these VMs; see docs/design.md section 6). A pthread key, not just
 * _Thread_local, so the buffer is freed when its thread exits. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;

static void scratch_free(void *arg) {
    scratch_t *s = (scratch_t *)arg;
    if (!s) return;
    free(s->p);
    free(s);
}

static void scratch_init(void) { scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0; }

static scratch_t *scratch_slot(int create) {
    pthread_once(&scratch_once, scratch_init);
    if (!scratch_key_ok) return NULL;
    scratch_t *s = (scratch_t *)pthread_getspecific(scratch_key);
    if (!s && create) {
        s = (scratch_t *)calloc(1, sizeof *s);
        if (s && pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            s = NULL;
        }
    }
    return s;
}

/* Returns a buffer of at least `bytes` and whether it is cached (*cached = 1) or must be
 * freed by the caller (the key could not be created). */
void *sbvi_scratch_get(size_t bytes, int *cached) {
    size_t rounded = (bytes + 4095) & ~(size_t)4095;
    scratch_t *s = scratch_slot(1);
    *cached = s != NULL;
    if (!s) return aligned_alloc(64, rounded);
    if (s->size >= bytes) return s->p;
    free(s->p);
    s->p = aligned_alloc(64, rounded);
    s->size = s->p ? rounded : 0;
    return s->p;
}

static _Atomic size_t scratch_keep = SBV_SCRATCH_KEEP_DEFAULT;

size_t sbv_scratch_keep(size_t bytes) {
    if (bytes == SIZE_MAX) return scratch_keep;
    return atomic_exchange(&scratch_keep, bytes);
}

void sbvi_scratch_done(void *mem, int cached) {
    if (!cached) {
        free(mem);
        return;
    }
    scratch_t *s = scratch_slot(0);
    if (s && s->size > scratch_keep) sbv_release_scratch();
}

void sbv_release_scratch(void) {
    scratch_t *s = scratch_slot(0);
    if (!s) return;
    free(s->p);
    s->p = NULL;
    s->size = 0;
}
