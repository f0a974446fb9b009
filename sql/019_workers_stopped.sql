-- pgjobq schema, migration 19: a worker that stopped cleanly stays listed, as stopped, and the list pages.
-- needs: 15
--
-- worker_gone no longer deletes the worker's row: it notes when it stopped (stopped_at), so that the
-- dashboard's /workers shows the workers that stopped within the hour, as stopped, instead of "No
-- worker seen in the last hour" right after a clean stop.  The next beat under that id takes the row
-- over at once, as a new start (worker_beat), and worker_beat's daily cleanup removes rows unseen for a
-- day, stopped or not.  monitor_workers takes the place to start from and a number of rows (20,000
-- rows of workers made one page of 102 MB): a new signature, so the old one is dropped here and the
-- new one made with the functions.  Libraries of version 16 still work: monitor_workers() with no
-- argument is the new function with its defaults, and they read none of the new columns.
ALTER TABLE pgjobq.workers ADD COLUMN stopped_at timestamptz;
DROP FUNCTION IF EXISTS pgjobq.monitor_workers();
