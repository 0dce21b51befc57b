/*
 * cpu_scratch.c - scratch memory for the CPU kernel, cached per calling thread.
 *
 * Why: the kernel needs ~16 bytes per point of temporary memory, and first touch of fresh
 * pages costs 0.4-2 GB/s on these VMs (DESIGN.md section 8) - as much as the whole
 * decimation of a cloud. A worker thread that decimates frame after frame reuses one buffer.
 */
#include "cpu_internal.h"

#define SBV_SCRATCH_KEEP_DEFAULT ((size_t)64 << 20)

typedef struct {
    void *p;
    size_t size;
} buf_t;

typedef struct {
    buf_t slot[2];
} scratch_t;

/* Per calling thread: pool threads each reuse their own buffers (first touch of fresh
 * memory is slow on these VMs; see DESIGN.md section 8). A pthread key, not just
 * _Thread_local, so the buffer is freed when its thread exits. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;

static void scratch_free(void *arg) {
    scratch_t *s = (scratch_t *)arg;
    if (!s) return;
    free(s->slot[0].p);
    free(s->slot[1].p);
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
void *sbvi_scratch_get_slot(int slot, size_t bytes, int *cached) {
    size_t rounded = (bytes + 4095) & ~(size_t)4095;
    scratch_t *s = scratch_slot(1);
    *cached = s != NULL;
    if (!s) return aligned_alloc(64, rounded ? rounded : 4096);
    buf_t *b = &s->slot[slot];
    if (b->p && b->size >= bytes) return b->p;
    free(b->p);
    b->p = aligned_alloc(64, rounded ? rounded : 4096);
    b->size = b->p ? rounded : 0;
    return b->p;
}

static _Atomic size_t scratch_keep = SBV_SCRATCH_KEEP_DEFAULT;

size_t sbv_scratch_keep(size_t bytes) {
    if (bytes == SIZE_MAX) return scratch_keep;
    return atomic_exchange(&scratch_keep, bytes);
}

void sbvi_scratch_done_slot(int slot, void *mem, int cached) {
    if (!cached) {
        free(mem);
        return;
    }
    scratch_t *s = scratch_slot(0);
    if (!s) return;
    /* the keep limit covers both slots together */
    if (s->slot[0].size + s->slot[1].size > scratch_keep) {
        free(s->slot[slot].p);
        s->slot[slot].p = NULL;
        s->slot[slot].size = 0;
    }
}

void sbv_release_scratch(void) {
    scratch_t *s = scratch_slot(0);
    if (!s) return;
    for (int i = 0; i < 2; i++) {
        free(s->slot[i].p);
        s->slot[i].p = NULL;
        s->slot[i].size = 0;
    }
}
