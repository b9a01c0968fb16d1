// The peer of comfypool bench: @saintno/comfyui-sdk's ComfyPool driving the
// fake servers the bench serves. comfypool bench writes this file next to the
// SDK it installed into a temporary folder and runs it with Node.js.
//
// Input (stdin, JSON): {"urls": [...], "workflow": {...}, "vary_node": "1",
// "vary_input": "color", "output": "2", "jobs": 400, "timeout_ms": 300000}.
// Output (stdout, one JSON line): {"elapsed_ms", "completed", "failed",
// "errors", "cpu_ms", "version"}.
//
// It uses the SDK as its README shows: one ComfyApi per server in a ComfyPool
// (EQueueMode.PICK_ZERO, the default: a job goes to a connected client whose
// server reports an empty queue and that is not locked by a job of the pool),
// every job given to the pool at once with pool.run, each job a CallWrapper
// over a PromptBuilder whose one input is the job's number, waited for until
// onFinished or onFailed. The clock starts once every client is ready and
// connected, and stops when the last job has ended.
import { readFileSync } from "node:fs";
import { CallWrapper, ComfyApi, ComfyPool, EQueueMode, PromptBuilder } from "@saintno/comfyui-sdk";

const req = JSON.parse(readFileSync(0, "utf8"));
const version = JSON.parse(
  readFileSync(new URL("./node_modules/@saintno/comfyui-sdk/package.json", import.meta.url), "utf8"),
).version;

const clients = req.urls.map((url) => new ComfyApi(url));
const pool = new ComfyPool(clients, EQueueMode.PICK_ZERO, { maxQueueSize: req.jobs + 1 });

// Every client ready (initialised) and connected (its first status message
// arrived over the WebSocket: the pool takes no job to it before).
const ready = new Set();
const connected = new Set();
await new Promise((resolve, reject) => {
  const timer = setTimeout(
    () => reject(new Error(`clients not ready after 60s: ${ready.size} ready, ${connected.size} connected of ${clients.length}`)),
    60_000,
  );
  const check = () => {
    if (ready.size === clients.length && connected.size === clients.length) {
      clearTimeout(timer);
      resolve();
    }
  };
  pool.on("ready", (ev) => { ready.add(ev.detail.clientIdx); check(); });
  pool.on("connected", (ev) => { connected.add(ev.detail.clientIdx); check(); });
});

// One job: the workflow with its varied input set to i, through a CallWrapper.
const job = (i) => (api) =>
  new Promise((resolve, reject) => {
    const prompt = new PromptBuilder(req.workflow, ["vary"], ["out"])
      .setRawInputNode("vary", `${req.vary_node}.inputs.${req.vary_input}`)
      .setRawOutputNode("out", req.output)
      .input("vary", i);
    new CallWrapper(api, prompt)
      .onFinished((data) => resolve(data))
      .onFailed((err) => reject(err))
      .run()
      .then((out) => { if (out === false) reject(new Error("the job failed")); })
      .catch(reject);
  });

let completed = 0;
let failed = 0;
const errors = [];
const cpu0 = process.cpuUsage();
const start = performance.now();
const all = Promise.all(
  Array.from({ length: req.jobs }, (_, i) =>
    pool.run(job(i)).then(
      () => { completed++; },
      (err) => {
        failed++;
        if (errors.length < 5) errors.push(String(err?.message ?? err) + (err?.cause?.exception_message ? `: ${err.cause.exception_message.trim()}` : ""));
      },
    ),
  ),
);
let timer;
const timedOut = new Promise((resolve) => { timer = setTimeout(resolve, req.timeout_ms, "timeout"); });
const how = await Promise.race([all, timedOut]);
clearTimeout(timer);
const elapsed = performance.now() - start;
const cpu = process.cpuUsage(cpu0);
if (how === "timeout") {
  errors.push(`${req.jobs - completed - failed} jobs had not ended after ${req.timeout_ms} ms`);
  failed = req.jobs - completed;
}
process.stdout.write(JSON.stringify({
  elapsed_ms: elapsed, completed, failed, errors, cpu_ms: (cpu.user + cpu.system) / 1000, version,
}) + "\n");
// The pool's dispatch loop never ends by itself: leave now.
process.exit(0);
