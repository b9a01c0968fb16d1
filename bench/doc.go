// Package bench holds comfypool's benchmark scenarios and the harness they
// run, so that a command-line tool (comfypool bench, in cmd/comfypool) runs
// the same measurements outside go test and prints them as one report.
//
// Each scenario is a function that runs once and returns a typed result;
// the caller repeats it and takes medians. Every scenario starts its own
// fake ComfyUI servers (package comfytest) in this process, so the servers,
// the clients and the pool share its CPUs: the figures depend on the
// machine and on its load, and ratios between sides of one run say more
// than absolute figures.
//
//   - [Throughput]: zero-length jobs on K servers on loopback through a pool
//     and through a bare comfy.Client loop over the same servers: the
//     pool's client overhead per job.
//   - [Dispatch]: the dispatch latency of a pool with many backends and a
//     deep queue (below).
//   - [Utilisation]: N jobs of d each on K servers: the makespan against
//     the ideal ceil(N/K)·d, which each job's dispatch overhead lengthens.
//   - [Affinity]: a mixed batch over several checkpoints on servers that
//     keep one model loaded, with warm affinity and with round-robin.
//   - [Queued]: a million jobs over one template enqueued into a pool that
//     does not run them: time, CPU and live heap per job.
//   - [Failover]: some servers failing a share of their prompts: throughput
//     against a run without faults, and the share of jobs completed.
//   - [Lease]: a queue driver's lease-and-complete throughput and pickup
//     latency, for any driver (the durable adapters' included, which the
//     core cannot import: the command opens them).
//
// Throughput, Utilisation and Failover can also drive a [Peer], another
// library's pool, against the same servers after the pool, so that both
// sides' figures come from one run on one machine: a [Fleet]'s servers
// record the prompts each side sent, and the time from each prompt's end to
// the next POST, measured the same way whichever side ran ([Side]).
//
// # Dispatch latency
//
// [Dispatch] starts fake ComfyUI servers (package comfytest, in memory or
// on loopback sockets) and a pool over them with one prompt in flight per
// backend, waits until every backend is connected, enqueues every job
// into the paused queue, resumes it, and stops the pool once
// [DispatchConfig].Runs jobs ended (the rest stay queued, so the queue
// stays deep throughout). With [DispatchConfig].Cold the jobs are
// enqueued before the pool starts instead, and the measurement includes
// the backends connecting. It measures, per backend, the time from one
// prompt's end to the next POST /prompt on that backend, the pool's
// dispatch latency, and two parts of it:
//
//   - EndToPost, taken on the server: from the moment the server queued a
//     prompt's end marker, executing{node:null}, to its socket
//     ([comfytest.ReceivedPrompt].Ended) to the moment it began handling
//     the next POST /prompt ([comfytest.ReceivedPrompt].Received). It
//     includes both transits (the end marker to the client, the next
//     prompt to the server: net.Pipe in memory, TCP on loopback), the
//     client's decoding of the marker, and the pool's own work: freeing
//     the slot (the pool frees a backend when its prompt's end marker
//     arrives, and reads the finished prompt's history meanwhile), waking
//     the dispatcher, leasing the next job, writing its attempt down and
//     posting it.
//   - EndToHistory: from that end to the client beginning its GET
//     /history/{id} of the prompt (taken by a wrapper of the backend's
//     HTTP transport): the end marker's transit and the client's handling
//     of it, the pool's freeing of the slot included.
//   - AskToPost, taken on the client: from that GET /history/{id} to the
//     client beginning the next POST /prompt (zero when the POST began
//     first): the pool's share of EndToPost, with the transits taken out.
//
// Everything runs in one process, so the servers, the clients and the
// pool share its CPUs: the figures depend on the machine and on its load.
// A zero [DispatchConfig].NodeTime makes every prompt end at once, so the
// servers' and clients' work saturates the CPUs and the latencies include
// the wait for a CPU; a NodeTime leaves CPU to spare, as real prompts,
// which run for seconds, do.
//
// The benchmarks (go test -bench . ./bench) report the latencies as
// custom metrics (p50/p90/p99/max, in microseconds). BenchmarkDispatch300x100k
// is issue 9's target: 300 backends (a company runs 300 instances,
// ComfyUI issue #11098) and 100,000 queued jobs, dispatch p99 under 2 ms.
package bench
