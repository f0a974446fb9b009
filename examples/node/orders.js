#!/usr/bin/env node
// The seed thread's case, in Node.js: an order and the job that confirms it commit together, or
// neither does.  node-postgres (npm: pg) and nothing of pgjobq but its SQL API.
//     (cd examples/node && npm install) && PGJOBQ_DATABASE_URL="$(pgjobq db url)" node examples/node/orders.js
const { Client } = require('pg');

// libpq-style "host=... dbname=..." or a postgresql:// URL, as pgjobq accepts.
function config(url) {
  if (/^postgres(ql)?:\/\//.test(url)) return { connectionString: url };
  const c = {};
  for (const [, k, v] of url.matchAll(/(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)/g)) {
    const val = v.startsWith("'") ? v.slice(1, -1).replace(/\\(.)/g, '$1') : v;
    c[{ dbname: 'database' }[k] || k] = val;
  }
  return c;
}

async function placeOrder(db, id, customer, paymentOk) {
  await db.query('BEGIN');
  try {
    await db.query('INSERT INTO orders (id, customer) VALUES ($1, $2)', [id, customer]);
    const { rows } = await db.query(
      "SELECT id FROM pgjobq.enqueue(queue => 'mail', kind => 'order_confirmation', payload => $1::jsonb)",
      [JSON.stringify({ order: id })]);
    if (!paymentOk) throw new Error('payment declined');
    await db.query('COMMIT');
    return rows[0].id;
  } catch (e) {
    await db.query('ROLLBACK');
    throw e;
  }
}

(async () => {
  const url = process.env.PGJOBQ_DATABASE_URL;
  if (!url) throw new Error('set PGJOBQ_DATABASE_URL, e.g. to $(pgjobq db url)');
  const db = new Client(config(url));
  await db.connect();
  await db.query('CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, customer text NOT NULL)');
  const jobId = await placeOrder(db, 2001, 'ana', true);
  await placeOrder(db, 2002, 'bo', false).catch((e) => console.log(`order 2002 rolled back (${e.message}): no order, no job`));

  // The worker's side: claim with a lease, work, complete (fenced by the lease token).
  const claimed = (await db.query("SELECT id, lease_token, payload FROM pgjobq.claim('mail', 10, '30 seconds', 'node-example')")).rows;
  const results = claimed.map((j) => JSON.stringify({ sent_to: `customer of order ${j.payload.order}` }));
  const { rows: outcomes } = await db.query('SELECT id, outcome FROM pgjobq.complete_many($1::bigint[], $2::bigint[], $3::jsonb[])',
    [claimed.map((j) => j.id), claimed.map((j) => j.lease_token), results]);
  for (const o of outcomes) console.log(`job ${o.id}: ${o.outcome}`);

  const state = (await db.query('SELECT state FROM pgjobq.all_jobs WHERE id = $1', [jobId])).rows[0].state;
  const stray = Number((await db.query(`SELECT count(*) FROM pgjobq.all_jobs WHERE payload @> '{"order": 2002}'`)).rows[0].count);
  console.log(`order 2001: job ${jobId} is ${state}; jobs for order 2002: ${stray}`);
  await db.end();
  process.exit(state === 'completed' && stray === 0 ? 0 : 1);
})().catch((e) => { console.error(e); process.exit(1); });
