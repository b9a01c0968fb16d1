// Package bench holds comfypool's scale benchmarks and the harness they
// run, so that a command-line tool can run the same measurements outside
// go test.
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
//     client's GET /history of the finished prompt (the comfy client
//     reads the result before it reports the prompt done), and the pool's
//     own work: settling the job in the queue, freeing the slot, waking
//     the dispatcher, leasing the next job and posting it.
//   - EndToHistory: from that end to the client beginning its GET
//     /history/{id} of the prompt (taken by a wrapper of the backend's
//     HTTP transport): the end marker's transit and the client's handling
//     of it.
//   - HistoryToPost, taken on the client: from the moment the client had
//     the /history answer of a prompt (read and closed) to the moment it
//     began sending the next POST /prompt. It is the pool's share of
//     EndToPost, with the transits and the history request taken out.
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
