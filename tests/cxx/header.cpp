// header.cpp - pgjobq.h compiles as C++ (make check builds and runs this, with -Werror -pedantic), and
// its initialiser macros work there (from C++11 on).
#include <pgjobq.h>

#include <cstdio>

int main()
{
    pgjobq_enqueue_opts e = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_list_opts l = PGJOBQ_LIST_OPTS_INIT;
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    pgjobq_schedule_opts s = PGJOBQ_SCHEDULE_OPTS_INIT;
    pgjobq_worker_opts w = PGJOBQ_WORKER_OPTS_INIT;
    std::printf("%s %s %d\n", pgjobq_version(), pgjobq_state_name(f.state), PGJOBQ_SCHEMA_VERSION);
    /* The defaults the macros promise. */
    int ok = f.state == PGJOBQ_FAILED && l.state == -1 && e.queue == NULL && e.after == NULL && e.tags == NULL && e.route_key == NULL &&
             l.tag == NULL &&
             w.lease_ms == 0 && s.tz == NULL;
    return ok && pgjobq_errname(PGJOBQ_EINVAL)[0] == 'P' ? 0 : 1;
}
