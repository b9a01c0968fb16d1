// Comfypool runs ComfyUI work across many servers through a comfypool pool,
// and serves fake ComfyUI servers to try it on, without writing Go.
//
// Usage:
//
//	comfypool <command> [flags] [arguments]
//
// The commands are:
//
//	fake   serve fake ComfyUI servers (package comfy/comfytest) on local ports
//	run    run a workflow, or a batch of it, across ComfyUI servers
//	bench  run the benchmark suite (beside a peer library) and print one table
//
// 'comfypool help <command>' and 'comfypool <command> -h' print a command's
// flags. Flags that name where to work can also be set by environment
// variables (the command line wins); -h shows each one's variable.
//
// # comfypool fake
//
//	comfypool fake [-n 3] [-port 8188 | -ports 8188,9000] [-addr 127.0.0.1] [behaviour flags]
//
// Fake serves fake ComfyUI servers, faithful to the real server's protocol,
// until SIGINT or SIGTERM, and prints the URL of each, one a line, on
// stdout: -n 3 -port 8188 serves on ports 8188 to 8190, -port 0 on free
// ports. Behaviour flags shape the work and inject faults:
//
//	-sampler-duration 2s  run time of each sampler node (FakeSampler, KSampler, ...)
//	-steps 20             its progress steps (default: its steps input), -previews N its previews
//	-node-duration 50ms   run time of every other node
//	-load-delay 3s        model load: the first run of a loader node on a server
//	-fail-rate 0.1        share of prompts that fail (out of memory), spread evenly
//	-drop-after 100       each WebSocket drops after 100 messages
//	-drop-every 30s       every WebSocket connection dropped every 30s
//	-restart-every 1m     each server restarts (queue and history forgotten) every minute
//	-latency, -history-delay
//
// A pool holds a server back for a grace after each reconnect (2s by
// default), so drops or restarts more often than that starve it.
//
// Environment: COMFYPOOL_FAKE_N, COMFYPOOL_FAKE_PORT, COMFYPOOL_FAKE_PORTS,
// COMFYPOOL_FAKE_ADDR.
//
// # comfypool run
//
//	comfypool run [-server URL]... [-batch FILE] [-count N] [-out DIR] [flags] [WORKFLOW.json]
//
// Run runs a workflow in API format (ComfyUI's "Export (API)") across the
// servers given with -server (URL or NAME=URL, repeatable or
// comma-separated), or across -fakes fake servers it starts itself when none
// is given (with the fake command's behaviour flags, prefixed: -fake-fail-rate
// 0.2), where it runs a demo workflow when no workflow file is given.
//
// With -batch, each line of a JSON Lines file is a job: the workflow with
// the line's input overrides, in either form
//
//	{"6.text": "a cat", "3.seed": 42}
//	[{"node": "6", "input": "text", "value": "a cat"}, {"node": "3", "input": "seed", "value": 42}]
//
// -count N runs the workflow (or each line) N times. The workflow is stored
// once in the pool (pool.WorkflowPool.Register) and each job carries only its
// overrides (pool.WorkflowPool.EnqueueTemplate).
//
// On a terminal, run draws a progress bar per server (the running job's
// steps, and how many jobs it ran) and one for the whole run; otherwise, or
// with -plain, it prints a line as each job starts, is retried and ends,
// naming its server and how long it ran. A summary follows: jobs, completed,
// failed, retries, files saved, wall time, and per server the jobs it
// completed and the attempts that failed on it. Each output file is streamed
// from its server into -out (default ./comfypool-out) as <job>_<file name>.
//
// Failures of a server (out of memory, a dropped connection, a restart) are
// retried on another (-attempts, -retry-delay, -cooldown); a workflow's own
// error fails its job. When no server can be reached, run says so within
// seconds with each server's dial error (or after -connect-timeout).
//
// Environment: COMFYPOOL_SERVERS, COMFYPOOL_OUT, COMFYPOOL_MAX_IN_FLIGHT,
// COMFYPOOL_ATTEMPTS, COMFYPOOL_CONNECT_TIMEOUT, COMFYPOOL_TOKEN (a bearer
// token sent to every server).
//
// # comfypool bench
//
//	comfypool bench [-scenarios LIST] [-runs 3] [-quick] [-peer] [-json FILE] [-pg URL] [-redis URL]
//
// Bench runs the scenarios of package bench in its own process, on fake
// servers it serves on loopback, -runs times each, and prints one Markdown
// table (scenario, metric, value, target, met?) of the medians, with the
// lowest and highest runs, headed by the date, the Go version, the CPUs and
// the load average at the start and the end, and followed by notes on what
// each side did. -json writes the same as JSON. The scenarios: throughput
// (zero-length jobs on K = 1, 4, 16, 64, 300 servers through the pool and
// through a bare comfy.Client loop), dispatch (300 backends, 100,000 queued
// jobs: prompt end to next POST), utilisation (N = 400 jobs of 200 ms on 8
// servers against ceil(N/K)·d), affinity (warm affinity against round-robin
// with model loads), million (a million jobs enqueued over one template),
// failover (10% of prompts failing on 2 of 8 servers) and lease (the queue
// drivers' lease throughput and pickup latency: in memory, and on
// PostgreSQL and Redis with -pg and -redis, in a scratch schema or key
// prefix removed afterwards).
//
// The peer, @saintno/comfyui-sdk's ComfyPool, is installed with npm into a
// temporary folder at run time (never into the project; removed at the
// end) and driven by a small Node.js script (peer.mjs, embedded in the
// command) against the same servers in throughput (K <= 16), utilisation and
// failover; the table sets its figures beside the pool's as ratios. Without
// node, npm or the network the table says "peer: skipped (reason)" and the
// rest runs.
//
// -quick runs every scenario once at a tiny size without the peer (unless
// -peer is given) and checks only that every job completed: the command's
// tests run it, so CI does. The full run takes about 6 to 8 minutes on 2
// cores.
//
// Environment: COMFYPOOL_PG_URL, COMFYPOOL_REDIS_URL.
//
// # Exit status
//
// 0 when every job completed and its files were saved (bench: when every
// scenario completed its jobs, whether its targets were met or not); 1 when
// a job failed, no server was reachable or the run was interrupted; 2 for bad flags,
// arguments or input files (a missing file, a workflow or batch line that is
// not valid JSON, an override of a node the workflow lacks).
//
// # Examples
//
//	comfypool fake -n 3 -sampler-duration 2s -fail-rate 0.1 &
//	comfypool run -server 127.0.0.1:8188,127.0.0.1:8189,127.0.0.1:8190 -count 20 workflow_api.json
//	comfypool run -server gpu-1=http://10.0.0.1:8188 -batch prompts.jsonl -out images workflow_api.json
//	comfypool run -count 10 -fake-sampler-duration 1s   # no servers: a demo on fakes
//	comfypool bench -pg postgres://postgres@127.0.0.1:5432/postgres -redis redis://127.0.0.1:6379 -json bench.json
package main
