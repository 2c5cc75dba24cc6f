// Drives the published @go-go-scope/persistence-mysql adapter for warden's
// mixed-fleet tests (store/mysql/mixedfleet_test.go).
//
//   node mysql.mjs HOST PORT USER PASSWORD DATABASE PREFIX
//
// reads one JSON request a line on stdin, {"id": N, "op": "...", ...},
// and answers each with one JSON line on stdout: {"id": N, "result": ...}
// or {"id": N, "error": "...", "code": "..."}. Requests are served one at
// a time, in order. It exits when stdin closes. The tests run it with
// TZ=UTC, as docs/backends.md asks of a mixed fleet, unless they test
// another zone on purpose.
import readline from "node:readline";
import mysql from "mysql2/promise";
import { MySQLAdapter } from "@go-go-scope/persistence-mysql";

const [host, port, user, password, database, prefix] = process.argv.slice(2);
const pool = mysql.createPool({ host, port: Number(port), user, password, database, connectionLimit: 4 });
const adapter = new MySQLAdapter(pool, { keyPrefix: prefix });
const handles = new Map(); // key + "\0" + owner → the lock handle acquire returned

// describe reports a value as the adapter returned it, with its type: a
// Buffer (a binary column) is told from a string or a parsed JSON value.
function describe(v) {
  if (Buffer.isBuffer(v)) return { type: "buffer", value: v.toString("latin1") };
  if (v === null || v === undefined) return { type: "null", value: null };
  return { type: typeof v, value: v };
}

const ops = {
  async connect() {
    await adapter.connect();
    return true;
  },
  async acquire({ key, ttl, owner }) {
    const h = await adapter.acquire(key, ttl, owner);
    if (!h) return false;
    handles.set(key + "\0" + owner, h);
    return true;
  },
  async release({ key, owner }) {
    await handles.get(key + "\0" + owner).release();
    return true;
  },
  async isValid({ key, owner }) {
    return handles.get(key + "\0" + owner).isValid();
  },
  async extend({ key, ttl, owner }) {
    return adapter.extend(key, ttl, owner);
  },
  async forceRelease({ key }) {
    await adapter.forceRelease(key);
    return true;
  },
  async cleanup() {
    await adapter.cleanupExpiredLocks();
    return true;
  },
  async cacheSet({ key, value, ttl }) {
    await adapter.set(key, value, ttl);
    return true;
  },
  async cacheGet({ key }) {
    return describe(await adapter.get(key));
  },
  async cacheHas({ key }) {
    return adapter.has(key);
  },
  async cacheKeys({ pattern }) {
    return (await adapter.keys(pattern)).map(describe);
  },
  async getState({ key }) {
    const s = await adapter.getState(key);
    return s && { state: s.state, failureCount: s.failureCount };
  },
  async recordFailure({ key, max }) {
    return adapter.recordFailure(key, max);
  },
  async recordSuccess({ key }) {
    await adapter.recordSuccess(key);
    return true;
  },
  async saveCheckpoint({ checkpoint }) {
    await adapter.save(checkpoint);
    return true;
  },
  async loadLatest({ taskId }) {
    const c = await adapter.loadLatest(taskId);
    return c && { ...c, data: describe(c.data) };
  },
  // The rows exactly as mysql2 reads them, for checks of the column types.
  async rows({ table }) {
    const [rows] = await pool.query("SELECT * FROM ??", [table]);
    return rows.map((r) => Object.fromEntries(Object.entries(r).map(([k, v]) => [k, describe(v)])));
  },
};

const rl = readline.createInterface({ input: process.stdin });
let queue = Promise.resolve();
rl.on("line", (line) => {
  queue = queue.then(async () => {
    const req = JSON.parse(line);
    let out;
    try {
      out = { id: req.id, result: (await ops[req.op](req)) ?? null };
    } catch (err) {
      out = { id: req.id, error: String(err && err.message ? err.message : err), code: String(err && err.code) };
    }
    process.stdout.write(JSON.stringify(out) + "\n");
  });
});
rl.on("close", () => {
  queue.then(() => pool.end());
});
