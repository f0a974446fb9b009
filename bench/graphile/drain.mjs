// bench/graphile/drain.mjs - Graphile Worker's drain, for bench/cost.sh's row "1 process x 32 / Graphile
// Worker tuned" (issue 42).  One Node.js process runs a no-op task with CONCURRENCY workers, tuned as
// Graphile Worker's performance guide advises: a pool of CONCURRENCY + 1 connections, a local queue
// (jobs locked and fetched in batches, as pgjobq's claim does), completions batched, a 100 ms poll,
// and no log line per job.
// The JOBS jobs are added LEAD ms ahead (one add_jobs call), the runner starts and waits, and the drain
// is timed from the moment they are due to the last completion, as `pgjobq bench drain --lead` times
// pgjobq's.  Prints one JSON object: {"jobs_per_s": ..., "jobs": ..., "seconds": ...}.
//
// usage: node drain.mjs CONNSTRING JOBS CONCURRENCY [LEAD_MS]
import { Logger, run, runMigrations } from "graphile-worker";
import pg from "pg";

const [connectionString, jobsArg, concurrencyArg, leadArg] = process.argv.slice(2);
const jobs = Number(jobsArg);
const concurrency = Number(concurrencyArg);
const lead = Number(leadArg ?? 3000);
if (!connectionString || !(jobs > 0) || !(concurrency > 0) || !(lead >= 0)) {
  console.error("usage: node drain.mjs CONNSTRING JOBS CONCURRENCY [LEAD_MS]");
  process.exit(64);
}

const preset = {
  worker: {
    connectionString,
    concurrentJobs: concurrency,
    maxPoolSize: concurrency + 1,
    pollInterval: 100,
    localQueue: { size: Math.max(concurrency + 1, 500) },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
  },
};

// Silent: its default logger writes a line per job.
const logger = new Logger(() => () => {});

await runMigrations({ preset, logger });
const client = new pg.Client({ connectionString });
await client.connect();
await client.query("DELETE FROM graphile_worker._private_jobs");
const added = await client.query(
  `SELECT extract(epoch FROM now() + $2 * interval '1 millisecond')::float8 AS due,
          (SELECT count(*) FROM graphile_worker.add_jobs(array(
               SELECT json_populate_record(NULL::graphile_worker.job_spec,
                          json_build_object('identifier', 'noop', 'payload', '{}'::json,
                                            'run_at', now() + $2 * interval '1 millisecond'))
                 FROM generate_series(1, $1)))) AS n`,
  [jobs, lead]);
const due = added.rows[0].due;
if (Number(added.rows[0].n) !== jobs) {
  console.error(`graphile drain: added ${added.rows[0].n} jobs, not ${jobs}`);
  process.exit(70);
}
if (Date.now() / 1000 > due) {
  console.error("graphile drain: the jobs were due before the runner started: raise LEAD_MS");
  process.exit(70);
}

let done = 0;
let finish;
const finished = new Promise((resolve) => { finish = resolve; });
const runner = await run({
  preset,
  logger,
  noHandleSignals: true,
  taskList: {
    noop: async () => {
      done += 1;
      if (done === jobs) finish(Date.now() / 1000);
    },
  },
});
const end = await finished;
await runner.stop();
// Every job's completion is committed once the runner has stopped: none may be left.
const left = Number((await client.query("SELECT count(*) AS n FROM graphile_worker._private_jobs")).rows[0].n);
await client.end();
if (left !== 0) {
  console.error(`graphile drain: ${left} jobs left after the drain`);
  process.exit(70);
}
const seconds = end - due;
console.log(JSON.stringify({ jobs_per_s: Number((jobs / seconds).toFixed(1)), jobs, seconds: Number(seconds.toFixed(3)) }));
