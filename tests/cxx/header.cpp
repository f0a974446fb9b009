// header.cpp - pgjobq.h compiles as C++ (make check builds and runs this, with -Werror -pedantic), and
// its initialiser macros work there.
#include <pgjobq.h>

#include <cstdio>

int main()
{
    pgjobq_enqueue_opts e = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_list_opts l = PGJOBQ_LIST_OPTS_INIT;
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    pgjobq_schedule_opts s = PGJOBQ_SCHEDULE_OPTS_INIT;
    pgjobq_worker_opts w = PGJOBQ_WORKER_OPTS_INIT;
    (void)e;
    (void)l;
    (void)s;
    (void)w;
    std::printf("%s %s %d\n", pgjobq_version(), pgjobq_state_name(f.state), PGJOBQ_SCHEMA_VERSION);
    return pgjobq_errname(PGJOBQ_EINVAL)[0] == 'P' ? 0 : 1;
}
