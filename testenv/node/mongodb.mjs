// Drives the published @go-go-scope/persistence-mongodb adapter for
// warden's mixed-fleet tests (store/mongo/mixedfleet_test.go).
//
//   node mongodb.mjs URL DATABASE PREFIX
//
// reads one JSON request a line on stdin, {"id": N, "op": "...", ...},
// and answers each with one JSON line on stdout: {"id": N, "result": ...}
// or {"id": N, "error": "...", "code": N}. It exits when stdin closes.
import readline from "node:readline";
import { MongoClient } from "mongodb";
import { MongoDBAdapter, MongoDBIdempotencyAdapter } from "@go-go-scope/persistence-mongodb";

const [url, dbName, prefix] = process.argv.slice(2);
const client = new MongoClient(url);
await client.connect();
const db = client.db(dbName);
const adapter = new MongoDBAdapter(db, { keyPrefix: prefix });
const idem = new MongoDBIdempotencyAdapter(db, { keyPrefix: prefix });
const handles = new Map(); // owner → the lock handle acquire returned

// The adapter's connect() creates these indexes, in this order. A server
// without TTL indexes (FerretDB: code 238) makes connect() throw at the
// first TTL index; connect then creates the rest of them the same way,
// without the TTL ones, so the database looks like the one connect() makes
// on MongoDB less its TTL indexes.
const connectIndexes = [
  ["go_goscope_locks", { key: 1 }, { unique: true }],
  ["go_goscope_locks", { expiresAt: 1 }, { expireAfterSeconds: 0 }],
  ["go_goscope_circuit", { key: 1 }, { unique: true }],
  ["go_goscope_cache", { key: 1 }, { unique: true }],
  ["go_goscope_cache", { expiresAt: 1 }, { expireAfterSeconds: 0 }],
  ["go_goscope_checkpoints", { taskId: 1, sequence: 1 }, { unique: true }],
  ["go_goscope_checkpoints", { taskId: 1 }, {}],
];

async function connect() {
  try {
    await adapter.connect();
    return { ttl: true };
  } catch (err) {
    if (err.code !== 238) throw err;
  }
  for (const [coll, keys, opts] of connectIndexes) {
    if (opts.expireAfterSeconds !== undefined) continue;
    await db.collection(coll).createIndex(keys, opts);
  }
  return { ttl: false };
}

const ops = {
  connect,
  async acquire({ key, ttl, owner }) {
    const h = await adapter.acquire(key, ttl, owner);
    if (h) handles.set(owner, h);
    return h !== null;
  },
  async release({ owner }) {
    await handles.get(owner).release();
    handles.delete(owner);
    return true;
  },
  async isValid({ owner }) {
    return handles.get(owner).isValid();
  },
  async extend({ key, ttl, owner }) {
    return adapter.extend(key, ttl, owner);
  },
  async forceRelease({ key }) {
    await adapter.forceRelease(key);
    return true;
  },
  async cacheSet({ key, value, ttl }) {
    await adapter.set(key, value, ttl);
    return true;
  },
  async cacheGet({ key }) {
    const v = await adapter.get(key);
    // The raw type tells a native value from a BSON Binary the adapter
    // hands back as an object.
    return { value: v, binary: v !== null && typeof v === "object" && v._bsontype === "Binary" };
  },
  async cacheHas({ key }) {
    return adapter.has(key);
  },
  async cacheDelete({ key }) {
    await adapter.delete(key);
    return true;
  },
  async cacheKeys({ pattern }) {
    return (await adapter.keys(pattern)).sort();
  },
  async getState({ key }) {
    return adapter.getState(key);
  },
  async setState({ key, state }) {
    await adapter.setState(key, state);
    return true;
  },
  async recordFailure({ key, max }) {
    return adapter.recordFailure(key, max);
  },
  async recordSuccess({ key }) {
    await adapter.recordSuccess(key);
    return true;
  },
  // The idempotency adapter's connect() makes a unique {key: 1} and a TTL
  // index; without TTL indexes (FerretDB) only the first.
  async idemConnect() {
    try {
      await idem.connect();
      return { ttl: true };
    } catch (err) {
      if (err.code !== 238) throw err;
    }
    return { ttl: false };
  },
  async idemSet({ key, value, ttl }) {
    await idem.set(key, value, ttl);
    return true;
  },
  async idemGet({ key }) {
    return idem.get(key);
  },
  async idemDelete({ key }) {
    await idem.delete(key);
    return true;
  },
  // What MongoDB's TTL monitor does for the adapter's index on expiresAt
  // (expireAfterSeconds: 0), for servers that have no TTL indexes.
  async ttlMonitor({ collection }) {
    const r = await db.collection(collection).deleteMany({ expiresAt: { $lt: new Date() } });
    return r.deletedCount;
  },
  async find({ collection, filter }) {
    return db.collection(collection).find(filter ?? {}).toArray();
  },
};

const rl = readline.createInterface({ input: process.stdin });
let queue = Promise.resolve();
rl.on("line", (line) => {
  queue = queue.then(async () => {
    const req = JSON.parse(line);
    let out;
    try {
      const op = ops[req.op];
      if (!op) throw new Error(`unknown op ${req.op}`);
      out = { id: req.id, result: (await op(req)) ?? null };
    } catch (err) {
      out = { id: req.id, error: String(err?.message ?? err), code: err?.code ?? 0 };
    }
    process.stdout.write(JSON.stringify(out) + "\n");
  });
});
rl.on("close", () => {
  queue.then(() => client.close()).then(() => process.exit(0));
});
