#!/usr/bin/env node
// A pgjobq handler in Node.js, started once and fed jobs as JSON lines (docs/coproc.md):
//     pgjobq work --queue mail:16 --coproc 'node examples/coproc.js'
// Jobs arrive while others are still running; answers may go back in any order.
const readline = require('readline');

async function handle(job) {
  if (job.payload.fail) throw new Error('asked to fail');
  return { echo: job.payload, attempt: job.attempt };
}

readline.createInterface({ input: process.stdin }).on('line', async (line) => {
  const msg = JSON.parse(line);
  if ('cancel' in msg) return; // the worker gave this job up (timeout, cancel)
  let reply;
  try {
    reply = { id: msg.id, status: 'completed', result: await handle(msg) };
  } catch (e) {
    reply = { id: msg.id, status: 'retry', error: e.message };
  }
  process.stdout.write(JSON.stringify(reply) + '\n');
});
