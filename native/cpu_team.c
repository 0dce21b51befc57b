/*
 * cpu_team.c - fork-join over a persistent team of helper threads, one team per calling thread.
 *
 * Why: creating a thread costs tens of microseconds; a 30k-point frame takes ~200 us on one
 * core, so per-phase pthread_create made threads pay only from ~128k points. Each calling
 * thread (a worker of the bridge's pool) keeps its own helpers, parked between calls, so
 * concurrent callers never wait for each other. A helper spins briefly after a phase (the
 * next phase follows within microseconds), then sleeps on a condition variable. Helpers are
 * started on demand and stopped when their calling thread exits. A call that will use helpers
 * wakes them as it starts (sbvi_team_hold) and they spin until its first phase: waking a
 * sleeping helper costs ~50-70 us on these VMs, hidden behind the call's serial estimate.
 */
#include "cpu_internal.h"

#include <sched.h>

#define SBV_SPIN 4000 /* ~10-40 us of polling before a helper or the caller sleeps */

typedef struct team team_t;

typedef struct {
    team_t *team;
    int t;
    unsigned gen; /* generation when started: phases after it are this helper's to run */
} helper_arg;

struct team {
    int started; /* helpers 1..started exist */
    pthread_t tid[SBV_MAX_THREADS];
    helper_arg arg[SBV_MAX_THREADS];
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    _Atomic unsigned gen;
    _Atomic int remaining;
    _Atomic int stop;
    _Atomic int hold; /* a call with this many threads runs: its helpers spin, not sleep */
    job_t *job;
    phase_fn fn;
    int nt;
};

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    sched_yield();
#endif
}

static void *helper_main(void *p) {
    helper_arg *a = (helper_arg *)p;
    team_t *tm = a->team;
    const int t = a->t;
    unsigned seen = a->gen;
    for (;;) {
        unsigned g = atomic_load(&tm->gen);
        for (int s = 0; s < SBV_SPIN && g == seen && !atomic_load(&tm->stop); s++) {
            relax();
            g = atomic_load(&tm->gen);
        }
        /* a call is running (its caller always lets go as it returns): its next phase is near */
        while (g == seen && t < atomic_load(&tm->hold) && !atomic_load(&tm->stop)) {
            relax();
            g = atomic_load(&tm->gen);
        }
        if (g == seen) {
            pthread_mutex_lock(&tm->mu);
            while ((g = atomic_load(&tm->gen)) == seen && !atomic_load(&tm->stop) && t >= atomic_load(&tm->hold))
                pthread_cond_wait(&tm->go, &tm->mu);
            pthread_mutex_unlock(&tm->mu);
            if (g == seen && !atomic_load(&tm->stop)) continue; /* held: spin */
        }
        if (atomic_load(&tm->stop)) return NULL;
        seen = g;
        if (t < tm->nt) {
            tm->fn(tm->job, t);
            if (atomic_fetch_sub(&tm->remaining, 1) == 1) {
                pthread_mutex_lock(&tm->mu);
                pthread_cond_signal(&tm->done);
                pthread_mutex_unlock(&tm->mu);
            }
        }
    }
}

static pthread_key_t team_key;
static pthread_once_t team_once = PTHREAD_ONCE_INIT;
static int team_key_ok;

static void team_free(void *p) {
    team_t *tm = (team_t *)p;
    if (!tm) return;
    pthread_mutex_lock(&tm->mu);
    atomic_store(&tm->stop, 1);
    pthread_cond_broadcast(&tm->go);
    pthread_mutex_unlock(&tm->mu);
    for (int t = 1; t <= tm->started; t++) pthread_join(tm->tid[t], NULL);
    pthread_mutex_destroy(&tm->mu);
    pthread_cond_destroy(&tm->go);
    pthread_cond_destroy(&tm->done);
    free(tm);
}

static void team_init(void) { team_key_ok = pthread_key_create(&team_key, team_free) == 0; }

static team_t *my_team(void) {
    pthread_once(&team_once, team_init);
    if (!team_key_ok) return NULL;
    team_t *tm = (team_t *)pthread_getspecific(team_key);
    if (tm) return tm;
    tm = (team_t *)calloc(1, sizeof *tm);
    if (!tm) return NULL;
    pthread_mutex_init(&tm->mu, NULL);
    pthread_cond_init(&tm->go, NULL);
    pthread_cond_init(&tm->done, NULL);
    if (pthread_setspecific(team_key, tm) != 0) {
        team_free(tm);
        return NULL;
    }
    return tm;
}

/* Helpers 1..nt-1 exist afterwards, or as many as could be started (returned + 1 = usable nt). */
static int grow(team_t *tm, int nt) {
    while (tm->started + 1 < nt) {
        int t = tm->started + 1;
        tm->arg[t] = (helper_arg){tm, t, atomic_load(&tm->gen)};
        if (pthread_create(&tm->tid[t], NULL, helper_main, &tm->arg[t]) != 0) break;
        tm->started = t;
    }
    return tm->started + 1;
}

void sbvi_team_hold(int nt, int on) {
    if (nt <= 1) return;
    team_t *tm = my_team();
    if (!tm) return;
    if (!on) {
        atomic_store(&tm->hold, 0);
        return;
    }
    if (grow(tm, nt) < nt) return;
    pthread_mutex_lock(&tm->mu);
    atomic_store(&tm->hold, nt);
    pthread_cond_broadcast(&tm->go);
    pthread_mutex_unlock(&tm->mu);
}

int sbvi_run_phase(job_t *job, phase_fn fn) {
    const int nt = job->nt;
    if (nt <= 1) {
        fn(job, 0);
        return SBV_OK;
    }
    team_t *tm = my_team();
    int usable = tm ? grow(tm, nt) : 1;
    if (usable < nt) { /* no helpers to be had: run every chunk here, in order */
        for (int t = 0; t < nt; t++) fn(job, t);
        return SBV_OK;
    }
    tm->job = job;
    tm->fn = fn;
    tm->nt = nt;
    atomic_store(&tm->remaining, nt - 1);
    pthread_mutex_lock(&tm->mu);
    atomic_fetch_add(&tm->gen, 1);
    pthread_cond_broadcast(&tm->go);
    pthread_mutex_unlock(&tm->mu);
    fn(job, 0);
    for (int s = 0; s < SBV_SPIN && atomic_load(&tm->remaining) > 0; s++) relax();
    if (atomic_load(&tm->remaining) > 0) {
        pthread_mutex_lock(&tm->mu);
        while (atomic_load(&tm->remaining) > 0) pthread_cond_wait(&tm->done, &tm->mu);
        pthread_mutex_unlock(&tm->mu);
    }
    return SBV_OK;
}
