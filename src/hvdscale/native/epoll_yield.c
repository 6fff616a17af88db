/*
 * hvdscale: Gloo's TCP loop thread yields its core while it spins (LD_PRELOAD shim).
 *
 * Horovod 0.28.1's vendored Gloo reads its sockets on one loop thread per rank
 * (gloo::transport::tcp::Loop::run, level-triggered epoll_wait). perf shows it spinning
 * during an allreduce: epoll_wait returns at once, again and again, with samples in
 * Pair::handleEvents and pthread_mutex_trylock (handleEvents try-locks the pair and
 * returns when another thread holds it, leaving the socket readable). perf sched shows
 * the thread running for about 3 ms at a time while the rank's other threads wait for the
 * core: with the rank bound to one core (training.cpu_binding) the thread that would make
 * progress waits until the spinner's time slice ends, so a 614 kB allreduce that needs
 * about 0.8 ms takes 4-8 ms (docs/performance.md, "Gloo's spinning loop thread").
 *
 * This shim wraps epoll_wait: from the third consecutive call of a thread that returned
 * ready events, the thread calls sched_yield() before it waits again, so the lock holder
 * runs. A thread whose epoll_wait blocks or times out is never affected; a busy loop that
 * does have work pays one sched_yield per call (about a microsecond).
 *
 * Built by scripts/setup.sh (cc -O2 -shared -fPIC); preloaded into the ranks of Gloo runs
 * (Horovod's and torch.distributed's Gloo) by hvdscale launch (training.gloo_yield_when_spinning). The counter
 * hvdscale_epoll_yields tells how often it yielded (tests read it).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stddef.h>
#include <sys/epoll.h>

unsigned long hvdscale_epoll_yields = 0;

typedef int (*epoll_wait_fn)(int, struct epoll_event *, int, int);
static epoll_wait_fn real_epoll_wait = NULL;
static __thread unsigned int ready_streak = 0;

int epoll_wait(int epfd, struct epoll_event *events, int maxevents, int timeout) {
    epoll_wait_fn fn = __atomic_load_n(&real_epoll_wait, __ATOMIC_ACQUIRE);
    if (fn == NULL) {
        fn = (epoll_wait_fn)dlsym(RTLD_NEXT, "epoll_wait");
        __atomic_store_n(&real_epoll_wait, fn, __ATOMIC_RELEASE);
    }
    if (ready_streak >= 2) {
        __atomic_fetch_add(&hvdscale_epoll_yields, 1, __ATOMIC_RELAXED);
        sched_yield();
    }
    int n = fn(epfd, events, maxevents, timeout);
    ready_streak = n > 0 ? ready_streak + 1 : 0;
    return n;
}
